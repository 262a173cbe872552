"""The passes of planning, in order: each a small function over the planning state.

:data:`PASSES` lists them in the order they run. Each pairs what the ones before left, or
decides what pairs need:

1. ``renames``: the user's rules, then the layouts' renames (or a rule drops the key);
2. ``exact``: the same (renamed) name;
3. ``wrappers``: the same name once wrapper prefixes (``module.``, ``_orig_mod.``...) are
   removed on either side;
4. ``prefixes``: the same name under a prefix one side adds (``backbone.``);
5. ``structure``: units, roles and shapes (:mod:`~torchgraft.graft.plan.structure`), each pair with
   its evidence (``structure`` or ``guess``);
5b. ``infer``: in the scopes those pairs align, modules whose rows add up to another's are
   fused or split (:mod:`~torchgraft.graft.plan.infer`); ``stacks``: experts stacked on one
   side, kept apart on the other (:mod:`~torchgraft.graft.plan.stacks`); then structure again
   on what is left;
5c. ``copies``: a value one side keeps once and the other once per block
   (:mod:`~torchgraft.graft.plan.copies`);
5d. ``assemble``: a module whose tensors the other side keeps in two places, by their roles
   (:mod:`~torchgraft.graft.plan.assemble`);
6. ``rotary``: structure pairs of q and k between a rotary family and an unknown one are
   guesses (their row order is not known);
7. ``ties``: a target tied to another is filled once, through it;
8. ``transforms``: what each pair needs (transposes, rotary rows, casts, adaptations), or why
   it cannot be filled (:mod:`~torchgraft.graft.plan.transforms`);
9. ``leftovers``: missing and unused keys, each with its reason; blocks of the checkpoint that
   the model lacks (``surplus``);
10. ``assumptions``: a graft across code bases (a key paired by structure, or through another
    code base's layout) relies on facts a bare state dict cannot confirm: the model's attention
    head count, unless the source states the same; which same-shape sibling is which, where
    only the names' conventions told them apart.

Verification (outputs compared after the graft) runs in :func:`torchgraft.graft.graft`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from ...renames import rename
from ...wrappers import strip_wrappers
from ..evidence import (
    COMPARE,
    SIBLINGS,
    Assumption,
    Caution,
    Evidence,
    Guess,
    MatchStep,
    rotary_alternatives,
)
from ..layouts import ops
from ..layouts.catalogue import rotary_warning
from ..layouts.conventions import role_of
from ..sides.heads import head_assumption, head_size_mismatch
from ..tensors import Side
from .adapt import reversible
from .assemble import assemble
from .copies import copies
from .infer import infer
from .stacks import stacks
from .state import PassState, renamed_info
from .steps import Match, Plan, is_bookkeeping
from .structure import Alignment, align
from .transforms import decide, fits_for, takes

__all__ = ["KEPT_VALUES", "PASSES", "computed_assumption", "run_passes"]


def _pair_by(targets: dict[str, str], sources: dict[str, str]) -> dict[str, str]:
    """Pair target and source keys whose transformed names are equal and unique."""
    by_name: dict[str, str] = {}
    shared: set[str] = set()  # names several sources have: no pair
    for source, name in sources.items():
        if by_name.setdefault(name, source) != source:
            shared.add(name)
    return {t: by_name[name] for t, name in targets.items()
            if name in by_name and name not in shared}


def _common_prefixes(targets: list[str], sources: list[str]) -> dict[str, str]:
    """Pair keys that match once one side's extra prefix (``backbone.``...) is removed.

    Each dotted suffix of each name is looked up once in the other side's names, so the cost
    is linear in the names' total length; the prefix shared by most names is tried first. A
    prefix is a wrapper only of a whole subtree: the keys under it that found a partner are
    (nearly) all the keys under it, over more than one module, or all of them. One key that
    loses a prefix and happens to meet another module's name (``a.b.norm`` and ``norm``) is
    no wrapper.
    """
    groups: dict[tuple[str, str], dict[str, str]] = {}  # (side, prefix) -> {name: rest}
    under: dict[tuple[str, str], int] = {}  # (side, prefix) -> keys of the side under it
    for side, names, others in (("source", sources, set(targets)),
                                ("target", targets, set(sources))):
        for name in names:
            for k, char in enumerate(name):
                if char == ".":
                    key = (side, name[:k + 1])
                    under[key] = under.get(key, 0) + 1
                    if name[k + 1:] in others:
                        groups.setdefault(key, {})[name] = name[k + 1:]
    pairs: dict[str, str] = {}
    taken: set[str] = set()
    for key, found in sorted(groups.items(), key=lambda item: -len(item[1])):
        if not _wraps(found, under[key]):
            continue
        for name, rest in found.items():
            target, source = (rest, name) if key[0] == "source" else (name, rest)
            if target not in pairs and source not in taken:
                pairs[target] = source
                taken.add(source)
    return pairs


#: A prefix wraps a subtree with additions when this share of its keys found partners.
_WRAPPED_SHARE = 0.9


def _wraps(found: dict[str, str], under: int) -> bool:
    """Whether keys that found partners once a prefix is removed make it a wrapper.

    All the keys under the prefix did; or nearly all did, over more than one module (a
    wrapped backbone with a module of its own added).
    """
    if len(found) == under:
        return True
    modules = {name.rpartition(".")[0] for name in found}
    return len(found) >= _WRAPPED_SHARE * under and len(modules) > 1


def renames(state: PassState) -> None:
    """The user's rules, then the layouts' renames; a rule may drop a key."""
    layout_rules = [rule for layout in state.layouts for rule in layout.renames]
    across = {id(rule) for layout in state.layouts if layout.across for rule in layout.renames}
    for name in state.src.tensors:
        new, rule = rename(name, state.rules)
        if new is None:
            state.plan.unused[name] = f"dropped by rule {rule}"
            continue
        laid_out, layout_rule = rename(new, layout_rules)
        state.renamed[name] = laid_out or new
        state.how_renamed[name] = (MatchStep.RULE if rule or name in state.ruled else
                                   MatchStep.LAYOUT if layout_rule else MatchStep.EXACT)
        if id(layout_rule) in across:
            state.across.add(name)


def exact(state: PassState) -> None:
    """The same name, after the renames."""
    state.take(_pair_by({t: t for t in state.dst.tensors}, state.renamed), None)


def wrappers(state: PassState) -> None:
    """The same name once each side's wrapper prefixes are removed."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    stripped_t = strip_wrappers(state.dst.tensors)[1]
    stripped_s = strip_wrappers(state.renamed.values())[1]
    state.take(_pair_by({t: stripped_t[t] for t in left_t},
                        {s: stripped_s[state.renamed[s]] for s in left_s}), MatchStep.WRAPPER)


def prefixes(state: PassState) -> None:
    """The same name under a prefix that one side adds."""
    left_t, left_s = state.left()
    if not left_t or not left_s:
        return
    stripped_t = strip_wrappers(state.dst.tensors)[1]
    stripped_s = strip_wrappers(state.renamed.values())[1]
    by_stripped = {stripped_s[state.renamed[s]]: s for s in left_s}
    prefixed = _common_prefixes([stripped_t[t] for t in left_t], list(by_stripped))
    to_target = {stripped_t[t]: t for t in left_t}
    state.take({to_target[t]: source for t, s in prefixed.items()
                if takes(state.options, renamed_info(state.src.tensors[source := by_stripped[s]],
                                                      state.renamed[source]),
                         state.dst.tensors[to_target[t]])}, MatchStep.PREFIX)


def structure(state: PassState) -> None:
    """What is left, aligned by units, roles and shapes; each pair with its evidence.

    Modules first; then what that leaves, with each bare parameter on its own (one code
    base's ``q_bias`` beside its ``qkv`` is another's ``q_proj.bias``).
    """
    _align(state, bare_apart=False)
    if state.ambiguous or state.left()[0]:
        _align(state, bare_apart=True)


def _align(state: PassState, *, bare_apart: bool) -> None:
    """One alignment of what is left (see :func:`structure`)."""
    if state.all_paired:
        return  # the common case: no sets of 100k keys to build
    src, dst, pairs = state.src, state.dst, state.pairs
    filled = {dst.ties.get(t, t) for t in pairs}
    left = {t for t in dst.tensors if t not in pairs and dst.ties.get(t, t) not in filled}
    if not left:
        return  # nothing to align: neither side's order (a forward on meta, a sort) asked
    left_t = [t for t in dst.order if t in left]
    left_s = [s for s in src.order if s in state.renamed and s not in state.paired]
    back = {state.renamed[s]: s for s in left_s}
    src_infos = {state.renamed[s]: renamed_info(src.tensors[s], state.renamed[s])
                 for s in left_s}
    alignment = align(left_t, list(back), dst.tensors, src_infos, fits_for(state.layouts),
                      is_bookkeeping, source_ordered=src.ordered,
                      trust_conventions=state.described.source_is_module,
                      bare_apart=bare_apart,
                      before={t: state.renamed.get(s, s) for t, s in pairs.items()},
                      source_numbers={state.renamed[s]: src.numbers[s] for s in left_s
                                      if s in src.numbers})
    state.ambiguous = alignment.ambiguous
    state.take({t: back[s] for t, s in alignment.pairs.items()}, MatchStep.STRUCTURE)
    _keep_guesses(state, alignment, back)


def _keep_guesses(state: PassState, alignment: Alignment, back: dict[str, str]) -> None:
    """The alignment's guesses, in the plan; an alternative tied to the choice is none."""
    src, pairs = state.src, state.pairs
    owner = {name: src.ties.get(back[name], back[name]) for name in back}
    for target, guess in alignment.guesses.items():
        if state.how.get(target) != MatchStep.STRUCTURE:
            continue
        chosen = src.ties.get(pairs[target], pairs[target])
        others = tuple(a for a in guess.alternatives if owner.get(a, a) != chosen)
        if others or not guess.alternatives:
            state.plan.guesses[target] = replace(guess, alternatives=others)
            if target in alignment.by_convention:
                state.by_convention.add(target)


#: Roles whose rows a rotary (RoPE) layout may store in another order.
_ROTARY_ROLES = frozenset({"q", "k", "qkv"})


def rotary(state: PassState) -> None:
    """Structure pairs of q and k between a rotary family and an unknown one are guesses."""
    structural = [t for t in state.pairs if state.how[t] == MatchStep.STRUCTURE]
    warning = rotary_warning(state.src, state.dst) if structural else None
    if not warning:
        return
    plan, pairs = state.plan, state.pairs
    plan.warnings.append(Caution(warning))  # equal outputs settle it
    why = ("one side is a rotary (RoPE) family and the other is not known: the rows may be in "
           "the other rotary order")
    for target in structural:
        if role_of(target.rpartition(".")[0]) not in _ROTARY_ROLES:
            continue
        known = plan.guesses.get(target)  # a sibling guess too: both are tried
        plan.guesses[target] = Guess(rotary_alternatives(pairs[target]), why) if known is None \
            else replace(known, alternatives=(*known.alternatives,
                                              *rotary_alternatives(pairs[target])),
                         why=f"{known.why}; {why}")


def ties(state: PassState) -> None:
    """A target tied to another is filled once, through the first of its names paired."""
    dst, src, pairs, plan = state.dst, state.src, state.pairs, state.plan
    filler: dict[str, str] = {}
    for target in dst.tensors:
        owner = dst.ties.get(target, target)
        if target in pairs and owner not in filler:
            filler[owner] = target
    for target in dst.tensors:
        owner = dst.ties.get(target, target)
        if owner not in filler or filler[owner] == target:
            continue
        plan.tied[target] = filler[owner]
        source, used = pairs.get(target), pairs[filler[owner]]
        if source is not None and src.ties.get(source, source) != src.ties.get(used, used):
            plan.apart[source] = filler[owner]
            plan.unused[source] = (f"'{target}' is tied to '{filler[owner]}' in the model, "
                                   f"filled from '{used}'")
            plan.warnings.append(f"'{target}' and '{filler[owner]}' are one tensor in the model "
                                 f"but two in the checkpoint; '{used}' was used")


def transforms(state: PassState) -> None:
    """What each pair needs on the way, or why it cannot be filled."""
    options = replace(state.options, derived={**state.options.derived, **state.inferred}) \
        if state.inferred else state.options
    for target in state.dst.tensors:
        source = state.pairs.get(target)
        if source is not None and target not in state.plan.tied:
            mismatch = head_size_mismatch(target, source, state.src, state.dst)
            if mismatch is not None:
                state.plan.missing[target] = mismatch
                state.plan.unused[source] = f"its attention heads do not fit '{target}'"
                continue
            decide(state.plan, target, source, state.how[target], state.src.tensors[source],
                   options)


_TRIED = {"auto": "by name or by structure", "name": "by name", "structure": "by structure"}
_DIGITS = re.compile(r"\d+")


def leftovers(state: PassState) -> None:
    """Missing and unused keys with their reasons; blocks the model lacks are surplus."""
    plan = state.plan
    for target in state.dst.tensors:
        if target in state.pairs or target in plan.tied:
            continue
        if target in state.ambiguous:
            plan.missing[target] = state.ambiguous[target]
        elif is_bookkeeping(target):
            plan.missing[target] = ("a bookkeeping buffer the checkpoint lacks; left as it is "
                                    "(never fails a graft)")
        elif _computed(state, target):
            plan.initialised[target] = _COMPUTED
        else:
            plan.missing[target] = f"no checkpoint tensor matches it {_TRIED[state.match]}"
            plan.unmatched.append(target)
    if plan.initialised:
        plan.assumptions.append(computed_assumption(list(plan.initialised)))
    for key in [*plan.tied]:
        if plan.tied[key] in plan.missing:
            plan.missing[key] = f"tied to '{plan.tied.pop(key)}', which is missing"
    ties_of = state.src.ties
    used = {step.source for step in plan.steps}
    used |= {ties_of.get(source, source) for source in used}
    for source in state.renamed:
        if ties_of.get(source, source) not in used and source not in plan.unused:
            plan.unused[source] = "not in the model"
    _surplus(plan, used)


#: Why a buffer the checkpoint lacks keeps the model's value.
_COMPUTED = ("its value as the model was built (a buffer the checkpoint lacks; most are values "
             "of the configuration: rotary frequencies, position tables)")
#: What the assumption of the model's own values for keys the checkpoint lacks is called.
KEPT_VALUES = "value of tensors the checkpoint lacks"
#: How to settle kept buffers.
_COMPUTED_SETTLE = COMPARE
#: A norm's running statistics: learned in training, never a value of the configuration.
_STATISTICS = re.compile(r"(^|\.)running_(mean|var)$")


def _computed(state: PassState, target: str) -> bool:
    """Whether a target key the checkpoint lacks is a buffer the model's code computes.

    A persistent buffer of the model outside a norm (a norm's are statistics learned in
    training): most such buffers are values of the configuration. An assumption, which
    outputs compared settle.
    """
    return (target in state.dst.buffers and state.dst.tensors[target].kind != "norm"
            and not _STATISTICS.search(target))


def computed_assumption(keys: list[str]) -> Assumption:
    """The assumption that the model's values of keys the checkpoint lacks are right."""
    return Assumption(
        KEPT_VALUES,
        f"{len(keys)} kept as the model's code computed them (e.g. '{keys[0]}')",
        "a buffer (or a tensor the model's code computes alike under any seed) is most often a "
        "value of the configuration (rotary frequencies, position tables), which the model's "
        "code computes as the checkpoint's did; a learned one (a codebook) would not be",
        _COMPUTED_SETTLE)


def _surplus(plan: Plan, used: set[str]) -> None:
    """Unused keys of numbered blocks whose like were used: the checkpoint is deeper."""
    numbered = [source for source, reason in plan.unused.items()
                if reason == "not in the model" and not is_bookkeeping(source)
                and _DIGITS.search(source)]
    shapes = {_DIGITS.sub("#", source) for source in used} if numbered else set()
    for source in numbered:
        if _DIGITS.sub("#", source) in shapes:
            plan.surplus[source] = (
                "the checkpoint has more blocks than the model: this block's like were "
                "loaded, it was not (another configuration, or blocks dropped on purpose: a "
                "rule that drops them says so)")


#: Operations that only a layout between two code bases needs.
_LAYOUT_OPS = (ops.Transpose, ops.Permute, ops.RotaryRows)
#: What the assumption of a naming family's rotary order is called, and how to settle it.
ROTARY_ORDER = "rotary row order"
ROTARY_SETTLE = COMPARE  # a wrong order is then found and undone


def _across(state: PassState) -> bool:
    """Whether a key was paired by structure or through another code base's layout."""
    return any(step.matched_by == MatchStep.STRUCTURE or step.source in state.across
               or (step.ops and any(isinstance(reversible(op), _LAYOUT_OPS) for op in step.ops))
               for step in state.plan.steps)


def _has_attention(side: Side) -> bool:
    """Whether a side has attention: a module of a query, key or value role."""
    modules = {info.module for info in side.tensors.values()}
    return any(role_of(m) in _ROTARY_ROLES | {"v"} for m in modules)


def _rotary_order(plan: Plan) -> None:
    """Rows reordered because the naming families say so: an assumption, each key a guess.

    A guess whose alternatives include the rows as stored: where outputs are compared and
    diverge, that order is tried (:mod:`~torchgraft.graft.check.settle`).
    """
    rotary = [(k, step, op) for k, step in enumerate(plan.steps) for op in step.ops
              if isinstance(reversible(op), ops.RotaryRows)]
    if not rotary:
        return
    why = ("names tell the naming family, not the rotary order its code computes with: a code "
           "base may keep a family's names with the other order (torchtune's Phi-3 has "
           "Llama's names and split halves)")
    for k, step, _op in rotary:
        known = plan.guesses.get(step.target)  # a guess already (a head count...): the other
        plan.guesses[step.target] = (  # rotary order is one more alternative to it
            Guess(rotary_alternatives(step.source), why, ROTARY_SETTLE) if known is None else
            replace(known, alternatives=(*known.alternatives,
                                         *rotary_alternatives(step.source))))
        plan.steps[k] = replace(step, evidence=Evidence.GUESS)
    plan.assumptions.append(Assumption(
        ROTARY_ORDER, f"{len(rotary)} keys' rows reordered as the two naming families store "
        f"rotary rows (e.g. '{rotary[0][1].target}': {rotary[0][2].describe()})", why,
        ROTARY_SETTLE))


def assumptions(state: PassState) -> None:
    """Across code bases, what the checkpoint cannot confirm is an assumption."""
    plan = state.plan
    if not _across(state):
        return
    heads = head_assumption(state.described, lambda: _has_attention(state.dst))
    if heads is not None:
        plan.assumptions.append(heads)
    _rotary_order(plan)
    siblings = [s for s in plan.steps if s.target in state.by_convention]
    if siblings:
        plan.assumptions.append(Assumption(
            SIBLINGS,
            f"{len(siblings)} keys paired as their names' conventions say (e.g. "
            f"'{siblings[0].target}' <- '{siblings[0].source}')",
            "the checkpoint is from another code base, and only the two code bases' "
            "conventions told these same-shape modules apart (each guess says which)"))


def _inferred(state: PassState) -> bool:
    """Whether ``infer`` made tensors: what they used may leave others one candidate."""
    return bool(state.inferred)


def _when(*matches: Match) -> Callable[[PassState], bool]:
    return lambda state: state.match in matches


#: The passes, in order: name, function, and when it runs.
PASSES: tuple[tuple[str, Callable[[PassState], None], Callable[[PassState], bool]], ...] = (
    ("renames", renames, _when("auto", "name", "structure")),
    ("exact", exact, _when("auto", "name")),
    ("wrappers", wrappers, _when("auto", "name")),
    ("prefixes", prefixes, _when("auto", "name")),
    ("structure", structure, _when("auto", "structure")),
    ("infer", infer, _when("auto", "structure")),
    ("stacks", stacks, _when("auto", "structure")),
    ("structure", structure, _inferred),
    ("copies", copies, _when("auto", "structure")),
    ("assemble", assemble, _when("auto", "structure")),
    ("rotary", rotary, _when("auto", "structure")),
    ("ties", ties, _when("auto", "name", "structure")),
    ("transforms", transforms, _when("auto", "name", "structure")),
    ("leftovers", leftovers, _when("auto", "name", "structure")),
    ("assumptions", assumptions, _when("auto", "name", "structure")),
)


def run_passes(state: PassState) -> Plan:
    """Run every pass that applies, in order, and return the plan.

    Args:
        state: The planning state.

    Returns:
        The plan.
    """
    for _name, run, applies in PASSES:
        if applies(state):
            run(state)
    return state.plan
