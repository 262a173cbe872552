"""Verification: run source and target on the same inputs and compare their outputs.

Inputs are positional (a tuple, or a lone tensor) or a :data:`Call` of positional and keyword
arguments (:func:`~torchgraft.graft.check.inputs.bind`). Forward hooks record every module's first
output, so a divergence is placed at the first module (in call order) whose activation differs
from the source module that filled it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import TorchgraftError

__all__ = ["Call", "Run", "Verification", "as_call", "compare", "differ", "first_tensor",
           "run_recorded"]

#: Positional and keyword arguments of a forward call.
Call = tuple[tuple[Any, ...], dict[str, Any]]


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
    """The output to compare: a tensor, a mapping's (ModelOutput's) first tensor, a tuple's first.

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


@dataclass(frozen=True)
class Verification:
    """Both models run on their inputs, outputs compared.

    Attributes:
        max_abs_diff: The largest absolute difference of the first output tensors.
        tolerance: The largest difference accepted: ``rtol`` times the source output's scale.
        divergence: ``None`` when within tolerance, else which module diverged first.
        unit: The first diverging module and the source module that filled it, where found.
    """

    max_abs_diff: float
    tolerance: float
    divergence: str | None
    unit: tuple[str, str] | None = None


def _recorder(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[Any]]:
    """Forward hooks recording each module's first output tensor, by path, in call order."""
    seen: dict[str, torch.Tensor] = {}
    paths = {id(m): p for p, m in model.named_modules()}

    def hook(module: nn.Module, _args: Any, output: Any) -> None:
        path = paths.get(id(module))
        if path is not None and path not in seen:
            with contextlib.suppress(TorchgraftError):
                seen[path] = first_tensor(output).detach()

    return seen, [m.register_forward_hook(hook) for m in model.modules()]


def _tensors(output: Any) -> tuple[torch.Tensor, ...]:
    """The tensors a module returned at the top level (a tuple's, a ModelOutput's)."""
    if isinstance(output, torch.Tensor):
        return (output,)
    values = output.values() if isinstance(output, Mapping) else output
    if not isinstance(values, (list, tuple)) and not isinstance(output, Mapping):
        return ()
    return tuple(value for value in values if isinstance(value, torch.Tensor))


@dataclass(frozen=True)
class Run:
    """One forward pass: the output compared, and every module's first output by path.

    Attributes:
        output: The first output tensor.
        seen: Each module's first output tensor, by path, in call order.
        outputs: Every tensor returned at the top level (code bases order them differently:
            transformers' CLIP returns logits first, OpenAI's CLIP the image features).
    """

    output: torch.Tensor
    seen: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, ...] = ()

    def like(self, other: torch.Tensor) -> torch.Tensor | None:
        """The output to compare with ``other``: the first, else the closest of its shape."""
        if self.output.shape == other.shape:
            return self.output
        alike = [t for t in self.outputs if t.shape == other.shape and t.is_floating_point()]
        return min(alike, key=lambda t: float((t.double() - other.double().to(t.device))
                                              .abs().max()), default=None)


def run_recorded(model: nn.Module, inputs: Any) -> Run:
    """Run ``model`` in eval mode without gradients, recording each module's output.

    Args:
        model: The model.
        inputs: Its inputs (see :func:`as_call`).

    Returns:
        The output and the activations.

    Raises:
        TorchgraftError: If the model fails on the inputs.
    """
    args, kwargs = as_call(inputs)
    training = model.training
    seen, handles = _recorder(model)
    try:
        model.eval()
        with torch.no_grad():
            output = model(*args, **kwargs)
    except TorchgraftError:
        raise
    except Exception as exc:
        raise TorchgraftError(f"{type(model).__name__} failed on the inputs: "
                              f"{type(exc).__name__}: {exc}") from exc
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()
    return Run(first_tensor(output), seen, _tensors(output))


def differ(a: torch.Tensor, b: torch.Tensor, rtol: float) -> float | None:
    """The relative difference of two activations, if beyond ``rtol``; ``None`` if not."""
    if a.shape != b.shape or not a.numel() or not a.is_floating_point():
        return None
    a64, b64 = a.double(), b.double().to(a.device)
    diff = float((a64 - b64).abs().max())
    scale = max(float(a64.abs().max()), 1e-12)
    return diff / scale if diff > rtol * scale else None


def compare(source: nn.Module | Run, target: nn.Module, source_inputs: Any,
            target_inputs: Any, *, module_map: Mapping[str, str],
            rtol: float = 1e-4) -> Verification:
    """Run both models (in eval mode) and compare outputs; find where they first diverge.

    Args:
        source: The source module, or its run on ``source_inputs`` already recorded.
        target: The grafted model.
        source_inputs: The source's inputs (a tuple, a lone tensor, or a :data:`Call`).
        target_inputs: The model's.
        module_map: Target module path to the source module path that filled it.
        rtol: Tolerance relative to the source output's largest magnitude.

    Returns:
        The comparison.

    Where the first outputs' shapes differ (code bases order their outputs differently), the
    model's first output is compared with the source's output of its shape that is closest to
    it: a wrong graft is still caught, as it matches none of them.

    Raises:
        TorchgraftError: If no output of the source has the shape of the model's.
    """
    first = source if isinstance(source, Run) else run_recorded(source, source_inputs)
    second = run_recorded(target, target_inputs)
    like, seen_a, b, seen_b = first.like(second.output), first.seen, second.output, second.seen
    if like is None:
        raise TorchgraftError(f"cannot compare outputs of shapes {tuple(first.output.shape)} "
                              f"and {tuple(b.shape)}")
    a = like
    diff = float((a.double() - b.double().to(a.device)).abs().max()) if a.numel() else 0.0
    tolerance = rtol * float(a.double().abs().max()) if a.numel() else 0.0
    divergence, unit = None, None
    if diff > tolerance:
        divergence = "the outputs differ"
        for path, activation in seen_b.items():
            source_path = module_map.get(path)
            if source_path is None or source_path not in seen_a:
                continue
            relative = differ(seen_a[source_path], activation, rtol)
            if relative is not None:
                divergence = (f"activations first diverge at '{path}' (filled from "
                              f"'{source_path}'): relative difference {relative:.3g}")
                unit = (path, source_path)
                break
    return Verification(diff, tolerance, divergence, unit)
