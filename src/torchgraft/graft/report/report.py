"""The graft report: every key, what happened to it and why; ``GraftError`` for strict grafts."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ...atomic import atomic_path
from ...errors import TorchgraftError
from ..evidence import EXIT_CODES, SIBLINGS, Assumption, Caution, Evidence, Guess, Verdict
from ..plan.steps import REINITIALISED, Plan, PlanStep, is_bookkeeping
from ..tensors import TensorInfo
from .html import describe, render_html
from .rules import rules_of
from .summary import as_text, detail_rows, summary_rows

__all__ = ["GraftError", "GraftReport"]

#: How to declare parts of the model new, and how to name what the checkpoint calls otherwise.
_COMPLETE = ("declare parts new on purpose with new= (CLI: --new PATTERN), or name their "
             "sources with rules= (CLI: --rules FILE)")


@dataclass(repr=False)
class GraftReport:
    """What a graft did, per key.

    ``str(report)`` is a summary of a few lines (counts per matching step, one line per
    module that needs a look, how to settle); :meth:`details` lists every key; ``repr`` is
    one line.

    Attributes:
        loaded: Target keys filled, in the target's order.
        mapping: Target key to the source key that filled it.
        matched_by: Target key to the matching step (exact, rule, layout, wrapper, prefix,
            structure).
        adapted: Target key to what was done to the tensor (transposed, rows, channels, cast).
        missing: Target keys left as they were.
        unused: Source keys not used.
        reasons: Key to why it is missing, unused or re-initialised.
        reinitialised: Target key to why it got fresh values (``init=``) rather than the
            checkpoint's: a new classifier head. Handled: it does not make the report not ok
            (``strict=True`` still raises for it).
        tied: Target key to the key it is tied to (the same Parameter), filled once through it.
        new: Target key the caller declared new (``new=``) that the checkpoint does not fill,
            to how it is initialised (as the model's code made it, or as ``init=`` says); not
            missing.
        warnings: What torchgraft could not be sure of, in words.
        max_abs_diff: When outputs were compared (``verify``): the largest output difference
            between the source module and the model.
        divergence: When outputs were compared and differ beyond tolerance: where activations
            first diverge. The report is then not ok.
        diverged_at: With ``divergence``: the model's module whose activations diverge
            first, where one does (``None`` when only the outputs differ).
        not_in_adapter: When a PEFT adapter was grafted: the model's base weights, which an
            adapter never holds; not missing (the report is scoped to the adapter's keys).
        evidence: Loaded key to how it is known (:class:`Evidence`): ``name``, ``structure``,
            ``guess``, or ``verified`` once outputs were compared equal.
        guesses: Loaded key filled by a guess to its alternatives and how to settle it; any
            guess left unverified makes the verdict ``unverified``.
        verified_with: When outputs were compared: what with (the source module, a
            ``source_model=``, the model a folder's config.json describes).
        settled: Guesses that comparing outputs settled: the hypothesis kept for each diverging
            unit (two same-shape modules swapped, rotary rows permuted).
        surplus: Unused source keys of blocks the model lacks (the checkpoint is deeper), with
            the reason; they make the verdict ``unverified`` (a rule that drops them settles it).
        assumptions: What the graft relies on that the checkpoint cannot confirm (a bare
            state dict from another code base: the attention's head count, which same-shape
            sibling is which); any left unverified makes the verdict ``unverified``.
        initialised: Key to the model's own code that computed it: a buffer the checkpoint
            lacks, kept as the model computed it (an assumption until outputs are compared),
            and on a model built on the meta device, what no checkpoint holds (non-persistent
            buffers such as rotary frequencies; a key the checkpoint lacks, which stays
            ``missing`` too). Never loaded.
        tried: Where outputs diverged: each hypothesis tried for a diverging unit, and whether
            it made the unit agree.
        infos: The model's and the checkpoint's tensors by key, for :attr:`shapes`.
        targets: Every target key, in the model's order (for :meth:`to_html`).
        sources: Every source key, in stored order (for :meth:`to_html`).
        plan: The plan the graft ran (``tg.save(model, path, layout_of=report)`` runs it
            backwards).
    """

    loaded: list[str] = field(default_factory=list)
    mapping: dict[str, str] = field(default_factory=dict)
    matched_by: dict[str, str] = field(default_factory=dict)
    adapted: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    reinitialised: dict[str, str] = field(default_factory=dict)
    tied: dict[str, str] = field(default_factory=dict)
    new: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None
    divergence: str | None = None
    diverged_at: str | None = None
    not_in_adapter: list[str] = field(default_factory=list)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    guesses: dict[str, Guess] = field(default_factory=dict)
    verified_with: str | None = None
    settled: list[str] = field(default_factory=list)
    surplus: dict[str, str] = field(default_factory=dict)
    assumptions: list[Assumption] = field(default_factory=list)
    initialised: dict[str, str] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)
    infos: tuple[Mapping[str, TensorInfo], Mapping[str, TensorInfo]] = field(
        default=({}, {}), repr=False, compare=False)
    targets: list[str] = field(default_factory=list, repr=False)
    sources: list[str] = field(default_factory=list, repr=False)
    plan: Plan | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_plan(cls, plan: Plan, *, targets: Iterable[str] = (),
                  sources: Iterable[str] = ()) -> GraftReport:
        """The report of a plan, once executed.

        Args:
            plan: The plan.
            targets: Every target key, in the model's order.
            sources: Every source key, in stored order.
        """
        report = cls(targets=list(targets), sources=list(sources), plan=plan)
        for step in plan.steps:
            report.loaded.append(step.target)
            report.mapping[step.target] = step.source
            report.matched_by[step.target] = step.matched_by
            report.evidence[step.target] = step.evidence
            if step.target in plan.guesses:
                report.guesses[step.target] = plan.guesses[step.target]
            done = step.describe()
            if done:
                report.adapted[step.target] = done
        report.missing = list(plan.missing)
        report.unused = list(plan.unused)
        report.reinitialised = dict(plan.reinitialised)
        report.surplus = dict(plan.surplus)
        report.assumptions = list(plan.assumptions)
        report.initialised = dict(plan.initialised)
        report.tied = dict(plan.tied)
        report.warnings = list(plan.warnings)
        report.reasons = {**plan.unused, **plan.reinitialised, **plan.missing}
        return report

    @cached_property
    def shapes(self) -> dict[str, str]:
        """Key (target, or source as ``"checkpoint:<key>"``) to its shape and dtype.

        E.g. ``"(64, 3, 7, 7) float32"`` (for :meth:`to_html`); found when first asked.
        """
        targets, sources = self.infos
        return {**{k: describe(i) for k, i in targets.items()},
                **{f"checkpoint:{k}": describe(i) for k, i in sources.items()}}

    def add_missing(self, reasons: Mapping[str, str]) -> None:
        """Record target keys found missing after the plan ran.

        Left on the meta device, or written without the write showing in the model's state
        dict.

        Args:
            reasons: Key to why it is missing; keys recorded as loaded are no longer.
        """
        if not reasons:
            return
        if any(key in reasons for key in self.loaded):  # sets, not list scans: 100k keys
            self.loaded = [key for key in self.loaded if key not in reasons]
        for key in reasons:
            self.evidence.pop(key, None)
            self.guesses.pop(key, None)
            self.tied.pop(key, None)
            self.new.pop(key, None)
        known = set(self.missing)
        self.missing += [key for key in reasons if key not in known]
        self.reasons.update(reasons)

    def take_paired(self, steps: Mapping[str, PlanStep], used: Iterable[str], why: str) -> None:
        """Record missing keys filled after the plan ran (a search paired them): guesses.

        Args:
            steps: Target key to the step that filled it.
            used: The source keys they read (no longer unused).
            why: How they were paired.
        """
        for key, step in steps.items():
            if key not in self.mapping:
                self.loaded.append(key)
            self.mapping[key] = step.source
            self.matched_by[key] = step.matched_by
            self.evidence[key] = Evidence.GUESS
            self.guesses[key] = Guess((), why)
            self.reasons.pop(key, None)
            done = step.describe()
            if done:
                self.adapted[key] = done
        self.missing = [k for k in self.missing if k not in steps]
        gone = set(used)
        self.unused = [k for k in self.unused if k not in gone]
        for key in gone:
            self.reasons.pop(key, None)

    def mark_verified(self) -> None:
        """Outputs were compared equal: every loaded key is ``verified``, no guess is left.

        Warnings that equal outputs settle (:class:`~torchgraft.graft.evidence.Caution`) go.
        """
        self.evidence = dict.fromkeys(self.evidence, Evidence.VERIFIED)
        self.guesses.clear()
        self.surplus.clear()
        self.assumptions.clear()
        self.warnings = [w for w in self.warnings if not isinstance(w, Caution)]

    @property
    def verdict(self) -> Verdict:
        """The verdict: ``diverged``, ``incomplete``, ``unverified`` or ``ok``.

        ``diverged`` if outputs differ, else ``incomplete`` if keys are missing (bookkeeping
        buffers aside), else ``unverified`` if a key was guessed or an assumption made, else
        ``ok``.
        """
        if self.divergence is not None:
            return Verdict.DIVERGED
        if [k for k in self.missing if not is_bookkeeping(k)]:
            return Verdict.INCOMPLETE
        if self.guesses or self.surplus or self.assumptions:
            return Verdict.UNVERIFIED
        return Verdict.OK

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for the verdict: 0 ok, 1 incomplete, 3 unverified, 4 diverged."""
        return EXIT_CODES[self.verdict]

    @property
    def ok(self) -> bool:
        """True when the verdict is ``ok``.

        Every target key loaded (or tied, re-initialised), none by a guess that outputs did
        not settle, and outputs agree where compared.
        """
        return self.verdict is Verdict.OK

    @property
    def complete(self) -> bool:
        """True when every target key is filled, guesses or not, and outputs did not diverge."""
        return self.verdict in (Verdict.OK, Verdict.UNVERIFIED)

    @property
    def clean(self) -> bool:
        """True when nothing is missing, unused or re-initialised: what strict needs.

        Bookkeeping buffers aside; parts declared new (``new=``) are new on purpose.
        """
        return (self.ok and not self.reinitialised
                and not [k for k in self.unused if not is_bookkeeping(k)])

    def counts(self) -> dict[str, int]:
        """Numbers of keys loaded, renamed (matched other than by exact name), adapted..."""
        return {
            "loaded": len(self.loaded),
            "renamed": sum(1 for k in self.loaded if self.matched_by[k] != "exact"),
            "guessed": len(self.guesses),
            "adapted": len(self.adapted),
            "reinitialised": len(self.reinitialised),
            "tied": len(self.tied),
            "new": len(self.new),
            "missing": len(self.missing),
            "unused": len(self.unused),
            "not in adapter": len(self.not_in_adapter),
            "initialised": len(self.initialised),
        }

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON-ready data."""
        return {"ok": self.ok, "verdict": self.verdict.value, "counts": self.counts(),
                "evidence": {k: v.value for k, v in self.evidence.items()},
                "guesses": {k: {"alternatives": list(g.alternatives), "why": g.why,
                                "settle": g.settle} for k, g in self.guesses.items()},
                "surplus": self.surplus,
                "assumptions": [{"what": a.what, "assumed": a.assumed, "why": a.why,
                                 "settle": a.settle} for a in self.assumptions],
                "loaded": self.loaded,
                "mapping": self.mapping, "matched_by": self.matched_by, "adapted": self.adapted,
                "missing": self.missing, "unused": self.unused, "reasons": self.reasons,
                "reinitialised": self.reinitialised, "tied": self.tied, "new": self.new,
                "warnings": self.warnings, "max_abs_diff": self.max_abs_diff,
                "divergence": self.divergence, "diverged_at": self.diverged_at,
                "not_in_adapter": self.not_in_adapter,
                "verified_with": self.verified_with, "settled": self.settled,
                "initialised": self.initialised, "tried": self.tried}

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the report as one self-contained HTML page (no network needed to view it).

        Both module trees side by side, each target tensor linked to the source tensor that
        filled it and coloured by how, the reason on hover, filters by kind.

        Args:
            path: Where to write the page.

        Returns:
            The path written.
        """
        destination = Path(path)
        with atomic_path(destination, overwrite=True) as temporary:
            temporary.write_text(render_html(self), encoding="utf-8")
        return destination

    def to_rules(self, path: str | os.PathLike[str] | None = None) -> list[Any]:
        """What this graft did, as rules that do it again with no search (``rules=``).

        Operation rules make each tensor the model needs under its own key (fused rows taken
        apart in the layout found, rotary rows, transposes), renaming rules name the rest: fed
        back (``tg.graft(source, model, rules=...)``, CLI ``--rules FILE``), every key is
        filled by name, as the user said, and the graft is ok by rule. A way to keep and share
        a conversion between two code bases.

        Args:
            path: Where to write them as a rules file (JSON: ``{"rules": [...]}``), if given.

        Returns:
            The rules, in the order they apply.

        Raises:
            TorchgraftError: If the report holds no plan (one made by hand).
        """
        if self.plan is None:
            raise TorchgraftError("this report holds no plan: only a graft's report (tg.graft) "
                                  "can be written as rules")
        rules = rules_of(self.plan)
        if path is not None:
            data = {"about": f"torchgraft rules: {self.headline()}; fed back with rules= "
                             "(CLI: --rules FILE), every key is filled by its name",
                    "rules": rules}
            with atomic_path(Path(path), overwrite=True) as temporary:
                temporary.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        return rules

    def to_json(self, **kwargs: Any) -> str:
        """Return the report as JSON text (``kwargs`` go to ``json.dumps``)."""
        return json.dumps(self.to_dict(), **kwargs)

    def lines(self) -> list[tuple[str, str, str]]:
        """(status, key, detail) for every key that was not plainly loaded by exact name."""
        rows = []
        for key in self.loaded:
            if key in self.adapted:
                source = self.mapping[key]
                rows.append(("adapted", key, self.adapted[key] if source == key
                             else f"<- {source}: {self.adapted[key]}"))
            elif self.matched_by[key] != "exact" and key not in self.guesses:
                rows.append((self.matched_by[key], key, f"<- {self.mapping[key]}"))
        rows += [("guess", k, f"<- {self.mapping[k]}: {g.describe()}")
                 for k, g in self.guesses.items()]
        rows += [("reinit", k, self.reinitialised[k]) for k in self.reinitialised]
        rows += [("tied", k, f"= {v}") for k, v in self.tied.items()]
        rows += [("new", k, how) for k, how in self.new.items()]
        rows += [("missing", k, self.reasons[k]) for k in self.missing]
        rows += [("surplus" if k in self.surplus else "unused", k,
                  self.surplus.get(k, self.reasons[k]))
                 for k in self.unused if k not in self.missing]
        rows += [("base", k, self.reasons[k]) for k in self.not_in_adapter]
        rows += [("init", k, f"computed by the model's code: {how}")
                 for k, how in self.initialised.items() if k not in self.missing
                 and k not in self.new]
        return rows

    def settle(self) -> str:
        """What is not certain and how to settle it, in one line (or empty).

        Unverified: what was assumed or guessed, and how to settle it (compare outputs...).
        Diverged: outputs were compared, so what is left is to name sources or configurations.
        Each way is said in the library's words with the command line's beside them.
        """
        if self.divergence is not None:
            tried = "the hypotheses tried did not make them agree; " if self.tried else ""
            return (f"outputs were compared and differ; {tried}name each key's source with "
                    "rules= (CLI: --rules FILE), or build the model with the source's "
                    "configuration (widths, head counts, norms)")
        parts = [f"the {a.what} was assumed ({a.assumed})"
                 for a in self.assumptions if a.what != SIBLINGS]
        ways = [a.settle for a in self.assumptions if a.what != SIBLINGS]
        if self.guesses:
            parts.append(f"{len(self.guesses)} keys were guessed among interchangeable "
                         "candidates")
            ways += [g.settle for g in self.guesses.values()]
        if self.surplus:
            parts.append(f"{len(self.surplus)} checkpoint keys are blocks the model lacks")
            ways.append("build the model with the checkpoint's configuration, or drop them "
                        "on purpose with a rule (rules=, CLI: --rules FILE)")
        if not parts:
            return ""
        each = dict.fromkeys(way for ways_of in ways for way in ways_of.split("; or "))
        return f"{'; '.join(parts)}; to settle: {'; or '.join(each)}"

    def notice(self) -> str:
        """The warning a graft that is not ok logs: verdict, counts and what to do (or empty).

        Two lines: the headline, then the first missing key or the divergence, and how to
        settle; :meth:`__str__` and :meth:`details` say more.
        """
        if self.ok:
            return ""
        missing = [k for k in self.missing if not is_bookkeeping(k)]
        if self.divergence is None and missing:
            what = (f"'{missing[0]}'{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}"
                    f" missing ({self.reasons[missing[0]]}); {_COMPLETE}")
        elif self.divergence is not None:
            what = f"{self.divergence}; {self.settle()}"
        else:
            what = self.settle()
        return (f"{self.headline()}\n  {what} (print(report) shows a summary, report.details() "
                "every key)")

    def headline(self) -> str:
        """The one-line verdict: ``graft ok: 11 loaded, 11 renamed, 1 missing`` (no zeros).

        The verdict is ``ok``, ``UNVERIFIED``, ``INCOMPLETE`` or ``DIVERGED``.
        """
        counts = ", ".join(f"{v} {k}" for k, v in self.counts().items() if v or k == "loaded")
        verdict = self.verdict
        return f"graft {verdict.value if self.ok else verdict.value.upper()}: {counts}"

    def __str__(self) -> str:
        """A summary: the headline, counts per matching step, modules that need a look."""
        return as_text(self.headline(), summary_rows(self))

    def __repr__(self) -> str:
        """One line: the class, the verdict and the counts (no zeros)."""
        counts = ", ".join(f"{k.replace(' ', '_')}={v}" for k, v in self.counts().items() if v)
        return f"GraftReport(verdict='{self.verdict.value}'{', ' if counts else ''}{counts})"

    def details(self) -> str:
        """Every key not plainly loaded by its exact name, one line each, and every note."""
        return as_text(self.headline(), detail_rows(self))


class GraftError(TorchgraftError):
    """A strict graft left keys missing, unused, re-initialised or guessed.

    Args:
        report: The full report.
    """

    def __init__(self, report: GraftReport) -> None:
        self.report = report
        problems = [report.reasons[k] if f"'{k}'" in report.reasons[k]
                    else f"'{k}': {report.reasons[k]}"
                    for k in report.missing if not is_bookkeeping(k)]
        problems += [f"'{k}' in the checkpoint is not used: {report.reasons[k]}"
                     for k in report.unused if not is_bookkeeping(k) and k not in report.missing
                     and not report.reasons[k].endswith(REINITIALISED)]
        problems += [f"'{k}' re-initialised: {v}" for k, v in report.reinitialised.items()]
        problems += [f"'{k}' is a guess: {g.describe()}" for k, g in report.guesses.items()]
        problems += [f"assumed the {a.describe()}" for a in report.assumptions]
        if report.divergence:
            problems.insert(0, report.divergence)
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more; see .report)" if len(problems) > 3 else ""
        super().__init__(f"strict graft failed: {shown}{more}")
