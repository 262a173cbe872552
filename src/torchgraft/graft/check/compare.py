"""Verification: run source and target on the same inputs and compare what corresponds.

Inputs are positional (a tuple, or a lone tensor) or a :data:`Call` of positional and keyword
arguments (:func:`~torchgraft.graft.sides.inputs.bind`). What is compared is what
corresponds: the floating outputs of both models that match once their leading dimensions are
flattened (packed ``(B*T, V)`` logits against ``(B, T, V)``); never integer outputs (codes,
token ids) nor losses. Where no output corresponds (pooled features against a token
sequence), the activations of the modules the plan pairs are compared instead, the last
paired module first. Forward hooks record every module's first floating output, so a
divergence is placed at the first module (in call order) whose activation differs from the
source module that filled it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError

__all__ = ["Call", "NotComparable", "Run", "Verification", "as_call", "compare", "differ",
           "first_tensor", "floating_outputs", "run_recorded"]

#: Positional and keyword arguments of a forward call.
Call = tuple[tuple[Any, ...], dict[str, Any]]

#: Nesting of outputs looked into (tuples of tuples of tensors...).
_MAX_DEPTH = 8


class NotComparable(TorchgraftError):
    """Both models ran, but nothing of the one corresponds to anything of the other."""


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


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with its leading dimensions flattened: ``(B, T, V)`` as ``(B*T, V)``."""
    return tensor.reshape(-1, tensor.shape[-1]) if tensor.dim() > 1 else tensor


def _correspond(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values' places once leading dimensions are flattened."""
    return a.dim() > 0 and b.dim() > 0 and a.shape[-1] == b.shape[-1] and \
        a.numel() == b.numel() and a.numel() > 0


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((_flat(a).double() - _flat(b).double().to(a.device)).abs().max())


@dataclass(frozen=True)
class Verification:
    """Both models run on their inputs, what corresponds compared.

    Attributes:
        max_abs_diff: The largest absolute difference of what was compared.
        tolerance: The largest difference accepted: ``rtol`` times the source's scale.
        divergence: ``None`` when within tolerance, else which module diverged first.
        unit: The first diverging module and the source module that filled it, where found.
        compared: What was compared: ``"outputs"``, or the activations of a paired module.
        uncovered: Paired modules that run after the module compared (activations only): what
            they hold was not compared.
    """

    max_abs_diff: float
    tolerance: float
    divergence: str | None
    unit: tuple[str, str] | None = None
    compared: str = "outputs"
    uncovered: tuple[str, ...] = ()


class _Recorder:
    """Forward hooks recording each module's first floating output, by path, as each finishes.

    A module that raises is named: the innermost module entered and not left.
    """

    def __init__(self, model: nn.Module) -> None:
        self.seen: dict[str, torch.Tensor] = {}
        self.open: list[str] = []
        self._paths = {id(m): p for p, m in model.named_modules()}
        self._handles = [h for m in model.modules() for h in (
            m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._leave))]

    def _enter(self, module: nn.Module, _args: Any) -> None:
        self.open.append(self._paths.get(id(module), "?"))

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
    """

    outputs: tuple[torch.Tensor, ...]
    seen: dict[str, torch.Tensor]


def run_recorded(model: nn.Module, inputs: Any) -> Run:
    """Run ``model`` in eval mode without gradients, recording each module's output.

    Args:
        model: The model.
        inputs: Its inputs (see :func:`as_call`).

    Returns:
        The outputs and the activations.

    Raises:
        TorchgraftError: If the model fails on the inputs (naming the module that raised).
    """
    args, kwargs = as_call(inputs)
    training = model.training
    recorder = _Recorder(model)
    try:
        model.eval()
        with torch.no_grad():
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
    return Run(floating_outputs(output), recorder.seen)


def differ(a: torch.Tensor, b: torch.Tensor, rtol: float) -> float | None:
    """The relative difference of two activations, if beyond ``rtol``; ``None`` if not.

    Activations that do not correspond (:func:`compare`'s flattening) are not compared.
    """
    if not _correspond(a, b):
        return None
    diff = _max_diff(a, b)
    scale = max(float(a.double().abs().max()), 1e-12)
    return diff / scale if diff > rtol * scale else None


def _output_pair(source: Run, target: Run) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The model's first output that corresponds to one of the source's, with the closest one.

    Code bases order their outputs differently (transformers' CLIP returns logits first,
    OpenAI's the image features): of the source's outputs that correspond, the closest is
    taken; a wrong graft is still caught, as it is close to none of them.
    """
    for b in target.outputs:
        alike = [a for a in source.outputs if _correspond(a, b)]
        if alike:
            return min(alike, key=lambda a: _max_diff(a, b)), b
    return None


def _activation_pair(source: Run, target: Run, module_map: Mapping[str, str],
                     ) -> tuple[str, str, tuple[str, ...]] | None:
    """The last paired module whose activation corresponds to its source module's.

    Returns:
        Its path, its source module's path, and the paired modules that finished after it
        (not compared); ``None`` when no paired activation corresponds.
    """
    order = list(target.seen)
    for index in range(len(order) - 1, -1, -1):
        path = order[index]
        source_path = module_map.get(path)
        if source_path is not None and source_path in source.seen and \
                _correspond(source.seen[source_path], target.seen[path]):
            after = tuple(p for p in order[index + 1:] if p in module_map)
            return path, source_path, after
    return None


def _shapes(run: Run) -> str:
    return ", ".join(str(tuple(t.shape)) for t in run.outputs) or "none"


def compare(source: nn.Module | Run, target: nn.Module, source_inputs: Any,
            target_inputs: Any, *, module_map: Mapping[str, str],
            rtol: float = 1e-4, outputs: bool = True) -> Verification:
    """Run both models (in eval mode) and compare what corresponds; find where they diverge.

    Args:
        source: The source module, or its run on ``source_inputs`` already recorded.
        target: The grafted model.
        source_inputs: The source's inputs (a tuple, a lone tensor, or a :data:`Call`).
        target_inputs: The model's.
        module_map: Target module path to the source module path that filled it.
        rtol: Tolerance relative to the source's largest magnitude.
        outputs: Whether outputs may be compared: ``False`` where the model has parts of its
            own (declared new), which compute something the source never did; then the last
            paired module's activation is.

    Returns:
        The comparison: of the first output of the model that corresponds to one of the
        source's, else of the last paired module's activation.

    Raises:
        NotComparable: If no output and no paired module's activation corresponds.
        TorchgraftError: If a model fails on its inputs.
    """
    first = source if isinstance(source, Run) else run_recorded(source, source_inputs)
    second = run_recorded(target, target_inputs)
    pair = _output_pair(first, second) if outputs else None
    compared = "outputs"
    uncovered: tuple[str, ...] = ()
    if pair is None:
        found = _activation_pair(first, second, module_map)
        if found is None:
            raise NotComparable(f"no floating output of the model ({_shapes(second)}) "
                                f"corresponds to one of the source's ({_shapes(first)}), nor "
                                "does any paired module's activation")
        path, source_path, uncovered = found
        pair = first.seen[source_path], second.seen[path]
        why = (f"no output corresponds ({_shapes(second)} against {_shapes(first)})"
               if outputs else "the model has parts of its own, declared new")
        compared = f"the activations of '{path}' (filled from '{source_path}'), as {why}"
    a, b = pair
    diff = _max_diff(a, b) if a.numel() else 0.0
    tolerance = rtol * float(a.double().abs().max()) if a.numel() else 0.0
    divergence, unit = None, None
    if diff > tolerance:
        divergence = "the outputs differ" if compared == "outputs" else "they differ"
        for path, activation in second.seen.items():
            paired = module_map.get(path)
            if paired is None or paired not in first.seen:
                continue
            relative = differ(first.seen[paired], activation, rtol)
            if relative is not None:
                divergence = (f"activations first diverge at '{path}' (filled from "
                              f"'{paired}'): relative difference {relative:.3g}")
                unit = (path, paired)
                break
    return Verification(diff, tolerance, divergence, unit, compared, uncovered)
