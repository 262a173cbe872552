"""A graft's plan from an opened source and a target side: everything before any byte is read.

The user's operation rules make their tensors first, then fused and split projections and
stacked experts get virtual tensors, then :func:`~torchgraft.graft.plan.build_plan` pairs and
decides. The plan keeps the source's layout (:class:`~torchgraft.graft.planning.SourceLayout`:
its stored keys and how each made tensor was made) so that it can be run backwards
(``tg.save(model, path, layout_of=...)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import TorchgraftError
from .adapters import modules_to_save_layout
from .experts import add_experts, expert_layouts, explain
from .fusion import Virtual, add_virtual
from .layouts import layouts_for
from .op_rules import Derivation, apply_op_rules
from .plan import build_plan
from .planning import Plan, SourceLayout
from .rules import RulesSpec, read_rules
from .sides import Side
from .source import GraftSource

__all__ = ["Planned", "plan_graft"]


@dataclass(frozen=True)
class Planned:
    """A plan and the source side it was made against (virtual tensors included)."""

    plan: Plan
    source: Side


def _derivations(virtual: Iterable[Virtual]) -> list[Derivation]:
    """Fused and split virtual tensors as derivations: the outputs of one operation together."""
    grouped: dict[tuple[Any, tuple[str, ...]], dict[int, str]] = {}
    for v in virtual:
        if v.op is not None:
            grouped.setdefault((v.op, v.parts), {})[v.index] = v.name
    return [Derivation(tuple(names[k] for k in sorted(names)), op, parts)
            for (op, parts), names in grouped.items()]


def plan_graft(opened: GraftSource, target: Side, *, rules: RulesSpec = None,
               scoped: bool = False, **options: Any) -> Planned:
    """Plan a graft of an opened source into a target, from metadata alone.

    Args:
        opened: The source; virtual tensors are added to its lazy tensors.
        target: The target side.
        rules: The user's rules (renames and operations).
        scoped: The source is a PEFT adapter (its ``modules_to_save`` copies are laid out).
        **options: :func:`~torchgraft.graft.plan.build_plan`'s options (``match``, ``adapt``,
            ``init``, ``label_map``).

    Returns:
        The plan, holding the source's layout, and the source side it pairs.

    Raises:
        TorchgraftError: If a rule does not fit the source, or an option is invalid.
    """
    parsed = read_rules(rules)
    ruled, made = apply_op_rules(parsed.ops, opened.side, opened.refs)
    source, virtual = add_virtual(ruled, opened.refs, target)
    experts = add_experts(source, opened.refs, target)
    source = experts.side
    derived = {v.name: v.why for v in virtual} | {
        name: why for name, (_parts, why) in experts.virtual.items()} | {
        name: f"by {d.origin}: {d.op.describe()} of {', '.join(d.inputs)}"
        for d in made for name in d.outputs}
    saved_copies = modules_to_save_layout(list(target.tensors)) if scoped else None
    layouts = layouts_for(source, target) + expert_layouts(source, target) + (
        [saved_copies] if saved_copies else [])
    try:
        plan = build_plan(source, target, rules=parsed.renames, layouts=layouts,
                          derived=derived, doubts={v.name: guess for v in virtual
                                                   if (guess := v.guess()) is not None},
                          ruled=frozenset(name for d in made for name in d.outputs), **options)
    except ValueError as exc:
        raise TorchgraftError(str(exc)) from None
    explain(plan, experts)
    plan.layout = SourceLayout(dict(opened.side.tensors), dict(opened.side.ties),
                               (*made, *_derivations(virtual)))
    return Planned(plan, source)
