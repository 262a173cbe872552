"""The plan as a search edits it: each target key's step, the source tensors steps read.

A hypothesis is an edit of some target keys' steps (:mod:`.edits`): another source (an
exchanged sibling's, a fused tensor's part read in another layout), or another operation on
the way (rotary rows, a transpose). Trying one fills those keys again from the checkpoint,
through the edited steps: the tensors the search makes (a fused tensor's parts in another
layout) are lazy tensors of the plan's own operations over the source's, recorded as
derivations, so that what is kept is the plan's own steps (and runs backwards, and is written
as rules, like any other).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from ...meta import TensorRef
from ..layouts import ops
from ..layouts.op_rules import Derivation
from ..plan.adapt import Step, applied
from ..plan.steps import Plan, PlanStep

__all__ = ["FOUND", "PlanView", "resourced"]

#: How the report says a step was found.
FOUND = "found by comparing activations"


def _widened(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating tensor in the target's dtype where that is wider (as the fill computes)."""
    if tensor.is_floating_point() and dtype.is_floating_point and \
            torch.promote_types(tensor.dtype, dtype) == dtype != tensor.dtype:
        return tensor.to(dtype)
    return tensor


@dataclass
class PlanView:
    """The steps being edited, and what they read.

    Attributes:
        steps: Target key to its step, as the search has it now.
        made: A made source tensor's name to the derivation that made it (the plan's, then the
            search's).
        refs: Source name (stored or made) to its lazy tensor.
        found: The derivations the search made, in order.
        cache: Tensors read while one unit is searched (a source read once per unit).
    """

    steps: dict[str, PlanStep]
    made: dict[str, Derivation]
    refs: dict[str, TensorRef]
    found: list[Derivation] = field(default_factory=list)
    cache: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: Plan, refs: Mapping[str, TensorRef]) -> PlanView:
        """The view of an executed plan, over the refs it read."""
        derivations = plan.layout.derivations if plan.layout is not None else plan.inferred
        made = {name: d for d in derivations for name in d.outputs}
        return cls({s.target: s for s in plan.steps}, made, dict(refs))

    def derive(self, op: ops.TensorOp, inputs: Sequence[str]) -> tuple[str, ...]:
        """Make tensors with ``op`` from ``inputs``: their names (lazy, recorded)."""
        refs = ops.lazy(op, [self.refs[name] for name in inputs])
        base = inputs[0] if len(inputs) == 1 else _common(inputs)
        number = len(self.found)
        names = tuple(f"{base}~{number}" if len(refs) == 1 else f"{base}~{number}[{k}]"
                      for k in range(len(refs)))
        self.refs.update(zip(names, refs, strict=True))
        derivation = Derivation(names, op, tuple(inputs), FOUND)
        self.found.append(derivation)
        self.made.update(dict.fromkeys(names, derivation))
        return names

    def mark(self) -> int:
        """Where the derivations made so far end (to roll back to)."""
        return len(self.found)

    def rollback(self, mark: int) -> None:
        """Forget the derivations made since ``mark`` (a hypothesis that was not kept)."""
        for derivation in self.found[mark:]:
            for name in derivation.outputs:
                self.refs.pop(name, None)
                self.made.pop(name, None)
                self.cache.pop(name, None)
        del self.found[mark:]

    def read(self, name: str) -> torch.Tensor:
        """A source tensor, read once while a unit is searched."""
        if name not in self.cache:
            self.cache[name] = self.refs[name].read()
        return self.cache[name]

    def value(self, step: PlanStep, target: torch.Tensor) -> torch.Tensor:
        """What a step gives the target tensor."""
        tensor = _widened(self.read(step.source), target.dtype)
        for op in step.ops:
            tensor = applied(op, tensor, target.detach())
        return tensor

    def rows(self, name: str) -> int:
        """A source tensor's rows (its first dimension)."""
        shape = self.refs[name].meta.shape
        return shape[0] if shape else 0


def _common(names: Iterable[str]) -> str:
    """The common dotted prefix of names, or the first name when they share none."""
    listed = list(names)
    parts = [n.split(".") for n in listed]
    common = []
    for column in zip(*parts, strict=False):
        if len(set(column)) != 1:
            break
        common.append(column[0])
    return ".".join(common) or listed[0]


def resourced(step: PlanStep, source: str, how: str,
              extra: Sequence[Step] = ()) -> PlanStep:
    """A step reading another source tensor: why it is made, then the step's own operations.

    The identity step that said how the old source was made is replaced; the step's layout
    operations (a naming family's rotary rows, a transpose) stay, after ``extra``.
    """
    kept = tuple(op for op in step.ops if not (isinstance(op, Step) and op.identity))
    return replace(step, source=source,
                   ops=(Step(ops.Chain(()), f"{how}, {FOUND}"), *extra, *kept))
