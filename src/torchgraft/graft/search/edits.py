"""Edits of a plan's steps: what a hypothesis changes, in the plan's own vocabulary.

Each edit names target keys and changes their steps (:class:`~.view.PlanView`):

- :class:`Relayout`: a fused tensor's rows read in another layout: parts in blocks or in
  groups (head by head, key/value group by group, core by core), in any order, and the rotary
  rows of two of its parts reordered; the fused tensor is the source's (split into the model's
  parts), the model's (joined from the source's), or both (copied from one layout to another);
- :class:`Exchange`: same-shape siblings filled from each other's sources;
- :class:`Rotate`: rotary rows of a q and a k reordered;
- :class:`Transpose`: a square weight transposed.

An edit names target keys only; the sources it reads are found from the steps it edits, so
the same edit moves to another unit of the same type (:meth:`moved`) whatever the source
calls its tensors there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..layouts import ops
from ..plan.adapt import Step
from ..plan.steps import PlanStep
from .view import FOUND, PlanView, resourced

__all__ = ["Edit", "Exchange", "Relayout", "Rotate", "Transpose", "moved_key"]


class Edit(Protocol):
    """A change to some target keys' steps."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The target keys whose steps it changes."""
        ...

    def apply(self, view: PlanView, steps: dict[str, PlanStep]) -> None:
        """Change ``steps`` (a copy of the view's) in place, making tensors in ``view``."""
        ...

    def moved(self, old: str, new: str) -> Edit:
        """The same edit in another unit: keys under ``old`` put under ``new``."""
        ...

    def describe(self) -> str:
        """What it does, for the report."""
        ...


def moved_key(key: str, old: str, new: str) -> str:
    """A key under module ``old`` put under ``new`` (other keys as they are)."""
    return new + key[len(old):] if key.startswith(old + ".") else key


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _rotary_way(to_halves: bool) -> str:
    """Which way rotary rows go, in the two orders' usual names."""
    return ("Meta -> transformers order: pairs -> halves" if to_halves
            else "transformers -> Meta order: halves -> pairs")


#: What a fused layout's parts are called when names say nothing.
def _labels(roles: Sequence[str | None]) -> list[str]:
    return [role or f"part {k}" for k, role in enumerate(roles)]


@dataclass(frozen=True)
class Relayout:
    """A fused tensor's rows in another layout.

    Attributes:
        kind: ``"split"`` (a fused source into the model's parts), ``"join"`` (the source's
            parts into a fused target) or ``"copy"`` (a fused source into a fused target).
        legs: Per leaf (weight, bias), the target keys: one per part for a split, the fused
            one otherwise.
        sizes: Each part's rows, in the model's order of parts.
        roles: Each part's role where names say it (``q``, ``k``, ``v``, ``gate``, ``up``).
        stored: The part at each place: for a fused source, the order its parts are stored
            in; for a join, the source part each of the model's parts takes.
        groups: A fused source's groups (1: its parts in blocks).
        target_groups: A fused target's groups.
        rotary: Rotary rows of the ``q`` and ``k`` parts reordered: (head size, to halves).
    """

    kind: str
    legs: tuple[tuple[str, ...], ...]
    sizes: tuple[int, ...]
    roles: tuple[str | None, ...]
    stored: tuple[int, ...]
    groups: int = 1
    target_groups: int = 1
    rotary: tuple[int, bool] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """Every target key of every leg."""
        return tuple(key for leg in self.legs for key in leg)

    def _rotated(self) -> tuple[int, ...]:
        """The parts whose rotary rows are reordered: the q and the k."""
        if self.rotary is None:
            return ()
        named = tuple(k for k, role in enumerate(self.roles) if role in ("q", "k"))
        return named if len(named) == 2 else (0, 1)

    def _taken_apart(self, view: PlanView, fused: str) -> list[str]:
        """A fused source's parts, in the model's order of parts."""
        sizes = [self.sizes[part] for part in self.stored]
        op: ops.TensorOp = ops.Split(0, tuple(sizes)) if self.groups == 1 else \
            ops.Deinterleave(tuple(size // self.groups for size in sizes))
        names = view.derive(op, [fused])
        parts = [""] * len(self.sizes)
        for place, part in enumerate(self.stored):
            parts[part] = names[place]
        return parts

    def _parts(self, view: PlanView, steps: dict[str, PlanStep],
               leg: tuple[str, ...]) -> list[str]:
        """The source's parts a leg reads, in the model's order of parts."""
        first = steps[leg[0]].source
        if self.kind == "copy":
            return self._taken_apart(view, first)
        made = view.made[first]
        if self.kind == "split":
            return self._taken_apart(view, made.inputs[0])
        return [made.inputs[place] for place in self.stored]

    def apply(self, view: PlanView, steps: dict[str, PlanStep]) -> None:
        """Read each leg's parts in this layout, rotary rows reordered where asked."""
        rotated = self._rotated()
        for leg in self.legs:
            parts = self._parts(view, steps, leg)
            if self.rotary is not None:
                head, halves = self.rotary
                for place in rotated:
                    parts[place] = view.derive(ops.RotaryRows(head, halves), [parts[place]])[0]
            if self.kind == "split":
                for key, name in zip(leg, parts, strict=True):
                    steps[key] = resourced(steps[key], name, self.describe())
                continue
            op: ops.TensorOp = ops.Concatenate(0) if self.target_groups == 1 else \
                ops.Interleave(tuple(size // self.target_groups for size in self.sizes))
            joined = view.derive(op, parts)[0]
            steps[leg[0]] = resourced(steps[leg[0]], joined, self.describe())

    def moved(self, old: str, new: str) -> Relayout:
        """The same layout for the same keys of another unit."""
        return replace(self, legs=tuple(tuple(moved_key(k, old, new) for k in leg)
                                        for leg in self.legs))

    def _layout(self, groups: int, order: Sequence[int]) -> str:
        """Parts in an order, in blocks or groups: ``2 groups of [q; k; v] (16+8+8 rows each)``."""
        labels = _labels(self.roles)
        inner = "; ".join(labels[part] for part in order)
        rows = "+".join(str(self.sizes[part] // groups) for part in order)
        return f"{groups} groups of [{inner}] ({rows} rows each)" if groups > 1 else \
            f"[{inner}] blocks ({rows} rows)"

    def describe(self) -> str:
        """The layout, in the parts' roles (or places)."""
        plain = tuple(range(len(self.sizes)))
        if self.kind == "split":
            parts = ", ".join(f"'{_module(k)}'" for k in self.legs[0])
            text = (f"{parts} read from fused rows stored as "
                    f"{self._layout(self.groups, self.stored)}")
        elif self.kind == "join":
            text = (f"'{_module(self.legs[0][0])}' joined as "
                    f"{self._layout(self.target_groups, self.stored)}")
        else:
            text = (f"'{_module(self.legs[0][0])}' read from fused rows stored as "
                    f"{self._layout(self.groups, self.stored)}, laid out as "
                    f"{self._layout(self.target_groups, plain)}")
        if self.rotary is not None:
            head, halves = self.rotary
            labels = _labels(self.roles)
            text += (f", rotary rows of {' and '.join(labels[p] for p in self._rotated())} "
                     f"reordered ({_rotary_way(halves)}, head size {head})")
        return text


@dataclass(frozen=True)
class Exchange:
    """Target keys filled from each other's sources: same-shape siblings exchanged.

    Attributes:
        pairs: The keys exchanged, two by two (a module's tensors with its namesakes').
    """

    pairs: tuple[tuple[str, str], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        """Both keys of every pair."""
        return tuple(key for pair in self.pairs for key in pair)

    def apply(self, view: PlanView, steps: dict[str, PlanStep]) -> None:
        """Exchange the steps' sources (and what they do on the way)."""
        for first, second in self.pairs:
            steps[first], steps[second] = (replace(steps[second], target=first),
                                           replace(steps[first], target=second))

    def moved(self, old: str, new: str) -> Exchange:
        """The same exchange in another unit."""
        return Exchange(tuple((moved_key(a, old, new), moved_key(b, old, new))
                              for a, b in self.pairs))

    def describe(self) -> str:
        """What was exchanged: two modules (every tensor with its namesake), or two tensors."""
        modules = {(_module(a), _module(b)) for a, b in self.pairs}
        if len(modules) == 1 and all(a.rpartition(".")[2] == b.rpartition(".")[2]
                                     for a, b in self.pairs):
            first, second = modules.pop()
            return f"'{first}' and '{second}' exchanged"
        return " and ".join(f"'{a}' and '{b}'" for a, b in self.pairs) + " exchanged"


def _undoes(op: ops.TensorOp, other: object) -> bool:
    """Whether ``op`` undoes ``other`` (a transpose undoes itself; rotary rows the other way)."""
    if isinstance(op, ops.RotaryRows):
        return other == ops.RotaryRows(op.head_dim, not op.to_halves, op.rows)
    return isinstance(op, ops.Transpose) and other == op


def _added(step: PlanStep, op: ops.TensorOp, why: str) -> PlanStep:
    """A step with one more operation, or one fewer where the new one undoes its last."""
    last = step.ops[-1] if step.ops else None
    if isinstance(last, Step) and _undoes(op, last.op):
        return replace(step, ops=step.ops[:-1])
    return replace(step, ops=(*step.ops, Step(op, f"{why}, {FOUND}")))


@dataclass(frozen=True)
class Rotate:
    """Rotary rows of a q and a k reordered (the other rotary order's rows).

    Attributes:
        keys: The keys (a q's and a k's weights, and biases).
        head_dim: The head size.
        to_halves: Pairs to halves (else halves to pairs).
    """

    keys: tuple[str, ...]
    head_dim: int
    to_halves: bool

    def apply(self, view: PlanView, steps: dict[str, PlanStep]) -> None:
        """Add the reordering to each key's step."""
        op = ops.RotaryRows(self.head_dim, self.to_halves)
        for key in self.keys:
            steps[key] = _added(steps[key], op, "rotary rows reordered")

    def moved(self, old: str, new: str) -> Rotate:
        """The same reordering in another unit."""
        return replace(self, keys=tuple(moved_key(k, old, new) for k in self.keys))

    def describe(self) -> str:
        """What was reordered."""
        modules = " and ".join(dict.fromkeys(f"'{_module(k)}'" for k in self.keys))
        return (f"rotary rows of {modules} reordered ({_rotary_way(self.to_halves)}, head size "
                f"{self.head_dim})")


@dataclass(frozen=True)
class Transpose:
    """A square weight transposed (a code base that stores it ``[in, out]``).

    Attributes:
        keys: The weights.
    """

    keys: tuple[str, ...]

    def apply(self, view: PlanView, steps: dict[str, PlanStep]) -> None:
        """Add the transpose to each key's step."""
        for key in self.keys:
            steps[key] = _added(steps[key], ops.Transpose(0, 1), "transposed")

    def moved(self, old: str, new: str) -> Transpose:
        """The same transpose in another unit."""
        return Transpose(tuple(moved_key(k, old, new) for k in self.keys))

    def describe(self) -> str:
        """What was transposed."""
        return f"{' and '.join(repr(k) for k in self.keys)} transposed"
