"""``torchgraft demo``: the seed scenarios, written as real checkpoints and opened."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..demo import write_examples
from ..errors import UnsafeCheckpointError
from ..inspect import inspect as inspect_checkpoint
from ..load import load
from .render import print_info, print_json

__all__ = ["demo"]


@click.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=None,
              help="Write the example checkpoints here (default: a temporary folder).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def demo(directory: Path | None, as_json: bool) -> int:
    """Write example checkpoints of the seed scenarios and open each one.

    Each is read without running code from it and loaded on this machine's CPU, whatever
    device it was saved on.
    """
    console = Console(soft_wrap=as_json)
    with tempfile.TemporaryDirectory(prefix="torchgraft-demo-") as tmp:
        folder = directory or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with console.status("writing example checkpoints..."):
            examples = write_examples(folder)
        results: list[dict[str, Any]] = []
        for example in examples:
            if example.expect_refusal:
                try:
                    inspect_checkpoint(example.path)
                except UnsafeCheckpointError as exc:
                    results.append({"title": example.title, "path": str(example.path),
                                    "refused": exc.global_name})
                    if not as_json:
                        console.rule(f"[bold]{example.title}[/bold]")
                        console.print(f"  [dim]{example.problem}[/dim]")
                        console.print(f"  [green]refused[/green]: {exc.message}")
                    continue
                raise click.ClickException(f"{example.path} was not refused")
            info = inspect_checkpoint(example.path)
            weights = load(example.path)
            total = sum(t.numel() for t in weights.values())
            results.append({"title": example.title, "problem": example.problem,
                            "loaded_tensors": len(weights), "loaded_parameters": total,
                            "loaded_on": sorted({str(t.device) for t in weights.values()}),
                            "info": info.to_dict()})
            if not as_json:
                console.rule(f"[bold]{example.title}[/bold]")
                console.print(f"  [dim]{example.problem}[/dim]")
                print_info(console, info, limit=4)
                console.print(f"  [green]loaded[/green] {len(weights)} tensors ({total:,} "
                              "parameters) onto cpu")
        if as_json:
            print_json(console, results)
    return 0
