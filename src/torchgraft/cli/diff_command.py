"""``torchgraft diff``: names, shapes, dtypes and values that differ between two checkpoints."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from ..text import one_line
from .checks import source_path
from .progress import steps
from .render import print_json, print_rows

__all__ = ["SHOWN", "diff_command"]

#: Differences of one kind listed without --details.
SHOWN = 10


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path), callback=source_path)
@click.argument("b", type=click.Path(path_type=Path), callback=source_path)
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.option("--unsafe", is_flag=True, help="Let the files' pickles run code. Trusted files "
                                             "only.")
@click.option("--keep-wrappers", is_flag=True,
              help="Compare names as stored (by default 'module.' and the like are removed).")
@click.option("--details", is_flag=True,
              help=f"List every difference (default: the first {SHOWN} of each kind).")
@click.option("--quiet", "-q", is_flag=True, help="Print the one-line verdict only.")
def diff_command(a: Path, b: Path, as_json: bool, unsafe: bool, keep_wrappers: bool,
                 details: bool, quiet: bool) -> int:
    """Compare the weights of checkpoints A and B (any formats).

    Exit codes: 0 identical, 1 they differ, 2 bad input, 130 interrupted.
    """
    from ..diff import diff

    with steps("comparing", quiet=quiet) as progress:
        report = diff(a, b, unsafe=unsafe, keep_wrappers=keep_wrappers,
                      progress=progress.counter("tensors"))
    console = Console(soft_wrap=as_json)
    if as_json:
        print_json(console, report.to_dict())
        return 0 if report.identical else 1
    console.print(escape(one_line(report.headline())), highlight=False)
    if not quiet:
        rows = report.lines()
        shown: list[tuple[str, str, str]] = []
        for kind in dict.fromkeys(r[0] for r in rows):
            group = [r for r in rows if r[0] == kind]
            shown += group if details else group[:SHOWN]
            if not details and len(group) > SHOWN:
                shown.append((kind, f"... {len(group) - SHOWN} more", "(--details lists all)"))
        print_rows(console, shown, full=details)
    return 0 if report.identical else 1
