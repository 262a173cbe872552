"""A graft's plan run backwards: a model's weights in the source checkpoint's names and layout.

Each step's layout operations (transposes, permuted axes, rotary rows) are undone with their
exact inverses (:mod:`~torchgraft.graft.layouts.ops`), then the tensors that rules and fused or
split projections made are taken apart again, last made first, into the keys the source stores,
cast to the dtypes it stores them in. What cannot be given back is said, per key: a source
key the model cannot produce (a block it lacks, rows it adapted), or a model key the source's
layout has no place for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ...errors import TorchgraftError
from ..layouts import ops
from .adapt import reversible
from .steps import Plan, PlanStep, SourceLayout, is_bookkeeping

__all__ = ["Reversed", "reverse_plan"]

Shape = tuple[int, ...]


@dataclass
class Reversed:
    """What a plan run backwards gives.

    Attributes:
        tensors: Stored source key to its tensor, in the source's stored order.
        lacking: Stored source keys the model cannot produce, with the reason.
        unplaced: Model keys the source's layout has no place for, with the reason.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    lacking: dict[str, str] = field(default_factory=dict)
    unplaced: dict[str, str] = field(default_factory=dict)

    def problems(self) -> dict[str, str]:
        """Lacking and unplaced keys that matter (bookkeeping buffers aside)."""
        return {key: why for key, why in {**self.lacking, **self.unplaced}.items()
                if not is_bookkeeping(key)}


def _undo(step: PlanStep, shape: Shape, value: torch.Tensor) -> torch.Tensor | str:
    """The source tensor a step's target value came from; why not, when it cannot be told."""
    shapes = [shape]
    inverses: list[ops.TensorOp] = []
    for op in step.ops:
        forward = reversible(op)
        if forward is None:
            return f"'{step.target}' was {op.describe()}: that cannot be undone"
        inverses.insert(0, forward.inverse(shapes))
        shapes = forward.shapes(shapes)
    return ops.Chain(tuple(inverses)).apply([value])[0]


def _shapes(layout: SourceLayout) -> tuple[dict[str, Shape], list[list[Shape]]]:
    """Every key's shape as the rules and fusions left it, and each derivation's input shapes."""
    shapes = {key: tuple(info.shape) for key, info in layout.stored.items()}
    inputs = []
    for derivation in layout.derivations:
        given = [shapes[name] for name in derivation.inputs]
        inputs.append(given)
        shapes.update(zip(derivation.outputs, derivation.op.shapes(given), strict=True))
    return shapes, inputs


def _take_apart(layout: SourceLayout, made: dict[str, torch.Tensor], lacking: dict[str, str],
                inputs: list[list[Shape]]) -> None:
    """Undo the derivations, last first: their outputs give back their inputs."""
    for derivation, given in reversed(list(zip(layout.derivations, inputs, strict=True))):
        outputs = [made.pop(name, None) for name in derivation.outputs]
        absent = [n for n, t in zip(derivation.outputs, outputs, strict=True) if t is None]
        if absent:
            for name in derivation.inputs:
                lacking.setdefault(name, f"it was read as part of '{absent[0]}' "
                                         f"({derivation.op.describe()}), which the model lacks")
            continue
        parts = derivation.op.inverse(given).apply([t for t in outputs if t is not None])
        made.update(zip(derivation.inputs, parts, strict=True))


def _ties(plan: Plan, layout: SourceLayout, made: dict[str, torch.Tensor],
          values: Mapping[str, torch.Tensor]) -> None:
    """Stored keys that are one tensor with a produced key (tied weights) take its value.

    So do keys the checkpoint stores apart for two targets the model ties.
    """
    for source, target in plan.apart.items():
        if source in layout.stored and source not in made:
            made[source] = values[target].detach().cpu()
    for later, first in layout.ties.items():
        if later not in made and first in made:
            made[later] = made[first]
        elif first not in made and later in made:
            made[first] = made[later]


def reverse_plan(plan: Plan, values: Mapping[str, torch.Tensor]) -> Reversed:
    """Run a plan backwards on a model's tensors.

    Args:
        plan: A plan made by :func:`~torchgraft.graft.plan.build.plan_graft` (it holds the
            source's layout).
        values: The model's tensors by key (its state dict).

    Returns:
        The source's stored keys with their tensors, and what could not be given back.

    Raises:
        TorchgraftError: If the plan holds no source layout.
    """
    layout = plan.layout
    if layout is None:
        raise TorchgraftError("this plan does not hold its source's layout: make it with "
                              "tg.graft or plan_graft to save in the source's layout")
    shapes, inputs = _shapes(layout)
    out = Reversed()
    made: dict[str, torch.Tensor] = {}
    for step in plan.steps:
        if step.source not in shapes:  # stacked or unstacked experts
            out.unplaced[step.target] = (f"it was read from '{step.source}' "
                                         f"({step.describe()}), which is not taken apart again")
            continue
        value = _undo(step, shapes[step.source], values[step.target].detach().cpu())
        if isinstance(value, str):
            out.lacking[step.source] = value
        else:
            made[step.source] = value
    _take_apart(layout, made, out.lacking, inputs)
    _ties(plan, layout, made, values)
    for key, info in layout.stored.items():
        if key in made:
            out.tensors[key] = made[key].to(info.dtype).contiguous()
        else:
            out.lacking.setdefault(key, plan.unused.get(key, "nothing in the model fills it"))
    out.unplaced.update({**plan.missing, **plan.reinitialised})
    return out
