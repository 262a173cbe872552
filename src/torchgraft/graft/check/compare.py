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
from ..search.activations import Run, correspond, differ, max_diff, run_recorded

__all__ = ["NotComparable", "Verification", "compare"]

class NotComparable(TorchgraftError):
    """Both models ran, but nothing of the one corresponds to anything of the other."""


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


def _output_pair(source: Run, target: Run) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The model's first output that corresponds to one of the source's, with the closest one.

    Code bases order their outputs differently (transformers' CLIP returns logits first,
    OpenAI's the image features): of the source's outputs that correspond, the closest is
    taken; a wrong graft is still caught, as it is close to none of them.
    """
    for b in target.outputs:
        alike = [a for a in source.outputs if correspond(a, b)]
        if alike:
            return min(alike, key=lambda a: max_diff(a, b)), b
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
                correspond(source.seen[source_path], target.seen[path]):
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
    diff = max_diff(a, b) if a.numel() else 0.0
    tolerance = rtol * float(a.double().abs().max()) if a.numel() else 0.0
    divergence, unit = None, None
    if not diff <= tolerance:  # a NaN is never within tolerance
        _deterministic(target, target_inputs, second, rtol)
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


def _deterministic(model: nn.Module, inputs: Any, run: Run, rtol: float) -> None:
    """Check that the model computes the same twice on its inputs, random numbers apart.

    A model that samples (a VAE whose forward draws its latent by default) gives other outputs
    for other random numbers: a difference from the source's then says nothing of the graft.

    Raises:
        NotComparable: If a run with other random numbers differs, naming the first module
            whose output does.
    """
    again = run_recorded(model, inputs, seed=1)
    varies = next((path for path, activation in run.seen.items()
                   if path in again.seen and differ(again.seen[path], activation, rtol)
                   is not None), None)
    if varies is None and not any(differ(a, b, rtol) is not None
                                  for a, b in zip(run.outputs, again.outputs, strict=False)):
        return
    where = f"first at '{varies}'" if varies else "in its outputs"
    raise NotComparable(f"the model's outputs vary from run to run on these inputs (it draws "
                        f"random numbers: {where}), so a difference from the source's says "
                        "nothing of the graft; give inputs that make its forward deterministic "
                        "(example_inputs=, CLI: --inputs FILE)")
