"""``torchgraft demo``: everyday checkpoint problems, written as real files, opened and grafted."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..demo import Example, graft_tour, write_examples
from ..errors import UnsafeCheckpointError
from ..inspect import inspect as inspect_checkpoint
from ..load import load
from .render import print_info, print_json, print_report

__all__ = ["demo"]


def _open_example(example: Example) -> dict[str, Any]:
    """Inspect and load one example; the payload example must be refused."""
    if example.expect_refusal:
        try:
            inspect_checkpoint(example.path)
        except UnsafeCheckpointError as exc:
            return {"title": example.title, "problem": example.problem,
                    "path": str(example.path), "refused": exc.global_name,
                    "message": exc.message}
        raise click.ClickException(f"{example.path} was not refused")
    info = inspect_checkpoint(example.path)
    weights = load(example.path)
    return {"title": example.title, "problem": example.problem,
            "loaded_tensors": len(weights),
            "loaded_parameters": sum(t.numel() for t in weights.values()),
            "loaded_on": sorted({str(t.device) for t in weights.values()}),
            "info": info}


@click.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="Write the example checkpoints here (default: a temporary folder).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def demo(directory: Path | None, as_json: bool) -> int:
    """A guided tour: example checkpoints opened and grafted.

    Every file is read without running code from it and loaded on this machine's CPU,
    whatever device it was saved on; then checkpoints go into models that differ from them.
    """
    console = Console(soft_wrap=as_json)
    with tempfile.TemporaryDirectory(prefix="torchgraft-demo-") as tmp:
        folder = directory or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with console.status("writing example checkpoints..."):
            examples = write_examples(folder)
        opened = [_open_example(example) for example in examples]
        with console.status("grafting..."):
            grafts = graft_tour(folder)
    if as_json:
        print_json(console, {
            "inspect": [{**o, "info": o["info"].to_dict()} if "info" in o else o for o in opened],
            "graft": [{"title": g.title, "problem": g.problem, "check": g.check,
                       "passed": g.passed, "report": g.report.to_dict()} for g in grafts]})
        return 0
    console.rule("[bold]1. Open any checkpoint[/bold]")
    for item in opened:
        console.rule(f"[bold]{item['title']}[/bold]", style="dim")
        console.print(f"  [dim]{item['problem']}[/dim]")
        if "refused" in item:
            console.print(f"  [green]refused[/green]: {item['message']}")
            continue
        print_info(console, item["info"], limit=4)
        console.print(f"  [green]loaded[/green] {item['loaded_tensors']} tensors "
                      f"({item['loaded_parameters']:,} parameters) onto cpu")
    console.rule("[bold]2. Graft into models that differ[/bold]")
    for step in grafts:
        console.rule(f"[bold]{step.title}[/bold]", style="dim")
        console.print(f"  [dim]{step.problem}[/dim]")
        print_report(console, step.report)
        mark = "[green]check passed[/green]" if step.passed else "[red]check FAILED[/red]"
        console.print(f"  {mark}: {step.check}")
    return 0 if all(step.passed for step in grafts) else 1
