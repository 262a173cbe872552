"""Rich rendering of checkpoint summaries."""

from __future__ import annotations

import json
import re
import textwrap
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..text import one_line, shorten
from ..units import human_bytes, plural
from .words import cli_words

if TYPE_CHECKING:  # rendering never imports torch: completion and --help stay fast
    from ..graft import GraftReport
    from ..inspect import CheckpointInfo

__all__ = ["DETAILS_FLAG", "extras_tree", "print_info", "print_json", "print_report",
           "print_rows", "safe_text"]


def safe_text(text: str) -> str:
    r"""Text from a file, safe to print: control characters escaped, no rich markup.

    Args:
        text: A name, value or path read from a checkpoint.

    Returns:
        The text with ``\n``, ``\x1b`` and the like written out, and ``[`` escaped.
    """
    return escape(one_line(text))


def print_json(console: Console, data: Any) -> None:
    """Print data as JSON, unstyled, for scripts, in ASCII.

    Every other character is an escape: a name's terminal codes or direction marks are data,
    not instructions to the terminal.
    """
    console.print_json(json.dumps(data, default=str), highlight=False, ensure_ascii=True)


def print_info(console: Console, info: CheckpointInfo, *, limit: int | None) -> None:
    """Print a checkpoint summary: header facts, totals by dtype, extras, tensor table.

    Args:
        console: Where to print.
        info: The summary.
        limit: Show at most this many tensors; all when ``None``.
    """
    t = info.totals
    console.print(f"[bold]{safe_text(str(info.path))}[/bold]")
    facts = [
        ("format", info.format),
        ("saved on", ", ".join(info.saved_devices) or "-"),
        ("wrappers", ", ".join(f"'{w.prefix}' ({w.source})" for w in info.wrappers) or "none"),
        ("weights", f"{plural(t.tensors, 'tensor')}, {human_bytes(t.bytes)}"
                    + (f" under '{info.weights_key}'" if info.weights_key else "")),
        ("values", _values(info)),
    ]
    if info.model_class:
        facts.append(("model class", f"{info.model_class} (not imported)"))
    if info.skipped_calls:
        facts.append(("not run", ", ".join(info.skipped_calls)
                      + " (recorded, not called: nothing from the file runs; --unsafe calls "
                        "them, for a file you trust)"))
    others = {k: n for k, n in info.weight_sets.items() if k != info.weights_key}
    if others:
        facts.append(("other weights", ", ".join(f"'{k}' ({n})" for k, n in others.items())))
    room = max(console.width - 17, 30)
    for key, value in facts:
        text = one_line(str(value))
        text = text if len(text) <= room or not console.is_terminal else text[:room - 3] + "..."
        console.print(f"  [cyan]{key:>13}[/cyan]  {escape(text)}", highlight=False,
                      soft_wrap=not console.is_terminal)
    if len(info.by_dtype) > 1:
        for name, totals in info.by_dtype.items():
            console.print(f"  {'':>13}  {safe_text(name)}: {plural(totals.tensors, 'tensor')}, "
                          f"{plural(totals.parameters, 'value')}, {human_bytes(totals.bytes)}")
    if info.extras:
        console.print(f"  [cyan]{'extras':>13}[/cyan]")
        width = max(console.width - 4, 40)
        lines = extras_tree(info.extras)
        for line in lines[:_TREE_LINES]:
            console.print(f"    {escape(shorten(one_line(line), width))}", highlight=False,
                          soft_wrap=True)
        if len(lines) > _TREE_LINES:
            console.print(f"    ... {plural(len(lines) - _TREE_LINES, 'more line')} "
                          "(--json shows everything)")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("name", "shape", "dtype"):
        table.add_column(column)
    shown = info.tensors if limit is None else info.tensors[:limit]
    for name, meta in shown:
        dtype = str(meta.dtype).removeprefix("torch.")
        table.add_row(safe_text(name), str(tuple(meta.shape)), dtype)
    console.print(table)
    if len(shown) < len(info.tensors):
        console.print(f"  ... {len(info.tensors) - len(shown)} more (--all shows every tensor)")


def _values(info: CheckpointInfo) -> str:
    """Numbers stored, parameters and buffers apart (buffers known by their names)."""
    buffers = info.buffers
    params = info.totals.parameters - buffers.parameters
    text = f"{params:,} in parameters"
    if buffers.tensors:
        text += f", {buffers.parameters:,} in {plural(buffers.tensors, 'buffer')} (statistics, ids)"
    return text


#: Extras deeper than this, or with more entries, are summarised.
_TREE_DEPTH = 3
_TREE_ITEMS = 12
_TREE_LINES = 30


def extras_tree(extras: dict[str, Any]) -> list[str]:
    """Extras as an indented tree: long lists, deep dicts and long strings summarised.

    Args:
        extras: Plain data.

    Returns:
        Lines, each ``key: value`` or ``key:`` followed by its children, indented.
    """
    lines: list[str] = []

    def walk(value: Any, key: str, depth: int) -> None:
        pad = "  " * depth
        if isinstance(value, dict) and value:
            if depth >= _TREE_DEPTH:
                lines.append(f"{pad}{key}: {{{plural(len(value), 'entry', 'entries')}}}")
                return
            lines.append(f"{pad}{key}:")
            for i, (k, v) in enumerate(value.items()):
                if i == _TREE_ITEMS:
                    lines.append(f"{pad}  ... {len(value) - i} more")
                    break
                walk(v, str(k), depth + 1)
        elif isinstance(value, (list, tuple)) and len(value) > 4:
            lines.append(f"{pad}{key}: [{plural(len(value), 'item')}: "
                         f"{json.dumps(value[:3], default=str)[1:-1]}, ...]")
        else:
            text = json.dumps(value, default=str)
            lines.append(f"{pad}{key}: {text if len(text) <= 80 else text[:77] + '...'}")

    for k, v in extras.items():
        walk(v, str(k), 0)
    return lines


_STATUS_STYLE = {"missing": "red", "diverged": "red", "unused": "yellow", "adapted": "magenta",
                 "reinit": "magenta", "guess": "yellow", "surplus": "yellow", "assumed": "yellow",
                 "warning": "yellow", "settle": "yellow", "compared": "green", "new": "blue"}
#: Where the summary says every key is listed, in the command line's words.
DETAILS_FLAG = "--details lists every key"


def print_rows(console: Console, rows: list[tuple[str, str, str]], *,
               full: bool = False) -> None:
    """Print (status, key, detail) rows fitted to the width: cut on a terminal, else wrapped.

    On a terminal, without ``full``, keys and details are shortened in the middle so that 80
    columns read well. Piped or logged output (or ``full``, the CLI's ``--details``) keeps every
    word: a row longer than the width is wrapped, continuing under its key, and a key is
    never broken. A note (no key: a warning, how to settle) is always wrapped, never cut.

    Args:
        console: Where to print.
        rows: The rows.
        full: Never shorten, also on a terminal.
    """
    width = max(console.width, 40)
    cut = console.is_terminal and not full
    for state, key, detail in rows:
        style = _STATUS_STYLE.get(state, "cyan")
        label = f"  [{style}]{state:<9}[/{style}] "
        if not key:  # a note: wrapped under its label
            _print_lines(console, label, _wrap(one_line(detail), width) or [""])
            continue
        if cut:
            room = width - 13
            key_room = min(len(key), max(room * 2 // 3, room - len(detail) - 2))
            shown_key = shorten(one_line(key), key_room)
            shown_detail = shorten(one_line(detail), room - len(shown_key) - 2)
            line = f"{label}{escape(shown_key)}  {escape(shown_detail)}"
            console.print(line.rstrip(), highlight=False, soft_wrap=True)
            continue
        key, detail = one_line(key), one_line(detail)
        if 12 + len(key) + 2 + len(detail) <= width:
            console.print(f"{label}{escape(key)}  {escape(detail)}".rstrip(), highlight=False,
                          soft_wrap=True)
            continue
        _print_lines(console, label, [key, *_wrap(detail, width)]
                     if len(key) > (width - 12) // 2 else _wrap(f"{key}  {detail}", width))


#: A number and the word after it (``10 guessed``), kept on one line when text is wrapped.
_COUNTED = re.compile(r"(?<=\d) (?=\S)")
_KEPT = "\u00a0"  # textwrap breaks at ASCII whitespace only


def _wrap(text: str, width: int) -> list[str]:
    """Text in lines that fit beside a row's label.

    Never breaking a word (or a key), and never a number from the word it counts.
    """
    lines = textwrap.wrap(_COUNTED.sub(_KEPT, text), width=width - 12, break_long_words=False,
                          break_on_hyphens=False)
    return [line.replace(_KEPT, " ") for line in lines]


def _print_lines(console: Console, label: str, lines: list[str]) -> None:
    """A row's first line after its label, the others under it."""
    console.print(f"{label}{escape(lines[0])}", highlight=False, soft_wrap=True)
    for more in lines[1:]:
        console.print(f"{'':12}{escape(more)}", highlight=False, soft_wrap=True)


def print_report(console: Console, report: GraftReport, *, details: bool = False,
                 quiet: bool = False) -> None:
    """Print a graft report: its headline, then its summary (or every key), in CLI words.

    The rows are the report's own (:mod:`torchgraft.graft.report.summary`: what
    ``str(report)`` and ``report.details()`` print), their details in the command line's words
    (flags, not Python arguments).

    Args:
        console: Where to print.
        report: The report.
        details: List every key, not a summary per matching step and module.
        quiet: Print the headline only.
    """
    from ..graft.report.summary import detail_rows, summary_rows

    head = report.headline()
    colour = "green" if report.ok else "yellow" if report.complete else "red"
    console.print(f"[{colour}]{escape(head)}[/{colour}]", highlight=False,
                  soft_wrap=not console.is_terminal)  # piped: one line, for grep
    if quiet:
        return
    rows = detail_rows(report) if details else summary_rows(report, hint=DETAILS_FLAG)
    print_rows(console, [(state, key, cli_words(detail)) for state, key, detail in rows],
               full=details)
