"""Compare a graft's outputs with its reference; where they diverge, search the unit there.

When outputs differ, the first diverging unit (the module, in call order, whose activation
differs from the reference module that filled it) is where the fill went wrong. It is searched
(:mod:`~torchgraft.graft.search`): hypotheses from the vocabulary of layout operations (a fused
tensor's rows in every grouping and order, rotary row orders, same-shape siblings exchanged,
transposes, the plan's guesses' alternatives, and combinations) are tried on the unit alone,
in widening scopes, until its output agrees; the one kept is applied to every unit of its type,
and recorded as the plan's own steps (``report.plan``: what was found runs backwards with
``tg.save(layout_of=)`` and is written as rules by ``report.to_rules()``). Then outputs are
compared again, until they agree or nothing helps. Outputs that agree make every key
``verified``.

Verification never turns a filled graft into an error: a model that fails on the inputs, or
outputs that do not correspond, leave the verdict the file earned, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import torch
from torch import nn

from ...errors import TorchgraftError
from ...logs import IN_REPORT
from ...meta import TensorRef
from ...text import few
from ..evidence import MatchStep
from ..layouts.conventions import unit_of
from ..layouts.ops import RotaryRows
from ..plan.adapt import reversible
from ..plan.steps import Plan, PlanStep, is_bookkeeping
from ..report.report import GraftReport
from ..search.activations import Run, as_call, differ, run_recorded
from ..search.edits import Relayout, Rotate, moved_key
from ..search.pairing import BY_INPUT, Missing, pair_missing
from ..search.unit import MAX_TRIALS, Unit, apply_choice, same_type, search_unit
from ..search.view import FOUND, PlanView
from ..search.vocabulary import Choice, Dimension, Heads, dimensions, heads_of, lookalikes
from ..sides.model import state_tensors
from .compare import NotComparable, Verification, compare
from .reference import Reference

__all__ = ["MAX_UNITS", "verify_graft"]

logger = logging.getLogger("torchgraft")

#: At most this many diverging units are searched in one graft.
MAX_UNITS = 64


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _module_map(steps: Iterable[PlanStep], names: Mapping[str, str],
                reordered: Iterable[str] = ()) -> dict[str, str]:
    """Target module to the reference module that fills it, as the steps say now.

    Modules whose rows are reordered (rotary, a fused layout) are left out: their activations
    differ in order.
    """
    listed = list(steps)
    permuted = {_module(s.target) for s in listed
                if any(isinstance(reversible(op), RotaryRows) for op in s.ops)} | set(reordered)
    found = {_module(s.target): _module(names.get(s.source, s.source)) for s in listed}
    return {k: v for k, v in found.items() if k not in permuted}


#: A scope holds at most this many loaded keys (beyond the first): a unit, not a model.
MAX_SCOPE_KEYS = 64


def _is_block(path: str, modules: Mapping[str, nn.Module]) -> bool:
    """Whether a module is a block: numbered among siblings of its class, holding modules."""
    return len(list(modules[path].children())) > 1 and bool(same_type(path, modules))


def _scopes(watched: str, modules: Mapping[str, nn.Module],
            counts: Mapping[str, int]) -> list[str]:
    """Where to search a diverging module: itself, then each module around it up to its block.

    Scopes widen until the first block (a numbered module among siblings of its class) or
    until they would hold more than :data:`MAX_SCOPE_KEYS` keys; last, the whole model
    (``""``), for what lies outside every block (an embedding and a head exchanged).
    """
    parts = watched.split(".")
    found: list[str] = []
    for k in range(len(parts), 0, -1):
        path = ".".join(parts[:k])
        if path not in modules:
            continue
        if found and counts.get(path, 0) > MAX_SCOPE_KEYS:
            break
        found.append(path)
        if _is_block(path, modules):
            break
    return [*found, ""]


class _Search:
    """What searching the graft's diverging units needs, found once."""

    def __init__(self, report: GraftReport, plan: Plan, target: nn.Module,
                 refs: Mapping[str, TensorRef], heads: Heads) -> None:
        self.report, self.plan, self.target = report, plan, target
        self.view = PlanView.of(plan, refs)
        self.before = dict(self.view.steps)
        self.state = state_tensors(target)
        self.shapes = {key: tuple(t.shape) for key, t in self.state.items()}
        parameters = {id(p) for p in target.parameters()}
        self.buffers = frozenset(k for k, t in self.state.items() if id(t) not in parameters)
        self.heads = heads
        self.modules = dict(target.named_modules())
        self.everywhere: dict[str, list[str]] = {}
        self.counts: dict[str, int] = {}
        self._index(self.view.steps)
        self.settled: list[str] = []
        self.tried: list[str] = []
        self.reordered: set[str] = set()
        self.kept: list[tuple[str, Choice]] = []

    def _index(self, keys: Iterable[str]) -> None:
        """Loaded keys by module, and how many lie under each module."""
        for key in keys:
            self.everywhere.setdefault(_module(key), []).append(key)
            parts = key.split(".")
            for k in range(1, len(parts)):
                prefix = ".".join(parts[:k])
                self.counts[prefix] = self.counts.get(prefix, 0) + 1

    def _ruled(self, keys: Iterable[str]) -> bool:
        """Whether the user's rules named any of these keys (as the user said: never searched)."""
        return any(self.view.steps[k].matched_by == MatchStep.RULE for k in keys)

    def _own_dimensions(self, scope: str) -> list[Dimension]:
        """A scope's decision points: its loaded keys (the whole model's: those outside blocks)."""
        keys = [k for k in self.view.steps if (k.startswith(f"{scope}.") if scope
                                               else not unit_of(_module(k)))]
        return dimensions(keys, self.view, self.shapes, self.heads, self.report.guesses,
                          self.everywhere, self.buffers)

    def unit(self, watched: str, source: Run, reference: Reference) -> Unit:
        """The diverging unit, its scopes' calls captured in one forward pass.

        What it must give is the output of the reference module that fills it, as a
        hypothesis fills it (the module it first paired with where its source is made).
        """
        scopes = _scopes(watched, self.modules, self.counts)
        called = run_recorded(self.target, reference.target_call, capture=scopes).called
        captured = {**called, "": as_call(reference.target_call)}
        keys = self.everywhere.get(watched, [])
        names = reference.names
        first = _fills(keys, self.view.steps, names)

        def expected(steps: Mapping[str, PlanStep]) -> torch.Tensor | None:
            found = _fills(keys, steps, names)
            return source.seen.get(found if found in source.seen else first)

        return Unit(watched, expected, tuple((s, captured[s]) for s in scopes if s in captured))

    def module_map(self, names: Mapping[str, str]) -> dict[str, str]:
        """Target module to the reference module that fills it, as the search has it now."""
        return _module_map(self.view.steps.values(), names, self.reordered)

    def settle(self, unit: Unit, source: Run, reference: Reference, rtol: float) -> bool:
        """Search one unit (what was kept for its type first); spread what it keeps."""
        searched = search_unit(self.target, self.view, self.state, unit,
                               self._dimensions(unit.watched), rtol=rtol, budget=MAX_TRIALS)
        self.view.cache.clear()
        self.tried += [f"'{unit.watched}': {t}" for t in searched.tried]
        if searched.choice is None:
            return False
        choice = searched.choice
        self.reordered |= _reordered(choice)
        self.kept.append((searched.scope, choice))
        spread = self._spread(searched.scope, choice, source, reference, rtol)
        more = f" (and the same in {spread} more units of its type)" if spread else ""
        self.settled.append(f"{choice.describe()}, {FOUND}{more}")
        return True

    def _dimensions(self, watched: str) -> Callable[[str], list[Dimension]]:
        """A scope's decision points, the choices kept for units of its type first.

        The whole model's scope (the last) is what lies outside every block, and the
        watched module exchanged with same-shape modules elsewhere.
        """
        def found(scope: str) -> list[Dimension]:
            earlier = [Choice(tuple(e.moved(block, other) for e in choice.edits))
                       for kept_scope, choice in self.kept
                       for block, other in same_type(kept_scope, self.modules)
                       if scope == moved_key(kept_scope, block, other)]
            usable = [c for c in earlier if all(k in self.view.steps for k in c.keys)]
            elsewhere = lookalikes(watched, self.shapes, self.everywhere) if not scope else []
            found = [*([usable] if usable else []), *self._own_dimensions(scope), *elsewhere]
            kept = [[c for c in dimension if not self._ruled(c.keys)] for dimension in found]
            return [dimension for dimension in kept if dimension]
        return found

    def _spread(self, scope: str, choice: Choice, source: Run, reference: Reference,
                rtol: float) -> int:
        """Apply a kept hypothesis to the other units of its type, confirmed in one pass.

        Each unit takes it; one forward pass of the model then compares each one's modules with
        the reference's. Units up to the first that does not agree keep it; that one and those
        after it (whose inputs it changes) are put back as they were, to be searched in turn.

        Returns:
            How many units kept it.
        """
        applied: list[tuple[str, Choice, dict[str, PlanStep], dict[str, torch.Tensor]]] = []
        for block, other in same_type(scope, self.modules):
            if not all(k.startswith(f"{block}.") for k in choice.keys):
                return 0  # it reaches outside its block: it is this block's own
            moved = Choice(tuple(edit.moved(block, other) for edit in choice.edits))
            if not all(k in self.view.steps for k in moved.keys):
                continue
            before = {k: self.view.steps[k] for k in moved.keys}
            saved: dict[str, torch.Tensor] = {}
            try:
                self.view.steps.update(apply_choice(self.view, self.state, moved, saved))
            except TorchgraftError:
                continue
            applied.append((other, moved, before, saved))
        self.view.cache.clear()
        if not applied:
            return 0
        run = run_recorded(self.target, reference.target_call)
        mapping = _module_map(self.view.steps.values(), reference.names)
        order = {path: k for k, path in enumerate(run.seen)}
        applied.sort(key=lambda item: min((order.get(_module(k), len(order)) for k in item[2]),
                                          default=len(order)))
        for count, (other, moved, _, _) in enumerate(applied):
            if not _agree_within(other, run, source, mapping, rtol):
                for _, _, steps, values in applied[count:]:
                    _put_back(self.view, self.state, steps, values)
                return count
            self.reordered |= _reordered(moved)
        return len(applied)

    def pair_missing(self, source: Run, reference: Reference, rtol: float) -> bool:
        """Fill what the plan left missing where the modules' inputs say the source.

        Returns:
            Whether any key was filled (a guess until outputs compare equal).
        """
        stored = self.plan.layout.stored if self.plan.layout is not None else {}
        missing = Missing(tuple(k for k in self.report.missing
                                if not is_bookkeeping(k) and k in self.state),
                          tuple(k for k in self.report.unused if k in stored),
                          reference.names,
                          {**self.shapes, **{f"source:{k}": tuple(i.shape)
                                             for k, i in stored.items()}})
        if not missing.targets or not missing.sources:
            return False
        found = pair_missing(self.view, missing, run_recorded(self.target,
                                                              reference.target_call),
                             source, rtol)
        if not found:
            return False
        with torch.no_grad():
            for key, step in found.items():
                self.state[key].copy_(self.view.value(step, self.state[key]))
        self.view.cache.clear()
        self.view.steps.update(found)
        self._index(found)
        used = _reachable(found.values(), self.view.made)
        self.report.take_paired(found, used, BY_INPUT)
        return True

    def write_back(self) -> None:
        """Record what was kept as the plan's own steps, and in the report."""
        view, plan, report = self.view, self.plan, self.report
        changed = [k for k, step in view.steps.items() if self.before.get(k) is not step]
        if not changed:
            return
        before = _reachable(self.before.values(), view.made)
        after = _reachable(view.steps.values(), view.made)
        plan.steps = [view.steps[step.target] for step in plan.steps] + [
            view.steps[k] for k in report.loaded if k not in self.before]
        for key in (k for k in changed if k not in self.before):
            plan.missing.pop(key, None)
        plan.unused = {k: why for k, why in plan.unused.items() if k not in after}
        if plan.layout is not None:
            kept = tuple(d for d in plan.layout.derivations
                         if not set(d.outputs) <= before or set(d.outputs) & after)
            found = tuple(d for d in view.found if set(d.outputs) & after)
            plan.layout = replace(plan.layout, derivations=(*kept, *found))
        for key in changed:
            step = view.steps[key]
            report.mapping[key] = step.source
            done = step.describe()
            if done:
                report.adapted[key] = done
            else:
                report.adapted.pop(key, None)


def _reordered(choice: Choice) -> set[str]:
    """The modules whose rows a hypothesis reorders (their activations are in another order)."""
    return {_module(k) for e in choice.edits if isinstance(e, (Relayout, Rotate)) for k in e.keys}


def _agree_within(block: str, run: Run, source: Run, mapping: Mapping[str, str],
                  rtol: float) -> bool:
    """Whether every module of a block that has a counterpart gives what it gives."""
    for path, activation in run.seen.items():
        paired = mapping.get(path)
        if path.startswith(f"{block}.") and paired in source.seen and \
                differ(source.seen[paired], activation, rtol) is not None:
            return False
    return True


def _put_back(view: PlanView, state: Mapping[str, torch.Tensor],
              steps: Mapping[str, PlanStep], values: Mapping[str, torch.Tensor]) -> None:
    """A unit's steps and tensors as they were before a hypothesis was spread to it."""
    view.steps.update(steps)
    with torch.no_grad():
        for key, value in values.items():
            state[key].copy_(value)


def _fills(keys: Iterable[str], steps: Mapping[str, PlanStep], names: Mapping[str, str]) -> str:
    """The reference module the steps fill these keys from (their first key's)."""
    key = next(iter(keys), None)
    if key is None:
        return ""
    source = steps[key].source
    return _module(names.get(source, source))


def _reachable(steps: Iterable[PlanStep], made: Mapping[str, object]) -> set[str]:
    """Every source name the steps read, and what those were made from."""
    found: set[str] = set()
    todo = [step.source for step in steps]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        derivation = made.get(name)
        todo += list(getattr(derivation, "inputs", ()))
    return found


def verify_graft(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference, *,
                 refs: Mapping[str, TensorRef], rtol: float = 1e-4) -> None:
    """Compare what corresponds, search where it diverges, and record the outcome.

    Never raises for the graft's sake: a model that fails on the inputs, or nothing that
    corresponds, is a warning, and the verdict stays as the file earned it.

    Args:
        report: The graft's report: its evidence, divergence and mapping are updated.
        plan: The executed plan (its steps edited where a hypothesis is kept).
        target: The grafted model (changed in place when a hypothesis is kept).
        reference: What to compare with.
        refs: The source's tensors the plan reads (the search reads them again).
        rtol: Tolerance relative to the reference output's largest magnitude.
    """
    first = _first_run(report, plan, target, reference, rtol)
    if first is None:
        logger.warning("%s", report.warnings[-1], extra=IN_REPORT)
        return
    reference, source, result = first
    search = _Search(report, plan, target, refs, heads_of(target, reference.module))
    for _ in range(MAX_UNITS):
        if search.pair_missing(source, reference, rtol):  # then what it filled is compared
            result = compare(source, target, None, reference.target_call,
                             module_map=search.module_map(reference.names),
                             rtol=rtol, outputs=not report.new)
            continue
        if result.divergence is None or result.unit is None:
            break
        watched = result.unit[0]
        try:
            unit = search.unit(watched, source, reference)
        except TorchgraftError as exc:  # it ran before: not expected
            report.warnings.append(f"'{watched}' could not be searched: {exc}")
            break
        if not search.settle(unit, source, reference, rtol):
            break
        try:
            result = compare(source, target, None, reference.target_call,
                             module_map=search.module_map(reference.names),
                             rtol=rtol, outputs=not report.new)
        except TorchgraftError as exc:  # it ran with the hypothesis once: not expected
            report.warnings.append(f"outputs could not be compared again after settling: {exc}")
            break
    search.write_back()
    report.tried = search.tried
    _record(report, result, reference, search.settled)


def _first_run(report: GraftReport, plan: Plan, target: nn.Module, reference: Reference,
               rtol: float) -> tuple[Reference, Run, Verification] | None:
    """The first comparison the models run for: the inputs given, or each generated in turn.

    Generated inputs are tried until both models run on them (images of another size...).
    Where the models fail on every one, or nothing of their outputs corresponds, the report
    says why in a warning (the verdict stays as the file earned it).

    Returns:
        The reference with the inputs used, the source's run, and the comparison; ``None``
        when outputs were not compared.
    """
    failures: list[str] = []
    for tried in reference.tries():
        try:
            source = run_recorded(tried.module, tried.source_call)
            return tried, source, compare(
                source, target, None, tried.target_call, rtol=rtol, outputs=not report.new,
                module_map=_module_map(plan.steps, tried.names))
        except NotComparable as exc:  # the models ran: other inputs would not help
            report.warnings.append(f"outputs were not compared with {reference.origin}: {exc}")
            return None
        except TorchgraftError as exc:
            failures.append(f"{exc} (on inputs generated {tried.generated})"
                            if tried.generated else str(exc))
    every = "the models fail on every input generated: " if len(failures) > 1 else ""
    give = ("; give inputs the models take: example_inputs= (CLI: --inputs FILE or "
            "--input-shape N,C,H,W)" if reference.generated else "")
    report.warnings.append(f"outputs were not compared with {reference.origin}: {every}"
                           f"{'; '.join(failures)}{give}")
    return None


def _record(report: GraftReport, result: Verification, reference: Reference,
            kept: Iterable[str]) -> None:
    report.max_abs_diff = result.max_abs_diff
    report.verified_with = reference.origin
    report.settled = list(kept)
    if result.compared != "outputs":
        report.warnings.append(f"compared {result.compared}")
    missing = [k for k in report.missing if not is_bookkeeping(k)]
    if result.divergence is not None and missing:
        report.warnings.append(f"outputs differ from {reference.origin}'s with "
                               f"{len(missing)} keys missing (first '{missing[0]}'): what "
                               "fills them was not found")
    elif result.divergence is not None:
        tried = f"; {len(report.tried)} hypotheses tried" if report.tried else ""
        report.diverged_at = result.unit[0] if result.unit is not None else None
        report.divergence = (f"{result.divergence}; {result.compared} differ by "
                             f"{result.max_abs_diff:.3g} (tolerance {result.tolerance:.3g}) "
                             f"from {reference.origin}'s{tried}")
    elif result.uncovered:
        report.warnings.append(f"they agree, but {few(result.uncovered, show=repr)} run after "
                               "it and were not compared: the verdict stays as the file earned "
                               "it")
    else:
        report.mark_verified()
