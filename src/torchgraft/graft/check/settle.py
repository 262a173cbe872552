"""Compare a graft's outputs with its reference; where they diverge, settle the guesses there.

When outputs differ, the first diverging unit (the module, in call order, whose activation
differs from the reference module that filled it) is where a guess went wrong. Each hypothesis
of that unit (two same-shape sibling modules swapped, one per alternative the plan listed for
its guessed keys) is tried on the model in place: the one that makes the unit agree is kept
and reported, the others undone. Then outputs are compared again, until they agree or no
hypothesis helps. Outputs that agree make every key ``verified``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..evidence import ROTARY_ALTERNATIVE, Evidence
from ..layouts.glu import PARTS_REORDERED
from ..layouts.ops import RotaryRows
from ..plan.adapt import reversible
from ..plan.steps import Plan
from ..report.report import GraftReport
from ..sides.heads import model_heads
from ..sides.model import state_tensors
from .compare import Run, Verification, compare, differ, run_recorded
from .reference import Reference

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
        halves: Target keys whose two halves of rows are exchanged (a fused gated
            projection's gate and up).
    """

    name: str
    swaps: tuple[tuple[str, str], ...] = ()
    permutes: tuple[tuple[str, RotaryRows], ...] = ()
    halves: tuple[str, ...] = ()

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
                way = permute.inverse([tuple(state[key].shape)]) if undo else permute
                state[key].copy_(way.apply([state[key].detach().clone()])[0])
            for key in self.halves:  # its own inverse
                top, bottom = state[key].detach().clone().chunk(2)
                state[key].copy_(torch.cat([bottom, top]))


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _scopes(unit: str) -> list[str]:
    """The unit and its parent: a wrong q or k shows in a sibling's output (attention's)."""
    return [unit, _module(unit)] if unit else [unit]


def _within(key: str, scope: str) -> bool:
    return not scope or key.startswith(scope + ".")


def hypotheses(report: GraftReport, unit: str, head_dims: Iterable[int] = (),
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Hypothesis]:
    """The hypotheses of a diverging unit, nearest guesses first.

    Guesses in the unit come first, then those in its parent (a wrong q or k
    shows in the attention output, not in its own). For a guessed module, each alternative
    module swapped with it (every tensor with its namesake); for guessed rotary rows, the q
    and k weights in the scope permuted into the other rotary order (for each head size
    given). Last, where ``shapes`` are given, the unit swapped with each module of the same
    tensors and shapes that structure matched (nearest first, at most
    :data:`MAX_LOOKALIKES`): structure can be wrong where names say nothing.

    Args:
        report: The graft's report (its guesses, evidence and mapping).
        unit: The target module path where outputs first diverge.
        head_dims: Head sizes to try for rotary permutations.
        shapes: Target key to shape, for swaps with same-shape modules.

    Returns:
        The hypotheses, each once.
    """
    found: dict[str, Hypothesis] = {}
    for scope in _scopes(unit):
        guessed = [k for k in report.guesses if _within(k, scope)]
        for hypothesis in [*_swaps(report, guessed), *_rotary(report, guessed, head_dims),
                           *_halves(report, guessed)]:
            found.setdefault(hypothesis.name, hypothesis)
    for hypothesis in _lookalikes(report, unit, shapes or {}):
        found.setdefault(hypothesis.name, hypothesis)
    return list(found.values())


#: At most this many same-shape modules are tried against a diverging unit.
MAX_LOOKALIKES = 16


def _signature(report: GraftReport, module: str,
               shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A module's loaded tensors (leaf, shape), if none is known by name; else empty."""
    keys = [k for k in report.loaded if _module(k) == module]
    if not keys or any(report.evidence.get(k) is Evidence.NAME or k not in shapes
                       for k in keys):
        return ()
    return tuple(sorted((k.rpartition(".")[2], shapes[k]) for k in keys))


def _lookalikes(report: GraftReport, unit: str,
                shapes: Mapping[str, tuple[int, ...]]) -> list[Hypothesis]:
    signature = _signature(report, unit, shapes)
    if not signature:
        return []
    others = {_module(k) for k in report.loaded} - {unit}
    alike = [m for m in others if _signature(report, m, shapes) == signature]
    alike.sort(key=lambda m: -len(os.path.commonpath([m.replace(".", "/"),
                                                      unit.replace(".", "/")])))
    return [Hypothesis(f"'{unit}' and '{other}' swapped (same shapes, matched by structure)",
                       tuple((f"{unit}.{leaf}", f"{other}.{leaf}") for leaf, _ in signature))
            for other in alike[:MAX_LOOKALIKES]]


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


def _rotary(report: GraftReport, guessed: list[str], head_dims: Iterable[int]) -> list[Hypothesis]:
    """For guessed rotary rows, the q and k weights and biases in the other rotary order.

    A fused ``[Q; K; V]`` keeps its V rows: the rows the graft reordered are the ones tried.
    """
    rows = tuple(k for k in guessed if k.endswith((".weight", ".bias")) and any(
        a.endswith(ROTARY_ALTERNATIVE) for a in report.guesses[k].alternatives))
    if not rows:
        return []
    reordered = {step.target: rotary.rows for step in report.plan.steps for op in step.ops
                 if isinstance(rotary := reversible(op), RotaryRows)} \
        if report.plan is not None else {}
    where = _module(_module(rows[0])) or "the model"
    return [Hypothesis(f"rotary rows of {', '.join(repr(k) for k in rows)} permuted ("
                       f"{'Meta -> transformers' if to_halves else 'transformers -> Meta'} order, "
                       f"head_dim {head_dim}) in '{where}'",
                       permutes=tuple((k, RotaryRows(head_dim, to_halves, reordered.get(k)))
                                      for k in rows))
            for head_dim in dict.fromkeys(head_dims) for to_halves in (False, True)]


def _halves(report: GraftReport, guessed: list[str]) -> list[Hypothesis]:
    """For a fused tensor whose parts' order was guessed, the parts the other way round."""
    return [Hypothesis(f"halves of '{key}' exchanged", halves=(key,)) for key in guessed
            if any(a.endswith(PARTS_REORDERED) for a in report.guesses[key].alternatives)]


def _agrees(source: Run, target: nn.Module, reference: Reference, unit: str,
            module_map: Mapping[str, str], rtol: float) -> bool:
    """Whether the unit's activation agrees with its (possibly new) reference module's."""
    seen = run_recorded(target, reference.target_call).seen
    source_path = module_map.get(unit)
    return (unit in seen and source_path in source.seen
            and differ(source.seen[source_path], seen[unit], rtol) is None)


def _settle(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference,
            source: Run, unit: str, rtol: float, tried: set[str]) -> Hypothesis | None:
    state = state_tensors(target)
    shapes = {key: tuple(tensor.shape) for key, tensor in state.items()}
    for hypothesis in hypotheses(report, unit, _head_dims(target, reference.module), shapes):
        if hypothesis.name in tried:
            continue
        tried.add(hypothesis.name)
        hypothesis.apply(state, report)
        if _agrees(source, target, reference, unit, _module_map(report, plan, reference.names),
                   rtol):
            return hypothesis
        hypothesis.apply(state, report, undo=True)
    return None


def _head_dims(*models: nn.Module) -> list[int]:
    """Head sizes the models say: their configs' width per head, their modules' head sizes."""
    found: list[int] = []
    for model in models:
        config = getattr(model, "config", None)
        hidden, heads = (getattr(config, "hidden_size", None),
                         getattr(config, "num_attention_heads", None))
        if isinstance(hidden, int) and isinstance(heads, int) and heads:
            found.append(hidden // heads)
        found += sorted(v for v in model_heads(model)[0].get("head size", ()) if v > 1)
    return list(dict.fromkeys(found))


def _module_map(report: GraftReport, plan: Plan, names: dict[str, str],
                reordered: Iterable[str] = ()) -> dict[str, str]:
    """Target module to the reference module that filled it, as the report's mapping says now.

    Modules whose rows were reordered (rotary) are left out: their activations differ in order.
    """
    permuted = {_module(s.target) for s in plan.steps
                if any(isinstance(reversible(op), RotaryRows) for op in s.ops)} | set(reordered)
    found = {_module(key): _module(names.get(source, source))
             for key, source in report.mapping.items()}
    return {k: v for k, v in found.items() if k not in permuted}


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
    source = run_recorded(reference.module, reference.source_call)
    result = compare(source, target, None, reference.target_call,
                     module_map=_module_map(report, plan, reference.names), rtol=rtol)
    kept: list[Hypothesis] = []
    tried: set[str] = set()
    while result.divergence is not None and result.unit is not None and len(kept) < MAX_UNITS:
        hypothesis = _settle(report, plan, target, reference, source, result.unit[0], rtol,
                             tried)
        if hypothesis is None:
            break
        kept.append(hypothesis)
        reordered = [_module(key) for h in kept
                     for key in (*(k for k, _permute in h.permutes), *h.halves)]
        result = compare(source, target, None, reference.target_call,
                         module_map=_module_map(report, plan, reference.names, reordered),
                         rtol=rtol)
    _record(report, result, reference, [h.name for h in kept])


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
