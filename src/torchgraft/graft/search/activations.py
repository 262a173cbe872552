"""Running a model with hooks: its outputs, each module's output, and chosen modules' inputs.

A forward pass in eval mode without gradients records every module's first floating output
(:class:`Run`); the modules asked for also keep the arguments they were first called with,
copied as they were then, so that a module can be run again alone on them
(:func:`run_alone`): a unit's inputs are captured once, and each hypothesis costs one forward
pass of the unit, not of the model.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError

__all__ = ["Call", "Run", "as_call", "correspond", "differ", "first_tensor", "floating_outputs",
           "max_diff", "run_alone", "run_recorded"]

#: Positional and keyword arguments of a forward call.
Call = tuple[tuple[Any, ...], dict[str, Any]]

#: Nesting of outputs looked into (tuples of tuples of tensors...).
_MAX_DEPTH = 8


def as_call(inputs: Any) -> Call:
    """Inputs as a call.

    A :data:`Call` as it is, a tuple as positional arguments, a mapping as keyword arguments,
    anything else as the one positional argument.
    """
    if (isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple)
            and isinstance(inputs[1], dict)):
        return inputs
    if isinstance(inputs, tuple):
        return inputs, {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (inputs,), {}


def first_tensor(output: Any) -> torch.Tensor:
    """A tensor, a mapping's (ModelOutput's) first tensor, a tuple's first.

    Args:
        output: What a module returned.

    Returns:
        The first tensor found.

    Raises:
        TorchgraftError: If the output holds no tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, Mapping) else output
    if isinstance(values, (list, tuple)) or isinstance(output, Mapping):
        for value in values:
            if value is not None:
                try:
                    return first_tensor(value)
                except TorchgraftError:
                    continue
    raise TorchgraftError(f"the module's output ({type(output).__name__}) holds no tensor")


def floating_outputs(output: Any) -> tuple[torch.Tensor, ...]:
    """The floating tensors a module returned, in order, looked for in tuples and mappings.

    Integer and boolean tensors (codes, token ids, masks), scalars and entries named as
    losses are left out: they are never compared.

    Args:
        output: What a module returned.

    Returns:
        The tensors, in the order returned.
    """
    found: list[torch.Tensor] = []

    def walk(value: Any, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        if isinstance(value, torch.Tensor):
            if (value.is_floating_point() or value.is_complex()) and value.dim() and \
                    not value.is_meta:
                found.append(value.detach())
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if not (isinstance(key, str) and "loss" in key.lower()):
                    walk(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)

    walk(output, 0)
    return tuple(found)


class _Recorder:
    """Forward hooks recording each module's first floating output, by path, as each finishes.

    Each module's first floating input is kept too (a copy: an in-place activation changes
    it), and the modules in ``capture`` keep the arguments of their first call, copied before
    it ran (a cache it updates is kept as it was). A module that raises is named: the
    innermost module entered and not left.
    """

    def __init__(self, model: nn.Module, capture: Collection[str] = ()) -> None:
        self.seen: dict[str, torch.Tensor] = {}
        self.entered: dict[str, torch.Tensor] = {}
        self.called: dict[str, Call] = {}
        self.open: list[str] = []
        self._capture = set(capture)
        self._paths = {id(m): p for p, m in model.named_modules()}
        self._handles = [h for m in model.modules() for h in (
            m.register_forward_pre_hook(self._enter, with_kwargs=True),
            m.register_forward_hook(self._leave))]

    def _enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        path = self._paths.get(id(module), "?")
        self.open.append(path)
        if path not in self.entered:
            given = floating_outputs((args, kwargs))
            if given:
                self.entered[path] = given[0].clone()
        if path in self._capture and path not in self.called:
            try:
                self.called[path] = copy.deepcopy((args, kwargs))
            except Exception:  # an argument that cannot be copied: the module is not run alone
                self._capture.discard(path)

    def _leave(self, module: nn.Module, _args: Any, output: Any) -> None:
        if self.open:
            self.open.pop()
        path = self._paths.get(id(module))
        if path is not None and path not in self.seen:
            outputs = floating_outputs(output)
            if outputs:
                self.seen[path] = outputs[0]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass(frozen=True)
class Run:
    """One forward pass: its floating outputs, and every module's first floating output.

    Attributes:
        outputs: The floating tensors returned (:func:`floating_outputs`).
        seen: Each module's first floating output, by path, in the order modules finished.
        called: The arguments each module asked for was first called with, as they were then.
        entered: Each module's first floating input, by path, in the order modules started.
    """

    outputs: tuple[torch.Tensor, ...]
    seen: dict[str, torch.Tensor]
    called: Mapping[str, Call] = field(default_factory=dict)
    entered: Mapping[str, torch.Tensor] = field(default_factory=dict)


def run_recorded(model: nn.Module, inputs: Any, *, capture: Collection[str] = (),
                 seed: int = 0) -> Run:
    """Run ``model`` in eval mode without gradients, recording each module's output.

    Random numbers it draws come from a generator seeded with ``seed`` (two models that
    draw alike draw the same), forked from the caller's, which is left as it was.

    Args:
        model: The model.
        inputs: Its inputs (see :func:`as_call`).
        capture: Paths of modules whose first call's arguments to keep.
        seed: The seed of the random numbers it draws.

    Returns:
        The outputs and the activations.

    Raises:
        TorchgraftError: If the model fails on the inputs (naming the module that raised).
    """
    args, kwargs = as_call(inputs)
    training = model.training
    recorder = _Recorder(model, capture)
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(model)):
            torch.manual_seed(seed)
            output = model(*args, **kwargs)
    except TorchgraftError:
        raise
    except Exception as exc:
        where = next((p for p in reversed(recorder.open) if p), None)
        inside = f" in '{where}' ({type(model.get_submodule(where)).__name__})" \
            if where not in (None, "?") else ""
        raise TorchgraftError(f"{type(model).__name__} failed on the inputs{inside}: "
                              f"{type(exc).__name__}: {exc}") from exc
    finally:
        model.train(training)
        recorder.remove()
    return Run(floating_outputs(output), recorder.seen, recorder.called, recorder.entered)


def _cuda_devices(model: nn.Module) -> list[int]:
    """The CUDA devices a model's tensors are on, whose generators a seeded run forks."""
    return sorted({t.device.index or 0 for t in itertools.chain(model.parameters(),
                                                                model.buffers())
                   if t.device.type == "cuda"})


def run_alone(model: nn.Module, path: str, call: Call, watched: str) -> torch.Tensor | None:
    """Run one module of ``model`` alone on a captured call; what a module in it gave.

    The first floating output of ``watched`` (a module inside it, or itself) in that pass is
    returned. The call is copied again for the run (what the module updates, a cache, stays as
    it was captured).

    Args:
        model: The model.
        path: The module to run.
        call: Its captured arguments.
        watched: The module whose output is returned.

    Returns:
        Its output, or ``None`` when it gave no floating tensor.

    Raises:
        TorchgraftError: If the module fails on the call.
    """
    module, watch = model.get_submodule(path), model.get_submodule(watched)
    seen: list[torch.Tensor] = []

    def record(_module: nn.Module, _args: Any, output: Any) -> None:
        if not seen:
            seen.extend(floating_outputs(output)[:1])

    handle = watch.register_forward_hook(record)
    args, kwargs = copy.deepcopy(call)
    try:
        with torch.no_grad():
            module(*args, **kwargs)
    except Exception as exc:
        raise TorchgraftError(f"'{path}' ({type(module).__name__}) failed alone on its "
                              f"captured inputs: {type(exc).__name__}: {exc}") from exc
    finally:
        handle.remove()
    return seen[0] if seen else None


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with its leading dimensions flattened: ``(B, T, V)`` as ``(B*T, V)``."""
    return tensor.reshape(-1, tensor.shape[-1]) if tensor.dim() > 1 else tensor


def correspond(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values' places once leading dimensions are flattened."""
    return a.dim() > 0 and b.dim() > 0 and a.shape[-1] == b.shape[-1] and \
        a.numel() == b.numel() and a.numel() > 0


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of two tensors that correspond."""
    return float((_flat(a).double() - _flat(b).double().to(a.device)).abs().max())


def differ(a: torch.Tensor, b: torch.Tensor, rtol: float) -> float | None:
    """The relative difference of two activations, if beyond ``rtol``; ``None`` if not.

    Activations that do not correspond (:func:`correspond`) are not compared. A NaN is never
    within tolerance.
    """
    if not correspond(a, b):
        return None
    diff = max_diff(a, b)
    scale = max(float(a.double().abs().max()), 1e-12)
    return None if diff <= rtol * scale else diff / scale
