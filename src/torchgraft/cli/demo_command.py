"""``torchgraft demo``: a guided tour of everyday checkpoint problems, as real files.

Each problem is shown in a user's words, with the error plain PyTorch gives (run and caught
here), what torchgraft did instead, and the one line to do it yourself; a table of every
problem closes the tour.
"""

from __future__ import annotations

import contextlib
import tempfile
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import UnsafeCheckpointError
from ..text import one_line
from ..units import human_bytes, plural
from .render import print_json, print_rows

if TYPE_CHECKING:  # torch is imported when the command runs, not to list or complete it
    from ..demo import Example, GraftStep

__all__ = ["demo"]

def intro(opened: int, grafted: int) -> str:
    """The tour's first paragraph, announcing as many problems as it shows."""
    return (
        "torchgraft gets any PyTorch checkpoint into any model: from whatever device it was "
        "saved on, through whatever wrapper, from any PyTorch version or another framework, "
        "into the same or a modified architecture. It reads every common format safely "
        "(nothing in a file runs) and reports every key. This tour shows "
        f"{opened + grafted} problems: it writes {opened} real checkpoints, tries each the "
        f"plain PyTorch way and lets torchgraft open it, then makes {grafted} grafts into "
        "models that differ.")


def _open_example(example: Example) -> dict[str, Any]:
    """Try the plain way, then torchgraft; the payload example must be refused."""
    from ..demo import plain_error
    from ..inspect import inspect as inspect_checkpoint
    from ..load import load

    result: dict[str, Any] = {"title": example.title, "problem": example.problem,
                              "file": example.path.name, "plain_error": plain_error(
                                  example.plain),
                              "python": example.python.format(file=example.path.name),
                              "cli": example.cli.format(file=example.path.name,
                                                        folder=example.path.parent.name)}
    if example.expect_refusal:
        try:
            inspect_checkpoint(example.path)
        except UnsafeCheckpointError as exc:
            return {**result, "refused": exc.global_name, "message": exc.message}
        raise click.ClickException(f"{example.path} was not refused")
    info = inspect_checkpoint(example.path)
    weights = load(example.path)
    return {**result, "loaded_tensors": len(weights),
            "loaded_parameters": sum(t.numel() for t in weights.values()),
            "loaded_on": sorted({str(t.device) for t in weights.values()}), "info": info}


def _did(item: dict[str, Any]) -> str:
    """What torchgraft did with one example, in one line."""
    if "refused" in item:
        return (f"refused, nothing ran: it calls {item['refused']} (torch.load with "
                "weights_only=False would have run it)")
    info = item["info"]
    parts = [f"{plural(item['loaded_tensors'], 'tensor')} on {', '.join(item['loaded_on'])}"]
    if info.saved_devices != ["cpu"]:
        parts.append(f"saved on {', '.join(info.saved_devices)}")
    parts += [f"names keep the '{w.prefix}' of {w.source} (tg.graft and tg.convert remove it)"
              for w in info.wrappers]
    if info.weights_key:
        parts.append(f"weights under '{info.weights_key}'")
    if info.model_class:
        parts.append(f"class {info.model_class} not needed")
    parts.append(f"{info.format}, {human_bytes(info.totals.bytes)}")
    return "; ".join(parts)


def _labelled(console: Console, rows: list[tuple[str, str]]) -> None:
    """``label  text`` lines: prose cut at a terminal's width, wrapped when piped; code whole."""
    width = max(console.width - 14, 30)
    for label, text in rows:
        style = {"PyTorch": "red", "torchgraft": "green", "passed": "green",
                 "FAILED": "red"}.get(label, "cyan")
        text = one_line(text)
        lines = [text]
        if label not in ("do it", "") and len(text) > width:
            lines = [text[:width - 3] + "..."] if console.is_terminal else textwrap.wrap(
                text, width=width, break_long_words=False, break_on_hyphens=False)
        console.print(f"  [{style}]{label:<10}[/{style}]  {escape(lines[0])}", highlight=False,
                      soft_wrap=True)
        for more in lines[1:]:
            console.print(f"{'':14}{escape(more)}", highlight=False, soft_wrap=True)


def _print_tour(console: Console, opened: list[dict[str, Any]], grafts: list[GraftStep],
                kept: Path | None) -> None:
    from ..graft.report.summary import summary_rows

    console.print(intro(len(opened), len(grafts)), highlight=False)
    console.print()
    console.print("[bold]Part 1: open any checkpoint[/bold]")
    for number, item in enumerate(opened, start=1):
        console.rule(f"[bold]{number}. {escape(item['title'])}[/bold]", align="left",
                     style="dim")
        _labelled(console, [("PyTorch", item["plain_error"] or "works"),
                            ("torchgraft", _did(item)), ("do it", item["python"]),
                            ("", item["cli"])])
    console.print()
    console.print("[bold]Part 2: graft into models that differ[/bold]")
    for number, step in enumerate(grafts, start=len(opened) + 1):
        console.rule(f"[bold]{number}. {escape(step.title)}[/bold]", align="left", style="dim")
        _labelled(console, [("PyTorch", step.plain or "works"),
                            ("torchgraft", step.report.headline())])
        print_rows(console, [row for row in summary_rows(step.report) if row[1]][:4])
        _labelled(console, [("passed" if step.passed else "FAILED", step.check),
                            ("do it", step.python), ("", step.cli)])
    console.print()
    table = Table(title="What the tour showed", show_edge=False, header_style="bold",
                  title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("problem", overflow="fold")
    table.add_column("plain PyTorch", overflow="fold")
    table.add_column("torchgraft")
    for number, item in enumerate(opened, start=1):
        plain = "error" if item["plain_error"] else "works"
        done = "refused safely" if "refused" in item else "loaded"
        table.add_row(str(number), escape(item["title"]), plain, f"[green]{done}[/green]")
    for number, step in enumerate(grafts, start=len(opened) + 1):
        done = "[green]grafted, outputs checked[/green]" if step.passed else "[red]FAILED[/red]"
        table.add_row(str(number), escape(step.title), "error" if step.plain else "works", done)
    console.print(table)
    console.print()
    console.print("[bold]Try next[/bold]")
    for line in ("torchgraft inspect YOUR_CHECKPOINT",
                 "torchgraft graft YOUR_CHECKPOINT --model yourmodule:build --out model.safetensors"
                 " --html report.html",
                 "the docs, a page per task: docs/index.md"):
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
    if kept is not None:
        console.print(f"\nThe example files are kept in {escape(str(kept))}, with mymodels.py: "
                      "run the command lines above there.", highlight=False, soft_wrap=True)
    else:
        console.print("\nThe example files were written to a temporary folder, now removed; "
                      "--keep DIR keeps them.", highlight=False)


def _new_folder(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """``--keep``: a folder that does not exist yet (made here), or an empty one.

    Nothing is replaced: a folder holding files, a file, or a link to nothing is refused, and
    so is a folder that cannot be made (under a file, without permission), before any work.
    """
    if value is None:
        return None
    if value.is_dir() and any(value.iterdir()):
        raise click.BadParameter(f"'{value}' already holds files; give a new or empty folder",
                                 ctx=ctx, param=param)
    if value.is_symlink() and not value.exists():
        raise click.BadParameter(f"'{value}' is a link to nothing; give a new or empty folder",
                                 ctx=ctx, param=param)
    try:
        value.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(f"cannot make the folder '{value}' ({exc.strerror}); give a "
                                 "new or empty folder where you can write", ctx=ctx,
                                 param=param) from None
    return value


@click.command()
@click.option("--keep", "keep", type=click.Path(path_type=Path, file_okay=False), default=None,
              metavar="DIR", callback=_new_folder,
              help="Write the example checkpoints into DIR (new or empty) and keep them.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def demo(keep: Path | None, as_json: bool) -> int:
    """A guided tour: fourteen checkpoint problems, the plain PyTorch error, and the fix.

    Every file is read without running code from it and loaded on this machine's CPU,
    whatever device it was saved on; then checkpoints go into models that differ from them.
    Exit codes: 0 every step passed its check, 1 one did not, 2 bad input.
    """
    from ..demo import graft_tour, write_examples

    console = Console(soft_wrap=as_json)
    with tempfile.TemporaryDirectory(prefix="torchgraft-demo-") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with console.status("writing example checkpoints...") if not as_json else \
                contextlib.nullcontext():
            examples = write_examples(folder)
            opened = [_open_example(example) for example in examples]
            grafts = graft_tour(folder)
    if as_json:
        print_json(console, {
            "inspect": [{**o, "info": o["info"].to_dict()} if "info" in o else o for o in opened],
            "graft": [{"title": g.title, "problem": g.problem, "check": g.check,
                       "passed": g.passed, "plain_error": g.plain, "python": g.python,
                       "cli": g.cli, "report": g.report.to_dict()} for g in grafts],
            "kept": None if keep is None else str(keep)})
    else:
        _print_tour(console, opened, grafts, keep)
    return 0 if all(step.passed for step in grafts) else 1

