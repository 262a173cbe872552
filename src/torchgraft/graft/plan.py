"""``build_plan``: which source tensor fills which target tensor, and how, from metadata alone.

Matching runs in steps; each target key records the step that matched it:

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

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..meta import dtype_name
from ..quantized import is_quantized
from ..wrappers import strip_wrappers
from .adapt import (
    Dequantize,
    Derived,
    Init,
    InputChannels,
    LabelMap,
    Op,
    RotaryPermute,
    Rows,
    Transpose,
    label_pairs,
)
from .conventions import role_of
from .evidence import NAME_STEPS, Evidence, Guess, MatchStep
from .layouts import Layout, rotary_warning
from .rules import Rule, rename
from .sides import Side, TensorInfo
from .structure import align

__all__ = ["BOOKKEEPING", "REINITIALISED", "Match", "Plan", "PlanStep", "build_plan",
           "is_bookkeeping"]

Match = Literal["auto", "name", "structure"]

# Buffers that count steps or hold constants: never a reason for a graft to fail.
BOOKKEEPING = (
    re.compile(r"(^|\.)num_batches_tracked$"),
    re.compile(r"(^|\.)position_ids$"),
    re.compile(r"(^|\.)attn\.(masked_)?bias$"),
)


#: How an unused source tensor whose target was re-initialised is described.
REINITIALISED = "was re-initialised instead: the shapes differ"


def is_bookkeeping(name: str) -> bool:
    """Whether a key is a bookkeeping buffer (``num_batches_tracked``...)."""
    return any(p.search(name) for p in BOOKKEEPING)


@dataclass(frozen=True)
class PlanStep:
    """One target tensor filled from one source tensor.

    Attributes:
        target: The target key.
        source: The source key.
        matched_by: The matching step: exact, rule, layout, wrapper, prefix or structure.
        ops: Adaptations applied in order; empty for a plain copy.
        cast: ``"float16->float32"`` when the dtypes differ, else ``""``.
        evidence: How the pairing is known: by name, by structure, or a guess.
    """

    target: str
    source: str
    matched_by: MatchStep
    ops: tuple[Op, ...] = ()
    cast: str = ""
    evidence: Evidence = Evidence.NAME

    def describe(self) -> str:
        """What was done to the tensor, for the report (empty for a plain copy)."""
        parts = [op.describe() for op in self.ops] + ([f"cast {self.cast}"] if self.cast else [])
        return "; ".join(parts)


@dataclass
class Plan:
    """Everything a graft will do, decided before any tensor byte is read.

    Attributes:
        steps: The tensors to fill, in the target's order.
        missing: Target keys left as they are, with the reason.
        unused: Source keys not used, with the reason.
        reinitialised: Target keys given fresh values (``init=``) instead of the checkpoint's,
            with the reason (a new classifier head).
        tied: Target key to the key it is tied to, filled through that key.
        warnings: What the plan could not be sure of.
        init: How re-initialised tensors are filled.
        guesses: Target keys filled by a guess, with their alternatives.
    """

    steps: list[PlanStep] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    unused: dict[str, str] = field(default_factory=dict)
    reinitialised: dict[str, str] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    init: Init = "keep"
    guesses: dict[str, Guess] = field(default_factory=dict)


def _pair_by(targets: dict[str, str], sources: dict[str, str]) -> dict[str, str]:
    """Pair target and source keys whose transformed names are equal and unique."""
    by_name: dict[str, list[str]] = {}
    for source, name in sources.items():
        by_name.setdefault(name, []).append(source)
    return {t: by_name[name][0] for t, name in targets.items()
            if len(by_name.get(name, ())) == 1}


def _common_prefixes(targets: list[str], sources: list[str]) -> dict[str, str]:
    """Pair keys that match once one side's extra prefix (``backbone.``...) is removed.

    Each dotted suffix of each name is looked up once in the other side's names, so the cost
    is linear in the names' total length; the prefix shared by most names is tried first.
    """
    groups: dict[tuple[str, str], dict[str, str]] = {}  # (side, prefix) -> {name: rest}
    for side, names, others in (("source", sources, set(targets)),
                                ("target", targets, set(sources))):
        for name in names:
            for k, char in enumerate(name):
                if char == "." and name[k + 1:] in others:
                    groups.setdefault((side, name[:k + 1]), {})[name] = name[k + 1:]
    pairs: dict[str, str] = {}
    taken: set[str] = set()
    for (side, _prefix), found in sorted(groups.items(), key=lambda item: -len(item[1])):
        for name, rest in found.items():
            target, source = (rest, name) if side == "source" else (name, rest)
            if target not in pairs and source not in taken:
                pairs[target] = source
                taken.add(source)
    return pairs


def _transpose(src: TensorInfo, dst: TensorInfo, layouts: Sequence[Layout]) -> Transpose | None:
    for layout in layouts:
        if layout.transposed(src, dst):
            return Transpose(layout.why)
    return None


# Module kinds that hold the same thing in another layout (a Conv1D bias is a Linear bias).
_SAME_KIND = {"gpt2_conv1d": "linear"}


def _kinds_differ(src: TensorInfo, dst: TensorInfo) -> bool:
    if src.kind is None or dst.kind is None:
        return False
    return _SAME_KIND.get(src.kind, src.kind) != _SAME_KIND.get(dst.kind, dst.kind)


def _fits(layouts: Sequence[Layout]) -> Callable[[TensorInfo, TensorInfo], bool]:
    def fits(src: TensorInfo, dst: TensorInfo) -> bool:
        transposed = _transpose(src, dst, layouts) is not None
        if _kinds_differ(src, dst) and not transposed:
            return False
        return (src.shape[::-1] if transposed else src.shape) == dst.shape
    return fits


def _rotary(target: str, dst: Side, layouts: Sequence[Layout]) -> RotaryPermute | str | None:
    """The rotary permutation a target tensor needs; a reason when its head size is unknown."""
    for layout in layouts:
        if layout.rotary is None or not layout.rotary.targets.search(target):
            continue
        module = target
        while module:
            module = module.rpartition(".")[0]
            if module in dst.head_dims:
                return RotaryPermute(dst.head_dims[module], layout.rotary.to_meta)
        return (f"Cannot load '{target}': its rotary rows are in {layout.name.split('->')[0]}'s "
                "order and the model says no head_dim to reorder them by (give its attention "
                "module a head_dim attribute).")
    return None


def _vocab_rows(dst: Side) -> set[int]:
    return {info.shape[0] for info in dst.tensors.values()
            if info.kind == "embedding" and len(info.shape) == 2}


def _shape_text(shape: tuple[int, ...]) -> str:
    return str(shape) if len(shape) != 1 else f"({shape[0]},)"


def _adapt(src: TensorInfo, dst: TensorInfo, shape: tuple[int, ...], *, init: Init,
           label_map: LabelMap | None, vocab: set[int]) -> Op | str | None:
    """The adaptation turning ``shape`` into the target's; a reason to re-initialise it."""
    if len(shape) != len(dst.shape) or not shape:
        return None
    differ = [i for i, (a, b) in enumerate(zip(shape, dst.shape, strict=True)) if a != b]
    if differ == [1] and len(shape) in (3, 4, 5) and dst.kind in ("conv", None):
        return InputChannels(shape[1], dst.shape[1], init)
    if differ != [0]:
        return None
    if label_map is not None:
        return Rows(shape[0], dst.shape[0], init, label_pairs(label_map, shape[0], dst.shape[0]))
    if dst.kind == "embedding" or dst.shape[0] in vocab:
        return Rows(shape[0], dst.shape[0], init)
    return (f"the checkpoint has {shape[0]} rows ('{src.name}'), the model {dst.shape[0]}: a new "
            f"head, re-initialised (init={init!r}); pass label_map=... to keep rows that "
            "correspond")


def _decide(target: str, source: str, how: MatchStep, src: TensorInfo, dst: TensorInfo,
            layouts: Sequence[Layout], plan: Plan, dst_side: Side, *, adapt: bool, init: Init,
            label_map: LabelMap | None, derived: Mapping[str, str]) -> None:
    transpose = _transpose(src, dst, layouts)
    shape = src.shape[::-1] if transpose else src.shape
    ops: list[Op] = [Derived(derived[source])] if source in derived else []
    dtype = src.dtype
    if is_quantized(src.dtype) and not is_quantized(dst.dtype):
        ops.append(Dequantize(dtype_name(src.dtype)))
        dtype = torch.float32
    ops += [transpose] if transpose else []
    rotary = _rotary(target, dst_side, layouts)
    if isinstance(rotary, str):
        plan.missing[target] = rotary
        plan.unused[source] = f"its rotary rows could not be reordered for '{target}'"
        return
    if rotary is not None:
        ops.append(rotary)
    if shape != dst.shape:
        op = _adapt(src, dst, shape, init=init, label_map=label_map,
                    vocab=_vocab_rows(dst_side)) if adapt else None
        if isinstance(op, str):
            plan.reinitialised[target] = op
            plan.unused[source] = f"'{target}' {REINITIALISED}"
            return
        if op is None:
            fix = ("Pass adapt=True to re-initialise it, or a rule that drops it." if not adapt
                   else "Only a leading dimension (rows) or a convolution's input channels "
                        "can be adapted; add a rule that drops it.")
            plan.missing[target] = (f"Cannot load '{target}': checkpoint has "
                                    f"{_shape_text(shape)} ('{source}'), model expects "
                                    f"{_shape_text(dst.shape)}. {fix}")
            plan.unused[source] = f"does not fit '{target}': {_shape_text(shape)} vs " \
                                  f"{_shape_text(dst.shape)}"
            return
        ops.append(op)
    cast = "" if dtype == dst.dtype else f"{dtype_name(dtype)}->{dtype_name(dst.dtype)}"
    evidence = plan.guesses.get(target)
    plan.steps.append(PlanStep(target, source, how, tuple(ops), cast,
                               Evidence.NAME if how in NAME_STEPS
                               else Evidence.GUESS if evidence else Evidence.STRUCTURE))


#: Roles whose rows a rotary (RoPE) layout may store in another order.
_ROTARY_ROLES = frozenset({"q", "k", "qkv"})


def _rotary_guesses(plan: Plan, structural: list[str], pairs: dict[str, str]) -> None:
    """Mark structure-matched q and k weights as guesses: their rotary order is not known."""
    for target in structural:
        if role_of(target.rpartition(".")[0]) in _ROTARY_ROLES and target not in plan.guesses:
            plan.guesses[target] = Guess(
                (f"{pairs[target]} (rows as stored)", f"{pairs[target]} (rotary rows permuted)"),
                "one side is a rotary (RoPE) family and the other is not known: the rows may "
                "be in the other rotary order")


def _renamed_info(info: TensorInfo, name: str) -> TensorInfo:
    """A source tensor's info under its renamed key (module paths follow renames)."""
    return TensorInfo(name, info.shape, info.dtype, info.kind) if name != info.name else info


def build_plan(src: Side, dst: Side, *, rules: Sequence[Rule] = (),
               layouts: Sequence[Layout] = (), match: Match = "auto", adapt: bool = True,
               init: Init = "keep", label_map: LabelMap | None = None,
               derived: Mapping[str, str] | None = None) -> Plan:
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

    Returns:
        The plan.
    """
    derived = derived or {}
    plan = Plan(init=init)
    renamed: dict[str, str] = {}
    how_renamed: dict[str, MatchStep] = {}
    layout_rules = [rule for layout in layouts for rule in layout.renames]
    for name in src.tensors:
        new, rule = rename(name, rules)
        if new is None:
            plan.unused[name] = f"dropped by rule {rule}"
            continue
        laid_out, layout_rule = rename(new, layout_rules)
        renamed[name] = laid_out or new
        how_renamed[name] = (MatchStep.RULE if rule else
                             MatchStep.LAYOUT if layout_rule else MatchStep.EXACT)

    pairs: dict[str, str] = {}
    paired: set[str] = set()  # pairs' values, for lookups in constant time
    how: dict[str, MatchStep] = {}

    def take(found: dict[str, str], step: MatchStep | None) -> None:
        for target, source in found.items():
            if target not in pairs and source not in paired:
                pairs[target] = source
                paired.add(source)
                how[target] = step or how_renamed[source]

    if match != "structure":
        take(_pair_by({t: t for t in dst.tensors}, renamed), None)
        left_t = [t for t in dst.tensors if t not in pairs]
        left_s = [s for s in renamed if s not in paired]
        stripped_t = strip_wrappers(dst.tensors)[1]
        stripped_s = strip_wrappers(renamed.values())[1]
        take(_pair_by({t: stripped_t[t] for t in left_t},
                      {s: stripped_s[renamed[s]] for s in left_s}), MatchStep.WRAPPER)
        left_t = [t for t in dst.tensors if t not in pairs]
        left_s = [s for s in renamed if s not in paired]
        by_stripped = {stripped_s[renamed[s]]: s for s in left_s}
        prefixed = _common_prefixes([stripped_t[t] for t in left_t], list(by_stripped))
        to_target = {stripped_t[t]: t for t in left_t}
        take({to_target[t]: by_stripped[s] for t, s in prefixed.items()}, MatchStep.PREFIX)

    ambiguous: dict[str, str] = {}
    if match != "name":
        filled = {dst.ties.get(t, t) for t in pairs}
        left_t = [t for t in dst.order if t not in pairs and dst.ties.get(t, t) not in filled]
        left_s = [s for s in src.order if s in renamed and s not in paired]
        back = {renamed[s]: s for s in left_s}
        src_infos = {renamed[s]: _renamed_info(src.tensors[s], renamed[s]) for s in left_s}
        alignment = align(left_t, list(back), dst.tensors, src_infos, _fits(layouts),
                          is_bookkeeping, source_ordered=src.ordered)
        ambiguous = alignment.ambiguous
        take({t: back[s] for t, s in alignment.pairs.items()}, MatchStep.STRUCTURE)
        plan.guesses.update({t: g for t, g in alignment.guesses.items()
                             if how.get(t) == MatchStep.STRUCTURE})
        structural = [t for t in pairs if how[t] == MatchStep.STRUCTURE]
        warning = rotary_warning(src, dst) if structural else None
        if warning:
            plan.warnings.append(warning)
            _rotary_guesses(plan, structural, pairs)

    filler: dict[str, str] = {}
    for target in dst.tensors:
        owner = dst.ties.get(target, target)
        if target in pairs and owner not in filler:
            filler[owner] = target
    for target in dst.tensors:
        owner = dst.ties.get(target, target)
        if owner in filler and filler[owner] != target:
            plan.tied[target] = filler[owner]
            sources = (pairs.get(target), pairs[filler[owner]])
            if sources[0] is not None and src.ties.get(sources[0], sources[0]) != \
                    src.ties.get(sources[1], sources[1]):
                plan.unused[pairs[target]] = (f"'{target}' is tied to '{filler[owner]}' in the "
                                              f"model, filled from '{pairs[filler[owner]]}'")
                plan.warnings.append(f"'{target}' and '{filler[owner]}' are one tensor in the "
                                     f"model but two in the checkpoint; '{pairs[filler[owner]]}' "
                                     "was used")
        elif target in pairs:
            source = pairs[target]
            _decide(target, source, how[target], src.tensors[source], dst.tensors[target],
                    layouts, plan, dst, adapt=adapt, init=init, label_map=label_map,
                    derived=derived)
        elif target in ambiguous:
            plan.missing[target] = ambiguous[target]
        elif is_bookkeeping(target):
            plan.missing[target] = ("a bookkeeping buffer the checkpoint lacks; left as it is "
                                    "(never fails a graft)")
        else:
            tried = {"auto": "by name or by structure", "name": "by name",
                     "structure": "by structure"}[match]
            plan.missing[target] = f"no checkpoint tensor matches it {tried}"
    dequantized = [s.target for s in plan.steps if any(isinstance(o, Dequantize) for o in s.ops)]
    if dequantized:
        plan.warnings.append(
            f"{len(dequantized)} tensors ('{dequantized[0]}'...) were stored quantized and were "
            "dequantized: they hold the quantized approximation of the float weights")
    used = {step.source for step in plan.steps}
    for key in [*plan.tied]:
        if plan.tied[key] in plan.missing:
            plan.missing[key] = f"tied to '{plan.tied.pop(key)}', which is missing"
    used |= {src.ties.get(source, source) for source in used}
    for source in renamed:
        if src.ties.get(source, source) in used:
            continue
        if source not in used and source not in plan.unused:
            plan.unused[source] = "not in the model"
    return plan
