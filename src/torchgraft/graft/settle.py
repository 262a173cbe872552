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
    """Another way to fill a unit: target keys whose values are exchanged, pair by pair.

    Attributes:
        name: Shown in the report.
        swaps: Pairs of target keys.
    """

    name: str
    swaps: tuple[tuple[str, str], ...]

    def apply(self, state: dict[str, torch.Tensor], report: GraftReport) -> None:
        """Exchange the values (and the report's sources) of each pair.

        Applying it again undoes it.
        """
        with torch.no_grad():
            for first, second in self.swaps:
                held = state[first].detach().clone()
                state[first].copy_(state[second])
                state[second].copy_(held)
                report.mapping[first], report.mapping[second] = (report.mapping[second],
                                                                 report.mapping[first])


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def hypotheses(report: GraftReport, unit: str) -> list[Hypothesis]:
    """The hypotheses of a unit: for each guessed key in it, each alternative source module.

    Args:
        report: The graft's report (its guesses and mapping).
        unit: The target module path where outputs first diverge.

    Returns:
        Module swaps: every tensor of the unit's module with its namesake in the module
        filled from the alternative, where both were loaded with the same shapes.
    """
    filled_from = {source: target for target, source in report.mapping.items()}
    found: dict[frozenset[str], Hypothesis] = {}
    for key, guess in report.guesses.items():
        module = _module(key)
        if unit and module != unit and not module.startswith(unit + "."):
            continue
        for alternative in guess.alternatives:
            other = filled_from.get(alternative)
            if other is None or _module(other) == module:
                continue
            pair = frozenset((module, _module(other)))
            if pair not in found:
                swaps = _namesakes(report, module, _module(other))
                if swaps:
                    found[pair] = Hypothesis(f"'{module}' and '{_module(other)}' swapped", swaps)
    return list(found.values())


def _namesakes(report: GraftReport, first: str, second: str) -> tuple[tuple[str, str], ...]:
    leaves = {k.rpartition(".")[2] for k in report.loaded if _module(k) == first}
    return tuple((f"{first}.{leaf}", f"{second}.{leaf}") for leaf in sorted(leaves)
                 if f"{second}.{leaf}" in report.mapping)


def _agrees(source: Run, target: nn.Module, reference: Reference, unit: tuple[str, str],
            rtol: float) -> bool:
    seen = run_recorded(target, reference.target_call).seen
    path, source_path = unit
    return path in seen and differ(source.seen[source_path], seen[path], rtol) is None


def _settle(report: GraftReport, target: nn.Module, reference: Reference, source: Run,
            unit: tuple[str, str], rtol: float, tried: set[str]) -> Hypothesis | None:
    state = state_tensors(target)
    for hypothesis in hypotheses(report, unit[0]):
        if hypothesis.name in tried:
            continue
        tried.add(hypothesis.name)
        hypothesis.apply(state, report)
        if _agrees(source, target, reference, unit, rtol):
            return hypothesis
        hypothesis.apply(state, report)
    return None


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
        result = compare(source, target, None, reference.target_call, module_map=module_map,
                         rtol=rtol)
    _record(report, result, reference, kept)


def _record(report: GraftReport, result: Verification, reference: Reference,
            kept: Iterable[str]) -> None:
    report.max_abs_diff = result.max_abs_diff
    settled = list(kept)
    if settled:
        report.warnings.append(f"outputs compared with {reference.origin} settled the guesses: "
                               + "; ".join(settled))
    if result.divergence is not None:
        report.divergence = (f"{result.divergence} (compared with {reference.origin}); outputs "
                             f"differ by {result.max_abs_diff:.3g} (tolerance "
                             f"{result.tolerance:.3g})")
    else:
        report.mark_verified()
