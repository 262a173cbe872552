"""Planning a graft: which source tensor fills which target tensor, and how, from metadata alone.

:func:`plan_graft` plans from an opened source: the user's operation rules make their
tensors first, then fused and split projections and stacked experts get virtual tensors, then
:func:`build_plan` pairs and decides. The plan keeps the source's layout
(:class:`~torchgraft.graft.plan.steps.SourceLayout`: its stored keys and how each made tensor
was made) so that it can be run backwards (``tg.save(model, path, layout_of=...)``).

Planning runs in passes (:data:`~torchgraft.graft.plan.passes.PASSES`, in order); each target key
records the step that matched it and its evidence:

1. ``exact``: the same name (after the user's rules and the source layout's renames;
   then the step says ``rule`` or ``layout``).
2. ``wrapper``: the same name once wrapper prefixes (``module.``, ``_orig_mod.``, ``model.``)
   shared by every key of a side are removed, on either side; ``prefix``: the same name
   under a common prefix one side adds (``backbone.``, ``encoder.``...).
3. ``structure``: what is left, aligned by order of use, shapes and module kinds.

``match="name"`` stops before structure; ``match="structure"`` goes straight to it. A target
tensor tied to another (the same Parameter) is filled once, through the first of its names
that matched, and listed in ``tied``. A head whose rows differ is re-initialised (``init=``)
unless a ``label_map`` says which rows correspond; an embedding (or a head as wide as one, a
vocabulary) keeps the rows both have.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import TorchgraftError
from ...meta import TensorRef
from ...renames import Rule
from ..evidence import Guess
from ..layouts.catalogue import layouts_for
from ..layouts.experts import ExpertTensors, add_experts, expert_layouts
from ..layouts.fusion import add_virtual
from ..layouts.glu import on_both
from ..layouts.layout import Layout
from ..layouts.norms import NormOffsets
from ..layouts.op_rules import Derivation, apply_op_rules
from ..layouts.ops import lazy
from ..layouts.reparam import add_reparametrised
from ..layouts.rules import RulesSpec, read_rules
from ..layouts.virtual import Virtual
from ..sides.adapters import modules_to_save_layout
from ..sides.heads import Described
from ..sides.source import GraftSource
from ..tensors import Side, TensorInfo
from .adapt import Dequantize, Init, LabelMap
from .passes import run_passes
from .state import PassState
from .steps import Match, Plan, SourceLayout
from .transforms import Options

__all__ = ["PlanOptions", "Planned", "build_plan", "plan_graft"]


def build_plan(src: Side, dst: Side, *, rules: Sequence[Rule] = (),
               layouts: Sequence[Layout] = (), match: Match = "auto", adapt: bool = True,
               init: Init = "keep", label_map: LabelMap | None = None,
               derived: Mapping[str, str] | None = None,
               doubts: Mapping[str, Guess] | None = None, ruled: Collection[str] = (),
               norms: NormOffsets | None = None, described: Described | None = None) -> Plan:
    """Decide, from metadata alone, how each target tensor is filled.

    Args:
        src: The source side (checkpoint, state dict or module).
        dst: The target model's side.
        rules: The user's renaming rules, applied first.
        layouts: The source's framework layouts (renames and transposes).
        match: ``"auto"`` (names, then structure), ``"name"`` or ``"structure"``.
        adapt: Allow adaptations (rows, input channels) when shapes differ.
        init: How new rows are filled: ``"keep"``, ``"normal"`` or ``"zeros"``.
        label_map: Which source rows fill which target rows in row adaptations.
        derived: Virtual source keys (fused or split tensors) to how they were made.
        doubts: Virtual source keys whose layout is a guess, to the guess: the keys they fill
            are guesses (the verdict is then unverified until outputs are compared).
        ruled: Source keys made by the user's operation rules: matched by ``rule``.
        norms: The offsets both sides' norms store their scales with (a unit offset: Gemma).
        described: What both sides state of their models (head counts; whether the source
            is a module). By default nothing: the source is taken as a bare state dict.

    Returns:
        The plan.
    """
    options = Options.of(layouts, dst, adapt=adapt, init=init, label_map=label_map,
                         derived=dict(derived or {}), doubts=dict(doubts or {}),
                         source_heads=bool(src.head_dims), norms=norms or NormOffsets(),
                         conventions=bool(norms and norms.matter()) or on_both(src, dst),
                         ruled=frozenset(ruled))
    state = PassState(src, dst, Plan(init=init), options, rules=rules, match=match,
                     ruled=frozenset(ruled), described=described or Described())
    plan = run_passes(state)
    dequantized = [s.target for s in plan.steps  # most steps have no ops: no generator each
                   if s.ops and any(isinstance(o, Dequantize) for o in s.ops)]
    if dequantized:
        plan.warnings.append(
            f"{len(dequantized)} tensors ('{dequantized[0]}'...) were stored quantized and were "
            "dequantized: they hold the quantized approximation of the float weights")
    return plan


@dataclass(frozen=True)
class PlanOptions:
    """What the user chose for a graft's plan, and what both sides state beyond their tensors.

    Attributes:
        match: ``"auto"`` (names, then structure), ``"name"`` or ``"structure"``.
        adapt: Allow adaptations (rows, input channels) when shapes differ.
        init: How new rows and re-initialised heads are filled.
        label_map: Which source rows fill which target rows in row adaptations.
        norms: The offsets both sides' norms store their scales with (Gemma's).
        described: What both sides state of their models (head counts; a module source).
    """

    match: Match = "auto"
    adapt: bool = True
    init: Init = "keep"
    label_map: LabelMap | None = None
    norms: NormOffsets | None = None
    described: Described | None = None


@dataclass(frozen=True)
class Planned:
    """A plan, the source side it pairs (virtual tensors included) and its lazy tensors.

    Attributes:
        plan: The plan.
        source: The source side it was made against.
        refs: Source key to lazy tensor, virtual ones included (the opened source's own are
            left as they were: one opened source can be planned into several models).
    """

    plan: Plan
    source: Side
    refs: dict[str, TensorRef] = field(default_factory=dict)


def _derivations(virtual: Iterable[Virtual]) -> list[Derivation]:
    """Fused and split virtual tensors as derivations: the outputs of one operation together."""
    grouped: dict[tuple[Any, tuple[str, ...]], dict[int, str]] = {}
    for v in virtual:
        if v.op is not None:
            grouped.setdefault((v.op, v.parts), {})[v.index] = v.name
    return [Derivation(tuple(names[k] for k in sorted(names)), op, parts)
            for (op, parts), names in grouped.items()]


def plan_graft(opened: GraftSource, target: Side, *, rules: RulesSpec = None,
               scoped: bool = False, options: PlanOptions | None = None) -> Planned:
    """Plan a graft of an opened source into a target, from metadata alone.

    Args:
        opened: The source (left as it is).
        target: The target side.
        rules: The user's rules (renames and operations).
        scoped: The source is a PEFT adapter (its ``modules_to_save`` copies are laid out).
        options: What the user chose (match, adapt, init, label map) and what both sides
            state.

    Returns:
        The plan, holding the source's layout, and the source side it pairs.

    Raises:
        TorchgraftError: If a rule does not fit the source, or an option is invalid.
    """
    chosen = options or PlanOptions()
    parsed = read_rules(rules)
    refs = dict(opened.refs)  # made and virtual tensors are added to this copy
    ruled, made = apply_op_rules(parsed.ops, opened.side, refs)
    ruled, reparametrised = add_reparametrised(ruled, refs, target)
    source, virtual = add_virtual(ruled, refs, target)
    experts = add_experts(source, refs, target)
    source = experts.side
    derived = {v.name: v.why for v in (*reparametrised, *virtual)} | {
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
                          ruled=frozenset(name for d in made for name in d.outputs),
                          match=chosen.match, adapt=chosen.adapt, init=chosen.init,
                          label_map=chosen.label_map, norms=chosen.norms,
                          described=chosen.described)
    except ValueError as exc:
        raise TorchgraftError(str(exc)) from None
    _explain(plan, experts)
    source = _made_by_planning(plan.inferred, source, refs)
    plan.layout = SourceLayout(dict(opened.side.tensors), dict(opened.side.ties),
                               (*made, *_derivations(reparametrised), *_derivations(virtual),
                                *plan.inferred))
    return Planned(plan, source, refs)


def _made_by_planning(inferred: list[Derivation], source: Side,
                      refs: dict[str, TensorRef]) -> Side:
    """The lazy tensors of what planning made (fused or split by rows), on the source side."""
    if not inferred:
        return source
    infos = dict(source.tensors)
    made_here: set[str] = set()
    for made in inferred:
        kind = infos[made.inputs[0]].kind
        for name, ref in zip(made.outputs, lazy(made.op, [refs[k] for k in made.inputs]),
                             strict=True):
            refs[name] = ref
            infos[name] = TensorInfo(name, ref.meta.shape, ref.meta.dtype, kind)
        made_here.update(made.outputs)
        for key in made_here.intersection(made.inputs):  # made from made: the last stands
            del infos[key]
    return source.with_tensors(infos, [*source.order, *(n for n in infos
                                                         if n not in source.tensors)])


def _explain(plan: Plan, experts: ExpertTensors) -> None:
    """Put the reasons of layers that could not be stacked or unstacked into the plan."""
    for key, why in experts.problems.items():
        if key in plan.missing:
            plan.missing[key] = why
    for key, why in experts.unused.items():
        if key in plan.unused:
            plan.unused[key] = why
