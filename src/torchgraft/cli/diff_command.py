"""``torchgraft diff``: names, shapes, dtypes and values that differ between two checkpoints."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from ..diff import diff
from .render import print_json

__all__ = ["diff_command"]


@click.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON.")
@click.option("--unsafe", is_flag=True, help="Let the files' pickles run code. Trusted files "
                                             "only.")
@click.option("--keep-wrappers", is_flag=True,
              help="Compare names as stored (by default 'module.' and the like are removed).")
def diff_command(a: Path, b: Path, as_json: bool, unsafe: bool, keep_wrappers: bool) -> int:
    """Compare the weights of checkpoints A and B (any formats).

    Exit codes: 0 identical, 1 they differ, 2 bad input.
    """
    report = diff(a, b, unsafe=unsafe, keep_wrappers=keep_wrappers)
    console = Console(soft_wrap=as_json)
    if as_json:
        print_json(console, report.to_dict())
    else:
        console.print(str(report), highlight=False)
    return 0 if report.identical else 1
