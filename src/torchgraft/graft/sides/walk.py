"""One walk of a model: its modules, its state-dict tensors and who holds each, as torch gives them.

torch walks a module tree through a generator per level: on a model of tens of thousands of
modules each walk costs tens of milliseconds, and a graft asks for the modules, the state
dict and several facts of them. :func:`walk_model` walks once, with a stack instead of
nested generators, and reads the state dict off the same walk where that is exactly what
``state_dict(keep_vars=True)`` returns: every module class keeps torch's own ``state_dict``,
``_save_to_state_dict``, ``get_extra_state`` and ``named_modules``, no module has state-dict
hooks, and no module sits in two places. Otherwise torch's own methods are called.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from .model import state_tensors

__all__ = ["ModelTensors", "Modules", "Walked", "walk_model"]

#: ``model.named_modules()`` as a list: walked once per graft and shared (a walk costs tens of
#: milliseconds on models of tens of thousands of modules).
Modules = Sequence[tuple[str, nn.Module]]


#: A meta tensor as first seen: its key, the module dict holding it, and its name there.
_MetaEntry = tuple[str, dict[str, Any], str]


class ModelTensors:
    """Every parameter and buffer of a model, from one walk of its modules.

    Attributes:
        holders: Per tensor object, every (module dict, name) that holds it (ties: several).
        device: The first real (not meta) tensor's device, if any.
        state: The persistent ones by key, in ``state_dict`` order (what
            ``state_dict(keep_vars=True)`` holds for modules that keep torch's own
            ``state_dict``).
        modules: The modules walked, ``(path, module)``.
        plain: Whether the model's ``state_dict()`` is what its modules hold (every module
            keeps torch's own methods, no hooks, none shared): set by :func:`walk_model`.
    """

    def __init__(self, modules: Modules) -> None:
        self.holders: dict[int, list[tuple[dict[str, Any], str]]] = {}
        self.device: torch.device | None = None
        self.state: dict[str, torch.Tensor] = {}
        self.modules = modules
        self.plain = False
        self._meta: list[_MetaEntry] = []
        for path, module in modules:
            prefix = f"{path}." if path else ""
            self._add(prefix, module._parameters, ())
            if module._buffers:
                self._add(prefix, module._buffers, module._non_persistent_buffers_set)

    def _add(self, prefix: str, store: dict[str, Any], transient: Collection[str]) -> None:
        """One module's parameters or buffers (``transient``: its non-persistent ones)."""
        for name, tensor in store.items():
            if tensor is None:
                continue
            key = prefix + name
            if name not in transient:
                self.state[key] = tensor
            held = self.holders.get(id(tensor))
            if held is not None:
                held.append((store, name))
                continue
            self.holders[id(tensor)] = [(store, name)]
            if tensor.is_meta:
                self._meta.append((key, store, name))
            elif self.device is None:
                self.device = tensor.device

    @property
    def on_meta(self) -> bool:
        """Whether a tensor was on the meta device when walked."""
        return bool(self._meta)

    def meta_left(self) -> list[tuple[str, str]]:
        """The tensors still on meta now, as (key, name in its module), ties once."""
        return [(key, name) for key, store, name in self._meta
                if store[name] is not None and store[name].is_meta]


#: The methods a module class must keep as torch's for the walk to stand for them.
_TORCH_METHODS = {name: getattr(nn.Module, name) for name in (
    "named_modules", "state_dict", "_save_to_state_dict", "get_extra_state")}
#: Module class to whether it keeps every method of :data:`_TORCH_METHODS` (asked once).
_PLAIN: dict[type, bool] = {}


def _plain(module: nn.Module) -> bool:
    """Whether torch's own walks of this module are what :func:`walk_model` computes.

    Its class keeps torch's methods (asked once per class), and neither hooks nor methods of
    its own change them.
    """
    cls = type(module)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = all(getattr(cls, name, None) is method
                                  for name, method in _TORCH_METHODS.items())
    return (plain and not module._state_dict_hooks and not module._state_dict_pre_hooks
            and _TORCH_METHODS.keys().isdisjoint(module.__dict__))  # nor set on the instance


class Walked(NamedTuple):
    """A model walked once: its modules and its tensors.

    Attributes:
        modules: ``(path, module)`` in ``named_modules()`` order.
        tensors: Its tensors; ``tensors.state`` is its state dict (key to tensor).
    """

    modules: list[tuple[str, nn.Module]]
    tensors: ModelTensors


def walk_model(model: nn.Module) -> Walked:
    """The model's ``named_modules()`` and its tensors (their state dict too), in one walk.

    Args:
        model: An unwrapped module.

    Returns:
        ``(path, module)`` in ``named_modules()`` order, and the tensors, whose ``state`` is
        the model's :func:`~.sides.state_tensors` (key to tensor, in ``state_dict`` order).
    """
    modules: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    exact = True  # the state dict can be read off this walk
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        path, module = stack.pop()
        if id(module) in seen:  # named_modules() lists it once; state_dict() in each place
            exact = False
            continue
        seen.add(id(module))
        modules.append((path, module))
        exact = exact and _plain(module)
        children = module._modules
        if children:
            prefix = f"{path}." if path else ""
            stack.extend((prefix + name, child) for name, child in reversed(children.items())
                         if child is not None)
    if not exact:
        modules = list(model.named_modules())
    tensors = ModelTensors(modules)
    tensors.plain = exact
    if not exact:
        tensors.state = state_tensors(model)
    return Walked(modules, tensors)
