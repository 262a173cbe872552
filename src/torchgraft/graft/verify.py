"""Verification: run source and target on the same inputs and compare their outputs."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import TorchgraftError
from .sides import run_model

__all__ = ["Verification", "compare", "first_tensor"]


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
    """

    max_abs_diff: float
    tolerance: float
    divergence: str | None


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


def _run(model: nn.Module, inputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    training = model.training
    seen, handles = _recorder(model)
    try:
        model.eval()
        return first_tensor(run_model(model, inputs)), seen
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()


def _differ(a: torch.Tensor, b: torch.Tensor, rtol: float) -> float | None:
    """The relative difference of two activations, if beyond ``rtol``; ``None`` if not."""
    if a.shape != b.shape or not a.numel() or not a.is_floating_point():
        return None
    a64, b64 = a.double(), b.double().to(a.device)
    diff = float((a64 - b64).abs().max())
    scale = max(float(a64.abs().max()), 1e-12)
    return diff / scale if diff > rtol * scale else None


def compare(source: nn.Module, target: nn.Module, source_inputs: Any, target_inputs: Any, *,
            module_map: Mapping[str, str], rtol: float = 1e-4) -> Verification:
    """Run both models (in eval mode) and compare outputs; find where they first diverge.

    Args:
        source: The source module.
        target: The grafted model.
        source_inputs: The source's positional inputs (a tuple, or a lone tensor).
        target_inputs: The model's.
        module_map: Target module path to the source module path that filled it.
        rtol: Tolerance relative to the source output's largest magnitude.

    Returns:
        The comparison.

    Raises:
        TorchgraftError: If the outputs' shapes differ.
    """
    a, seen_a = _run(source, source_inputs)
    b, seen_b = _run(target, target_inputs)
    if a.shape != b.shape:
        raise TorchgraftError(f"cannot compare outputs of shapes {tuple(a.shape)} and "
                              f"{tuple(b.shape)}")
    diff = float((a.double() - b.double().to(a.device)).abs().max()) if a.numel() else 0.0
    tolerance = rtol * float(a.double().abs().max()) if a.numel() else 0.0
    divergence = None
    if diff > tolerance:
        divergence = "the outputs differ"
        for path, activation in seen_b.items():
            source_path = module_map.get(path)
            if source_path is None or source_path not in seen_a:
                continue
            relative = _differ(seen_a[source_path], activation, rtol)
            if relative is not None:
                divergence = (f"activations first diverge at '{path}' (filled from "
                              f"'{source_path}'): relative difference {relative:.3g}")
                break
    return Verification(diff, tolerance, divergence)
