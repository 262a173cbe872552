"""``build_plan``: which source tensor fills which target tensor, and how, from metadata alone.

Planning runs in passes (:data:`~torchgraft.graft.passes.PASSES`, in order); each target key
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

from collections.abc import Collection, Mapping, Sequence

from .adapt import Dequantize, Init, LabelMap
from .evidence import Guess
from .glu import on_both
from .layouts import Layout
from .norms import NormOffsets
from .passes import Planning, run_passes
from .planning import BOOKKEEPING, REINITIALISED, Match, Plan, PlanStep, is_bookkeeping
from .rules import Rule
from .sides import Side
from .transforms import Options

__all__ = ["BOOKKEEPING", "REINITIALISED", "Match", "Plan", "PlanStep", "build_plan",
           "is_bookkeeping"]


def build_plan(src: Side, dst: Side, *, rules: Sequence[Rule] = (),
               layouts: Sequence[Layout] = (), match: Match = "auto", adapt: bool = True,
               init: Init = "keep", label_map: LabelMap | None = None,
               derived: Mapping[str, str] | None = None,
               doubts: Mapping[str, Guess] | None = None, ruled: Collection[str] = (),
               norms: NormOffsets | None = None) -> Plan:
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

    Returns:
        The plan.
    """
    options = Options.of(layouts, dst, adapt=adapt, init=init, label_map=label_map,
                         derived=dict(derived or {}), doubts=dict(doubts or {}),
                         source_heads=bool(src.head_dims), norms=norms or NormOffsets(),
                         conventions=bool(norms and norms.matter()) or on_both(src, dst))
    state = Planning(src, dst, Plan(init=init), options, rules=rules, match=match,
                     ruled=frozenset(ruled))
    plan = run_passes(state)
    dequantized = [s.target for s in plan.steps if any(isinstance(o, Dequantize) for o in s.ops)]
    if dequantized:
        plan.warnings.append(
            f"{len(dequantized)} tensors ('{dequantized[0]}'...) were stored quantized and were "
            "dequantized: they hold the quantized approximation of the float weights")
    return plan
