"""Every write confirmed: each filled key read back through the model's own ``state_dict()``.

A graft writes into the tensors the model's state dict handed out when it was walked. Most
models hand out their parameters themselves, and the state dict read after the fill hands out
the very tensors written: confirmed without reading a byte. A model whose state-dict hooks
hand out copies (a fused ``wqkv`` parameter exposed as ``wq``, ``wk``, ``wv``, as training
frameworks keep a checkpoint's layout apart from their fused kernels) was written into the
copies, and its parameter never changed: the state dict read afterwards shows other values.
A key is confirmed when the tensor read back is the one written, shares its memory, or
agrees with it on a sample of elements spread over the whole tensor (at most
:data:`SAMPLE` of them: bounded time whatever the size).

A key not confirmed is filled again through the path the model's own code provides: the
module holding it that has state-dict or load hooks (or its own ``load_state_dict`` or
``_load_from_state_dict``), else the model, is given its state dict with the values the graft
wrote, through its ``load_state_dict`` (hooks and all; ``assign=True`` where its tensors are
still on meta). What is still not confirmed is reported missing, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..sides.model import state_tensors
from ..sides.walk import Modules

__all__ = ["SAMPLE", "Confirmed", "confirm_writes", "differs"]

logger = logging.getLogger("torchgraft")

#: Elements compared per tensor when the tensor read back is not the one written.
SAMPLE = 64

_TORCH = {name: getattr(nn.Module, name) for name in (
    "state_dict", "_save_to_state_dict", "load_state_dict", "_load_from_state_dict")}


@dataclass
class Confirmed:
    """What reading the state dict back found.

    Attributes:
        through: Module path (``""``: the model) to the keys filled again through its own
            ``load_state_dict`` and confirmed then.
        unconfirmed: Key to why its write does not show in the model's state dict.
    """

    through: dict[str, list[str]] = field(default_factory=dict)
    unconfirmed: dict[str, str] = field(default_factory=dict)


def confirm_writes(model: nn.Module, written: Mapping[str, torch.Tensor], *,
                   refill: bool = True, held: Modules | None = None) -> Confirmed:
    """Read every written key back through ``model.state_dict()``; refill where it differs.

    Args:
        model: The unwrapped model, filled.
        written: Key to the tensor the graft wrote it into (holding the values written).
        refill: Whether keys not confirmed are filled again through the model's own
            ``load_state_dict`` (not for a sharded model's DTensors).
        held: The model's modules, when its state dict is exactly what they hold (every
            module keeps torch's own methods, no hooks: :attr:`ModelTensors.plain`): each key
            is read from its module's own dict, what ``state_dict()`` hands out for it,
            without building the whole state dict (tens of thousands of small tensors).

    Returns:
        The keys filled again through the model's code, and those still not confirmed.
    """
    found = Confirmed()
    try:
        state = _held(held, written) if held is not None else state_tensors(model)
    except Exception as exc:  # its hooks fail: nothing can be read back
        why = f"the model's state_dict() raised {type(exc).__name__}: {exc}"
        found.unconfirmed = dict.fromkeys(written, why)
        return found
    wrong = {key: reason for key, tensor in written.items()
             if (reason := differs(state.get(key), tensor)) is not None}
    if not wrong:
        return found
    if not refill:
        found.unconfirmed = {k: _reason(why) for k, why in wrong.items()}
        return found
    owners: dict[str, list[str]] = {}
    for key in wrong:
        owners.setdefault(_owner(model, key), []).append(key)
    errors = {}
    for path, keys in owners.items():
        error = _load_through(model.get_submodule(path), path, written)
        if error is not None:
            errors.update(dict.fromkeys(keys, error))
    try:
        state = state_tensors(model)
    except Exception as exc:
        state = {}
        errors.update(dict.fromkeys(wrong, f"was followed by its state_dict() raising "
                                           f"{type(exc).__name__}: {exc}"))
    for path, keys in owners.items():
        for key in keys:
            still = differs(state.get(key), written[key])
            if still is None:
                found.through.setdefault(path, []).append(key)
            else:
                found.unconfirmed[key] = _reason(still, path, errors.get(key))
    for path, keys in found.through.items():
        logger.info("%d keys of '%s' filled through its own load_state_dict", len(keys), path)
    return found


def _held(modules: Modules, keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """What each key's module holds under its name: its state dict's entry, for plain modules."""
    by_path = dict(modules)
    found: dict[str, torch.Tensor] = {}
    for key in keys:
        path, _, name = key.rpartition(".")
        module = by_path.get(path)
        if module is not None:
            tensor: torch.Tensor | None = module._parameters.get(name)
            if tensor is None and name not in module._non_persistent_buffers_set:
                tensor = module._buffers.get(name)
            if tensor is not None:
                found[key] = tensor
    return found


def _reason(why: str, path: str | None = None, error: str | None = None) -> str:
    """Why a write is not confirmed: what the state dict showed, what refilling did."""
    text = f"written, but the model's state_dict() does not show it ({why})"
    if path is None:
        return text
    where = f"module '{path}'" if path else "the model"
    return f"{text}; filling it through the load_state_dict of {where} {error or 'did not take it'}"


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank wrote), else the tensor."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor.detach()


def differs(now: torch.Tensor | None, written: torch.Tensor) -> str | None:
    """Why ``now`` (read back) does not show what was ``written``; ``None`` if it does.

    Args:
        now: The state dict's tensor for the key, read after the fill.
        written: The tensor the graft wrote into.

    Returns:
        ``None`` when it is the same tensor, shares its memory, or agrees on a sample of
        :data:`SAMPLE` elements spread over it; else what differs.
    """
    if now is None:
        return "the key is not in it"
    if now is written:
        return None
    if now.is_meta:
        return "it is on the meta device"
    a, b = _local(now), _local(written)
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return f"it holds {tuple(a.shape)} {a.dtype}, {tuple(b.shape)} {b.dtype} was written"
    if a.device == b.device and a.untyped_storage().data_ptr() == \
            b.untyped_storage().data_ptr() and a.storage_offset() == b.storage_offset() and \
            a.stride() == b.stride():
        return None
    if not a.numel():
        return None
    index = _spread(tuple(a.shape), a.numel())
    if torch.equal(_bits(a[index]), _bits(b[index].to(a.device))):
        return None
    return "it holds other values: its state dict hands out a copy, not the tensor written"


def _spread(shape: tuple[int, ...], numel: int) -> tuple[torch.Tensor, ...]:
    """Up to :data:`SAMPLE` indices spread evenly over a tensor, its first and last included."""
    flat = torch.linspace(0, numel - 1, min(SAMPLE, numel)).round().long()
    return tuple(torch.unravel_index(flat, shape)) if shape else ()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The elements' bytes: NaN equals NaN, -0.0 differs from 0.0."""
    contiguous = tensor.contiguous()
    return contiguous.view(torch.uint8) if contiguous.dim() else contiguous.reshape(1).view(
        torch.uint8)


def _custom(module: nn.Module) -> bool:
    """Whether the module saves or loads its state its own way (hooks, or methods of its own)."""
    return bool(module._state_dict_hooks or module._state_dict_pre_hooks
                or module._load_state_dict_pre_hooks or module._load_state_dict_post_hooks
                or any(getattr(type(module), name) is not method
                       for name, method in _TORCH.items()))


def _owner(model: nn.Module, key: str) -> str:
    """The path of the nearest module above ``key`` with a way of its own, else the model's."""
    parts = key.split(".")[:-1]
    for depth in range(len(parts), 0, -1):
        path = ".".join(parts[:depth])
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if _custom(module):
            return path
    return ""


def _load_through(module: nn.Module, path: str, written: Mapping[str, torch.Tensor]) -> str | None:
    """Give a module its state dict with the values written, through its own load_state_dict.

    Returns:
        What went wrong (it raised, or refused keys); ``None`` when it loaded.
    """
    prefix = f"{path}." if path else ""
    try:
        own: dict[str, Any] = module.state_dict()
        values = dict(own)
        for key, tensor in written.items():
            if key.startswith(prefix) and key[len(prefix):] in values:
                values[key[len(prefix):]] = _local(tensor)
        metadata = getattr(own, "_metadata", None)
        state: Any = type(own)(values)
        if metadata is not None:
            state._metadata = metadata
        on_meta = any(t.is_meta for t in _tensors(module))
        result = module.load_state_dict(state, strict=False, assign=on_meta)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {exc}"
    refused = [*result.unexpected_keys]
    return f"refused the keys {refused[:3]} as unexpected" if refused else None


def _tensors(module: nn.Module) -> Iterable[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()
