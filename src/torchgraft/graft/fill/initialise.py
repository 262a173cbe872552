"""What no checkpoint fills, given values by the model's own code, as ``from_pretrained`` does.

A model built on the meta device has no values at all; a graft fills what the checkpoint
holds. The rest (non-persistent buffers such as rotary frequencies, which no checkpoint
holds; a head the checkpoint lacks) would stay on meta, and the model could not run. Each
module holding such a tensor gets storage for it on the model's device, then the model's own
code computes it, the first of these that does:

1. transformers' ``_init_weights`` of the nearest ``PreTrainedModel`` holding the module, on
   the module and then each ancestor up to it (what ``from_pretrained``'s ``apply`` runs for
   what a checkpoint lacks: rotary frequencies; Whisper's encoder, which writes its
   embedding's sinusoids);
2. the module's own ``reset_parameters()``;
3. the module rebuilt on the target device from its own attributes named as its
   constructor's arguments (``LlamaRotaryEmbedding(config=module.config)``), its parameters
   on meta: its buffers are what its constructor computes.

While the code runs, every tensor of the module that is already filled is stood in for by an
empty meta tensor, so no value the graft wrote is ever overwritten. New storage starts as NaN
(integers: their largest value): a tensor still holding any of it after a method ran was not
computed by it, and the next is tried. What none computes goes back to the meta device and is
reported missing with what was tried (a method that raised is named with its error).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..sides.build import empty_parameters
from ..sides.walk import ModelTensors

__all__ = ["Initialised", "initialise_left"]

logger = logging.getLogger("torchgraft")

#: A way of computing a module's tensors: its label, what runs it, and the module whose tree
#: it may write (its tensors stood in for while it runs).
_Method = tuple[str, Callable[[], None], nn.Module]


@dataclass
class Initialised:
    """What the model's own code computed, and what it could not.

    Attributes:
        how: Key to the code that computed it (``"LlamaForCausalLM._init_weights"``).
        failed: Key to why it stays on meta: what was tried, and each error.
        skipped: Keys left on meta without asking the model's code (a sharded model's
            DTensors).
    """

    how: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


@dataclass
class _Pending:
    """One tensor left on meta: where it is held, and the storage it was given."""

    key: str
    name: str
    meta: torch.Tensor
    new: torch.Tensor
    holders: list[tuple[dict[str, Any], str]]


def initialise_left(model: nn.Module, tensors: ModelTensors, device: torch.device, *,
                    skip: Collection[str] = ()) -> Initialised:
    """Compute, with the model's own code, every tensor still on meta after a fill.

    Args:
        model: The unwrapped model, filled.
        tensors: Its tensors as walked before the fill (which were on meta, who holds each).
        device: Where new storage goes.
        skip: Keys left alone (a sharded model's DTensors).

    Returns:
        What was computed by which code, and what stays on meta and why.
    """
    done = Initialised()
    by_module: dict[str, list[tuple[str, str]]] = {}
    for key, name in tensors.meta_left():
        if key in skip:
            done.skipped.append(key)
        else:
            by_module.setdefault(key.rpartition(".")[0], []).append((key, name))
    if not by_module:
        return done
    modules = dict(tensors.modules)
    for path in sorted(by_module, key=lambda p: -p.count(".") - bool(p)):  # children first
        module = modules.get(path)
        if module is None:
            continue
        left = [_allocate(module, key, name, tensors, device) for key, name in by_module[path]]
        tried: list[str] = []
        for method in _methods(model, modules, path, module, device):
            left = _attempt(module, left, method, tried, done)
            if not left:
                break
        why = "; ".join(tried) or (f"{type(module).__name__} has no _init_weights, "
                                   "reset_parameters or constructor to rebuild it from")
        for pending in left:
            _install(pending, pending.meta)
            done.failed[pending.key] = ("no checkpoint holds it, and the model's code did not "
                                        f"compute it ({why})")
    return done


def _allocate(module: nn.Module, key: str, name: str, tensors: ModelTensors,
              device: torch.device) -> _Pending:
    """Storage marked as never written, in place of a meta tensor, in every module holding it."""
    store = module._parameters if name in module._parameters else module._buffers
    meta = store[name]
    assert meta is not None
    new = torch.empty(meta.shape, dtype=meta.dtype, device=device)
    _mark(new)
    if isinstance(meta, nn.Parameter):
        new = nn.Parameter(new, requires_grad=meta.requires_grad)
    pending = _Pending(key, name, meta, new, tensors.holders.get(id(meta), [(store, name)]))
    _install(pending, new)
    return pending


def _install(pending: _Pending, tensor: torch.Tensor) -> None:
    for store, name in pending.holders:
        store[name] = tensor


def _mark(tensor: torch.Tensor) -> None:
    """Fill with what no code computes: NaN, or an integer type's largest value."""
    with torch.no_grad():
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.fill_(float("nan"))
        elif tensor.dtype != torch.bool:
            tensor.fill_(torch.iinfo(tensor.dtype).max)


def _written(tensor: torch.Tensor) -> bool:
    """Whether no element still holds the mark of :func:`_mark`."""
    if tensor.is_meta:
        return False
    if tensor.is_floating_point() or tensor.is_complex():
        return not bool(torch.isnan(tensor).any())
    if tensor.dtype == torch.bool:
        return True
    return not bool((tensor == torch.iinfo(tensor.dtype).max).any())


def _attempt(module: nn.Module, left: list[_Pending], method: _Method,
             tried: list[str], done: Initialised) -> list[_Pending]:
    """Run one method with the filled tensors it may write stood in for; what it left."""
    label, run, writes = method
    try:
        with _stand_ins(writes, {id(p.new) for p in left}), torch.no_grad():
            run()
    except Exception as exc:
        tried.append(f"{label} raised {type(exc).__name__}: {exc}")
        logger.warning("%s raised %s: %s", label, type(exc).__name__, exc)
        for pending in left:  # whatever it wrote halfway is not trusted
            _install(pending, pending.new)
            _mark(pending.new)
        return left
    still = []
    for pending in left:
        store = module._parameters if pending.name in module._parameters else module._buffers
        now = store.get(pending.name)
        value = _adopted(pending, now)
        if value is not None and _written(value):
            _install(pending, value)
            done.how[pending.key] = label
        else:
            _install(pending, pending.new)
            still.append(pending)
    if still:
        tried.append(f"{label} left {', '.join(repr(p.key) for p in still)} uncomputed")
    return still


def _adopted(pending: _Pending, now: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor the code left under the name: its new storage, or one it put there itself."""
    if now is None or now is pending.new:
        return now
    if now.is_meta or tuple(now.shape) != tuple(pending.meta.shape):
        return None
    value = now.detach().to(device=pending.new.device, dtype=pending.meta.dtype)
    if isinstance(pending.meta, nn.Parameter):
        return nn.Parameter(value, requires_grad=pending.meta.requires_grad)
    return value


@contextlib.contextmanager
def _stand_ins(module: nn.Module, keep: set[int]) -> Iterator[None]:
    """Every real tensor of the module's tree held as an empty meta tensor meanwhile.

    The code computing what is left then cannot overwrite what the graft filled; ``keep``:
    the tensors it is to compute.
    """
    saved: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    for sub in module.modules():
        stores: tuple[dict[str, Any], ...] = (sub._parameters, sub._buffers)
        for store in stores:
            for name, tensor in store.items():
                if tensor is None or tensor.is_meta or id(tensor) in keep:
                    continue
                saved.append((store, name, tensor))
                stand_in = torch.empty_like(tensor, device="meta")
                store[name] = (nn.Parameter(stand_in, requires_grad=tensor.requires_grad)
                               if isinstance(tensor, nn.Parameter) else stand_in)
    try:
        yield
    finally:
        for store, name, tensor in saved:
            store[name] = tensor


def _methods(model: nn.Module, modules: dict[str, nn.Module], path: str, module: nn.Module,
             device: torch.device) -> Iterator[_Method]:
    """The model's own ways of computing the module's tensors, in the order tried."""
    owner = _pretrained_owner(modules, path)
    if owner is not None:  # as from_pretrained's apply: the module, then each ancestor's own
        chain = [modules[p] for p in _up_to(path, modules, owner)]

        def init_weights() -> None:
            for each in chain:
                owner._init_weights(each)  # type: ignore[operator]

        yield f"{type(owner).__name__}._init_weights", init_weights, chain[-1]
    if callable(getattr(type(module), "reset_parameters", None)):
        reset: Callable[[], None] = module.reset_parameters  # type: ignore[assignment]
        yield f"{type(module).__name__}.reset_parameters", reset, module
    rebuild = _rebuild(module, device)
    if rebuild is not None:
        yield rebuild


def _up_to(path: str, modules: dict[str, nn.Module], owner: nn.Module) -> list[str]:
    """``path`` and its ancestors' paths, nearest first, up to ``owner``'s."""
    parts = path.split(".") if path else []
    found = []
    for depth in range(len(parts), -1, -1):
        found.append(".".join(parts[:depth]))
        if modules.get(found[-1]) is owner:
            break
    return found


def _pretrained_owner(modules: dict[str, nn.Module], path: str) -> nn.Module | None:
    """The nearest module at or above ``path`` with transformers' ``_init_weights``."""
    parts = path.split(".") if path else []
    for depth in range(len(parts), -1, -1):
        owner = modules.get(".".join(parts[:depth]))
        if owner is not None and callable(getattr(type(owner), "_init_weights", None)) and \
                hasattr(owner, "config"):
            return owner
    return None


def _rebuild(module: nn.Module, device: torch.device) -> _Method | None:
    """The module rebuilt from its attributes named as its constructor's arguments, if it can be.

    Its buffers are taken; its parameters are built on meta (no memory, and they are not
    taken).
    """
    cls = type(module)
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    kwargs = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.name in module.__dict__ or hasattr(cls, parameter.name):
            kwargs[parameter.name] = getattr(module, parameter.name)
        elif parameter.default is parameter.empty:
            return None  # an argument it keeps under no name of its own
    if not module._buffers:
        return None

    def run() -> None:
        with torch.device(device), empty_parameters():
            rebuilt = cls(**kwargs)
        for name, buffer in rebuilt._buffers.items():
            target = module._buffers.get(name)
            if buffer is not None and target is not None and not target.is_meta and \
                    tuple(buffer.shape) == tuple(target.shape):  # the ones left: real meanwhile
                target.copy_(buffer)

    shown = ", ".join(f"{k}=" for k in kwargs)
    return f"{cls.__name__}({shown}) rebuilt on {device}", run, module


def computed_alike(model: nn.Module, tensors: ModelTensors,
                   keys: Collection[str]) -> dict[str, str]:
    """Which of these keys the model's own code computes alike under any seed, as it holds them.

    A key no checkpoint filled that the model does not train (a buffer, a frozen parameter:
    transformers' Whisper's sinusoidal ``embed_positions``) is computed by the first of the
    model's methods that computes it (:func:`initialise_left`'s order) twice, under two seeds,
    into new storage (the model's tensors stood in for meanwhile, never overwritten). The same
    values both times, equal to what the model holds and not all one value, say it is a value
    of the configuration (sinusoids, frequencies, positions, a mask), not a draw; a constant (a
    norm's ones, running statistics' zeros) is how training starts, not a value of the
    configuration.

    Args:
        model: The unwrapped model, filled.
        tensors: Its tensors as walked.
        keys: Keys the checkpoint lacks.

    Returns:
        Key to the code that computes it, for those it computes alike.
    """
    modules = dict(tensors.modules)
    candidates = []
    for key in keys:
        path, _, name = key.rpartition(".")
        module = modules.get(path)
        held = None if module is None else (module._parameters.get(name)
                                            if name in module._parameters
                                            else module._buffers.get(name))
        if module is None or held is None or held.is_meta or (
                isinstance(held, nn.Parameter) and held.requires_grad):
            continue  # a parameter the model trains is learned, whatever its first value
        candidates.append((key, path, name, module, held))
    holders: dict[int, list[tuple[dict[str, Any], str]]] = {}
    for _, each in tensors.modules if candidates else ():  # built only where it is needed
        for store in (each._parameters, each._buffers):
            for stored, tensor in store.items():
                holders.setdefault(id(tensor), []).append((store, stored))
    found: dict[str, str] = {}
    for key, path, name, module, held in candidates:
        draws = [_draw(model, modules, (path, module), (key, name), holders, seed)
                 for seed in (0, 1)]
        if all(d is not None and torch.equal(d[1], held) for d in draws) and \
                held.numel() > 1 and not bool((held == held.flatten()[0]).all()):
            found[key] = draws[0][0]  # type: ignore[index]
    return found


def _draw(model: nn.Module, modules: dict[str, nn.Module], at: tuple[str, nn.Module],
          named: tuple[str, str], holders: dict[int, list[tuple[dict[str, Any], str]]],
          seed: int) -> tuple[str, torch.Tensor] | None:
    """One computation of a tensor by the model's code under a seed: (how, value), if any."""
    (path, module), (key, name) = at, named
    store = module._parameters if name in module._parameters else module._buffers
    held = store[name]
    assert held is not None
    new = torch.empty(held.shape, dtype=held.dtype, device=held.device)
    _mark(new)
    if isinstance(held, nn.Parameter):
        new = nn.Parameter(new, requires_grad=held.requires_grad)
    pending = _Pending(key, name, held, new, holders.get(id(held), [(store, name)]))
    _install(pending, new)
    done = Initialised()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            left = [pending]
            for method in _methods(model, modules, path, module, held.device):
                left = _attempt(module, left, method, [], done)
                if not left:
                    break
        value = store[name]
        return None if left or value is None else (done.how[key], value.detach().clone())
    finally:
        _install(pending, held)
