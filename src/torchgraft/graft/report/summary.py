"""A graft report as rows of text: a short summary, or every key.

One implementation for ``str(report)``, ``report.details()`` and the command line (which
colours the rows and fits them to the terminal). Each row is ``(status, subject, detail)``:

- a summary gives one row per matching step with a count and an example (``wrapper 119 keys
  e.g. conv1.weight <- module.conv1.weight``), one row per module for what needs a look
  (guessed, missing, re-initialised...), at most :data:`SHOWN` of each, then the notes: the
  comparison, assumptions, warnings, and how to settle;
- the details give one row per key, then the same notes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...text import few, quoted
from ...units import plural

if TYPE_CHECKING:
    from .report import GraftReport

__all__ = ["COUNTED", "DETAILS_HINT", "KEPT", "SHOWN", "Row", "as_text", "detail_rows",
           "summary_rows"]

#: ``(status, subject, detail)``: a key (or a module, or a count) and what happened to it; notes
#: have no subject.
Row = tuple[str, str, str]

#: Statuses that only say how keys were matched (or that the model's code computed them): one
#: summary row each, with a count and an example.
COUNTED = ("wrapper", "prefix", "rule", "layout", "structure", "base", "init")
#: At most this many rows of each status in a summary; one more row counts the rest.
SHOWN = 5
#: How a hypothesis that was kept ends in ``report.tried``.
KEPT = "made it agree: kept"
#: Where the summary says every key is listed (the command line says ``--details``).
DETAILS_HINT = "report.details() lists every key"


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _alternative_module(alternative: str, sources: set[str]) -> str:
    """A guess's alternative as its module: ``layer1.0.bn2`` for ``layer1.0.bn2.weight``.

    An alternative that is not a key (``q.weight (rows as stored)``) keeps its words.
    """
    key, space, rest = alternative.partition(" ")
    return _module(key) + space + rest if key in sources and _module(key) else alternative


def _guessed_modules(report: GraftReport) -> list[Row]:
    """One row per guessed module: its source module, why, the other modules that fit."""
    sources = {*report.mapping.values(), *report.sources, *report.unused}
    by_module: dict[str, list[str]] = {}
    for key in report.guesses:
        by_module.setdefault(_module(key), []).append(key)
    rows = []
    for module, keys in by_module.items():
        if not module or len(keys) == 1:
            rows += [("guess", k, f"<- {report.mapping[k]}: {report.guesses[k].describe()}")
                     for k in keys]
            continue
        guess = report.guesses[keys[0]]
        others = list(dict.fromkeys(_alternative_module(a, sources)
                                    for k in keys for a in report.guesses[k].alternatives))
        more = f"; alternatives {few(others, show=quoted)}" if others else ""
        rows.append(("guess", f"{module} ({plural(len(keys), 'key')})",
                     f"<- {_module(report.mapping[keys[0]])}: {guess.why}{more}"))
    return rows


def _by_module(rows: list[Row]) -> list[Row]:
    """Rows of one status, those of one module (several keys) as one row: the first's detail."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(_module(row[1]) or row[1], []).append(row)
    return [members[0] if len(members) == 1 else
            (members[0][0], f"{module} ({plural(len(members), 'key')})", members[0][2])
            for module, members in groups.items()]


def _capped(status: str, rows: list[Row], noun: str, nouns: str) -> tuple[list[Row], bool]:
    """At most :data:`SHOWN` rows, then one that counts the rest; whether any were left out."""
    if len(rows) <= SHOWN:
        return rows, False
    more = plural(len(rows) - SHOWN, f"more {noun}", f"more {nouns}")
    return [*rows[:SHOWN], (status, f"... {more}", "")], True


def summary_rows(report: GraftReport, *, hint: str = DETAILS_HINT) -> list[Row]:
    """The report in a few rows: counts per matching step, modules that need a look, notes.

    Args:
        report: The report.
        hint: Where every key is listed, said when the summary leaves keys out.

    Returns:
        The rows, in order: the comparison, steps and modules, notes, how to settle.
    """
    counted: dict[str, list[Row]] = {}
    rest: dict[str, list[Row]] = {}
    for row in report.lines():
        (counted if row[0] in COUNTED else rest).setdefault(row[0], []).append(row)
    rows: list[Row] = [(status, plural(len(group), "key"),
                        f"e.g. {group[0][1]} {group[0][2]}".rstrip())
                       for status, group in counted.items()]
    left_out = any(len(group) > 1 for group in counted.values())
    for status, group in rest.items():
        grouped = _guessed_modules(report) if status == "guess" else _by_module(group)
        shown, cut = _capped(status, grouped, "module", "modules")
        rows += shown
        left_out = left_out or cut or len(grouped) < len(group)
    tail = _notes(report, short=True)
    if left_out:
        tail.append(("details", "", hint))
    return _leading(report) + rows + tail


def detail_rows(report: GraftReport) -> list[Row]:
    """Every key not plainly loaded by its exact name, one row each, with every note."""
    return _leading(report) + report.lines() + _notes(report, short=False)


def _leading(report: GraftReport) -> list[Row]:
    """What the comparison of outputs found, before the keys."""
    rows: list[Row] = []
    if report.max_abs_diff is not None:
        rows.append(("compared", "", f"max |output difference| = {report.max_abs_diff:.3g}"
                     + (f" with {report.verified_with}" if report.verified_with else "")))
    if report.divergence:
        rows.append(("diverged", "", report.divergence))
    return rows


def _notes(report: GraftReport, *, short: bool) -> list[Row]:
    """Assumptions, what settling kept and tried, warnings, then how to settle."""
    rows: list[Row] = [("assumed", "", a.describe()) for a in report.assumptions]
    rows += [("settled", "", s) for s in report.settled]
    if short and report.tried:
        kept = sum(1 for t in report.tried if t.endswith(KEPT))
        rows.append(("tried", "", f"{plural(len(report.tried), 'hypothesis', 'hypotheses')} "
                                  f"where outputs diverged, {kept} kept (each in "
                                  "report.tried)"))
    elif not short:
        rows += [("tried", "", t) for t in report.tried]
    rows += [("warning", "", w) for w in report.warnings]
    if report.settle():
        rows.append(("settle", "", report.settle()))
    return rows


def as_text(headline: str, rows: Iterable[Row]) -> str:
    """The headline, then each row indented under it: status, subject, detail."""
    lines = [headline]
    for status, subject, detail in rows:
        words = "  ".join(part for part in (subject, detail) if part)
        lines.append(f"  {status:<9} {words}".rstrip())
    return "\n".join(lines)
