"""Real storage for targets built on the meta device, like ``load_state_dict(assign=True)``.

A model built under ``with torch.device("meta")`` has shapes but no memory; copying into a
meta tensor does nothing. Each tensor a graft fills gets new storage on the chosen device,
installed in every module that holds it (ties stay tied), as an ``nn.Parameter`` with its
``requires_grad`` where it was one. A tensor copied as it is stored becomes the checkpoint's
own (memory-mapped where the format allows); the others are read into new storage.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["META_DEFAULTS", "Modules", "default_device", "has_meta", "materialise", "still_on_meta"]

#: Bookkeeping buffers a checkpoint may lack, with the value a fresh module gives them.
META_DEFAULTS = {re.compile(r"(^|\.)num_batches_tracked$"): 0}


#: ``model.named_modules()`` as a list: walked once per graft and shared (a walk costs tens of
#: milliseconds on models of tens of thousands of modules).
Modules = Sequence[tuple[str, nn.Module]]


def _tensors(modules: Modules) -> Iterator[tuple[str, str, torch.Tensor, bool]]:
    """Every parameter and buffer, persistent or not: path, name, tensor, whether a parameter.

    The modules' own dictionaries are read directly: on models of tens of thousands of
    modules this is several times faster than ``named_parameters`` and ``named_buffers``.
    """
    for path, module in modules:
        for store, parameter in ((module._parameters, True), (module._buffers, False)):
            for name, tensor in store.items():
                if tensor is not None:
                    yield path, name, tensor, parameter


def has_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for _, _, t, _ in _tensors(model.named_modules()))


def default_device(model: nn.Module, *, modules: Modules | None = None) -> torch.device:
    """Where the model's real tensors are (the first one's device), else the CPU.

    Args:
        model: The unwrapped target.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        The device.
    """
    walk = model.named_modules() if modules is None else modules
    return next((t.device for _, _, t, _ in _tensors(walk) if not t.is_meta),
                torch.device("cpu"))


def _holders(modules: Modules) -> dict[int, list[tuple[dict[str, Any], str]]]:
    """For each parameter or buffer object, every (module dict, name) that holds it."""
    holders: dict[int, list[tuple[dict[str, Any], str]]] = {}
    for _path, module in modules:
        stores: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for store in stores:
            for name, tensor in store.items():
                if tensor is not None:
                    holders.setdefault(id(tensor), []).append((store, name))
    return holders


def materialise(model: nn.Module, keys: Iterable[str], device: torch.device, *,
                zeroed: Iterable[str] = (),
                values: Mapping[str, Callable[[], torch.Tensor]] | None = None,
                state: dict[str, torch.Tensor] | None = None,
                modules: Modules | None = None) -> set[str]:
    """Give real storage to the meta tensors among ``keys`` (state-dict names).

    Args:
        model: The unwrapped target.
        keys: The state-dict keys a graft fills; those on meta get uninitialised storage.
        device: Where the new storage goes.
        zeroed: Keys whose new storage starts as zeros (adapted or defaulted tensors).
        values: Keys whose storage is the checkpoint's own tensor, as read (a memory-mapped
            view of the file where the format allows: no copy at all), like
            ``load_state_dict(assign=True)``.
        state: The model's ``state_dict(keep_vars=True)`` tensors, if already known; a dict
            is updated in place with the new tensors.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        The keys given their checkpoint values: nothing more to read for them.
    """
    state = model.state_dict(keep_vars=True) if state is None else state
    keys_of: dict[int, list[str]] = {}  # a tensor's keys (several where tied)
    for name, tensor in state.items():
        keys_of.setdefault(id(tensor), []).append(name)
    holders = _holders(model.named_modules() if modules is None else modules)
    zero = set(zeroed)
    values = values or {}
    done: set[int] = set()
    assigned: set[str] = set()
    for key in [*keys, *zero]:  # tens of thousands of small tensors: a tight loop
        old = state.get(key)
        ident = id(old)
        if old is None or ident in done or not old.is_meta:
            continue
        done.add(ident)
        read = values.get(key)
        if read is not None:
            new = read()
            assigned.add(key)
        else:
            make = torch.zeros if key in zero else torch.empty
            new = make(old.shape, dtype=old.dtype, device=device)
        if isinstance(old, nn.Parameter):
            new = nn.Parameter(new, requires_grad=old.requires_grad)
        for store, name in holders.get(ident, ()):
            store[name] = new
        for name in keys_of[ident]:
            state[name] = new
    return assigned


def still_on_meta(model: nn.Module, *, modules: Modules | None = None) -> list[str]:
    """Names of parameters and buffers still on meta, persistent or not (ties once).

    Args:
        model: The unwrapped target.
        modules: Its ``named_modules()``, if already walked.

    Returns:
        Their names.
    """
    seen: set[int] = set()
    found: tuple[list[str], list[str]] = ([], [])  # parameters first, as named_parameters
    for path, name, tensor, parameter in _tensors(model.named_modules() if modules is None
                                                  else modules):
        if tensor.is_meta and id(tensor) not in seen:
            seen.add(id(tensor))
            found[not parameter].append(f"{path}.{name}" if path else name)
    return [*found[0], *found[1]]
