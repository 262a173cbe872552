"""Compare a graft's outputs with its reference; where they diverge, settle the guesses there.

When outputs differ, the first diverging unit (the module, in call order, whose activation
differs from the reference module that filled it) is where a guess went wrong. Each hypothesis
of that unit (two same-shape sibling modules swapped, one per alternative the plan listed for
its guessed keys) is tried on the model in place: the one that makes the unit agree is kept
and reported, the others undone. Then outputs are compared again, until they agree or no
hypothesis helps. Outputs that agree make every key ``verified``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from .adapt import RotaryPermute
from .plan import Plan
from .reference import Reference
from .report import GraftReport
from .sides import state_tensors
from .verify import Run, Verification, compare, differ, run_recorded

__all__ = ["Hypothesis", "hypotheses", "verify_graft"]

#: At most this many diverging units are settled in one graft.
MAX_UNITS = 64


@dataclass(frozen=True)
class Hypothesis:
    """Another way to fill a unit: target keys exchanged in pairs, rows permuted.

    Attributes:
        name: Shown in the report.
        swaps: Pairs of target keys whose values (and sources) are exchanged.
        permutes: Target keys whose rows are reordered (rotary order), with the reordering.
    """

    name: str
    swaps: tuple[tuple[str, str], ...] = ()
    permutes: tuple[tuple[str, RotaryPermute], ...] = ()

    def apply(self, state: dict[str, torch.Tensor], report: GraftReport, *,
              undo: bool = False) -> None:
        """Change the model in place as the hypothesis says (or change it back)."""
        with torch.no_grad():
            for first, second in self.swaps:
                held = state[first].detach().clone()
                state[first].copy_(state[second])
                state[second].copy_(held)
                report.mapping[first], report.mapping[second] = (report.mapping[second],
                                                                 report.mapping[first])
            for key, permute in self.permutes:
                way = RotaryPermute(permute.head_dim, permute.to_meta != undo)
                state[key].copy_(way.apply(state[key].detach().clone(), state[key]))


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _scopes(unit: str) -> list[str]:
    """The unit, its parent and grandparent: a guess upstream shows in a sibling's output."""
    scopes = [unit]
    while len(scopes) < 3 and scopes[-1]:
        scopes.append(_module(scopes[-1]))
    return scopes


def _within(key: str, scope: str) -> bool:
    return not scope or key.startswith(scope + ".")


def hypotheses(report: GraftReport, unit: str, head_dims: Iterable[int] = ()) -> list[Hypothesis]:
    """The hypotheses of a diverging unit, nearest guesses first.

    Guesses in the unit come first, then those in its parent and grandparent (a wrong q or k
    shows in the attention output, not in its own). For a guessed module, each alternative
    module swapped with it (every tensor with its namesake); for guessed rotary rows, the q
    and k weights in the scope permuted into the other rotary order (for each head size
    given).

    Args:
        report: The graft's report (its guesses and mapping).
        unit: The target module path where outputs first diverge.
        head_dims: Head sizes to try for rotary permutations.

    Returns:
        The hypotheses, each once.
    """
    found: dict[str, Hypothesis] = {}
    for scope in _scopes(unit):
        guessed = [k for k in report.guesses if _within(k, scope)]
        for hypothesis in [*_swaps(report, guessed), *_rotary(report, guessed, head_dims)]:
            found.setdefault(hypothesis.name, hypothesis)
    return list(found.values())


def _swaps(report: GraftReport, guessed: list[str]) -> list[Hypothesis]:
    filled_from = {source: target for target, source in report.mapping.items()}
    found = []
    for key in guessed:
        module = _module(key)
        for alternative in report.guesses[key].alternatives:
            other = filled_from.get(alternative)
            if other is None or _module(other) == module:
                continue
            first, second = sorted((module, _module(other)))
            leaves = {k.rpartition(".")[2] for k in report.loaded if _module(k) == first}
            swaps = tuple((f"{first}.{leaf}", f"{second}.{leaf}") for leaf in sorted(leaves)
                          if f"{second}.{leaf}" in report.mapping)
            if swaps:
                found.append(Hypothesis(f"'{first}' and '{second}' swapped", swaps))
    return found


_ROTARY_ALTERNATIVE = "(rotary rows permuted)"


def _rotary(report: GraftReport, guessed: list[str], head_dims: Iterable[int]) -> list[Hypothesis]:
    rows = tuple(k for k in guessed if k.endswith(".weight") and any(
        a.endswith(_ROTARY_ALTERNATIVE) for a in report.guesses[k].alternatives))
    if not rows:
        return []
    where = _module(_module(rows[0])) or "the model"
    return [Hypothesis(f"rotary rows of {', '.join(repr(k) for k in rows)} permuted ("
                       f"{'transformers -> Meta' if to_meta else 'Meta -> transformers'} order, "
                       f"head_dim {head_dim}) in '{where}'",
                       permutes=tuple((k, RotaryPermute(head_dim, to_meta)) for k in rows))
            for head_dim in dict.fromkeys(head_dims) for to_meta in (True, False)]


def _agrees(source: Run, target: nn.Module, reference: Reference, unit: tuple[str, str],
            rtol: float) -> bool:
    seen = run_recorded(target, reference.target_call).seen
    path, source_path = unit
    return path in seen and differ(source.seen[source_path], seen[path], rtol) is None


def _settle(report: GraftReport, target: nn.Module, reference: Reference, source: Run,
            unit: tuple[str, str], rtol: float, tried: set[str]) -> Hypothesis | None:
    state = state_tensors(target)
    for hypothesis in hypotheses(report, unit[0], _head_dims(target, reference.module)):
        if hypothesis.name in tried:
            continue
        tried.add(hypothesis.name)
        hypothesis.apply(state, report)
        if _agrees(source, target, reference, unit, rtol):
            return hypothesis
        hypothesis.apply(state, report, undo=True)
    return None


_HEAD_DIM_NAMES = ("head_dim", "head_size", "hidden_size_per_attention_head")


def _head_dims(*models: nn.Module) -> list[int]:
    """Head sizes the models say: their modules' attributes and their configs."""
    found: list[int] = []
    for model in models:
        config = getattr(model, "config", None)
        hidden, heads = (getattr(config, "hidden_size", None),
                         getattr(config, "num_attention_heads", None))
        if isinstance(hidden, int) and isinstance(heads, int) and heads:
            found.append(hidden // heads)
        for module in model.modules():
            found += [v for v in (getattr(module, n, None) for n in _HEAD_DIM_NAMES)
                      if isinstance(v, int) and v > 1]
    return list(dict.fromkeys(found))


def _module_map(plan: Plan, names: dict[str, str]) -> dict[str, str]:
    """Target module to reference module, for modules whose rows are in the same order."""
    return {_module(s.target): _module(names.get(s.source, s.source)) for s in plan.steps
            if not any(isinstance(op, RotaryPermute) for op in s.ops)}


def verify_graft(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference, *,
                 rtol: float = 1e-4) -> None:
    """Compare outputs, settle guesses where they diverge, and record the outcome.

    Args:
        report: The graft's report: its evidence, divergence and mapping are updated.
        plan: The executed plan.
        target: The grafted model (changed in place when a hypothesis is kept).
        reference: What to compare with.
        rtol: Tolerance relative to the reference output's largest magnitude.
    """
    module_map = _module_map(plan, reference.names)
    source = run_recorded(reference.module, reference.source_call)
    result = compare(source, target, None, reference.target_call, module_map=module_map,
                     rtol=rtol)
    kept: list[str] = []
    tried: set[str] = set()
    while result.divergence is not None and result.unit is not None and len(kept) < MAX_UNITS:
        hypothesis = _settle(report, target, reference, source, result.unit, rtol, tried)
        if hypothesis is None:
            break
        kept.append(hypothesis.name)
        for key, _permute in hypothesis.permutes:  # rows reordered: no longer comparable
            module_map.pop(_module(key), None)
        result = compare(source, target, None, reference.target_call, module_map=module_map,
                         rtol=rtol)
    _record(report, result, reference, kept)


def _record(report: GraftReport, result: Verification, reference: Reference,
            kept: Iterable[str]) -> None:
    report.max_abs_diff = result.max_abs_diff
    report.verified_with = reference.origin
    report.settled = list(kept)
    if result.divergence is not None:
        report.divergence = (f"{result.divergence}; outputs differ by "
                             f"{result.max_abs_diff:.3g} (tolerance {result.tolerance:.3g}) "
                             f"from {reference.origin}'s")
    else:
        report.mark_verified()
