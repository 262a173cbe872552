"""``torchgraft convert``: any checkpoint to any format, with a progress bar."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from .options import source_options
from .render import print_json
from .text import one_line

__all__ = ["convert_command"]


@click.command("convert")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["torch", "safetensors", "numpy", "dcp"]),
              default=None, help="Output format (default: from DST's suffix; none: DCP).")
@click.option("--dtype", default=None, help="Cast floating-point tensors: fp16, bf16, fp32...")
@click.option("--legacy", is_flag=True, help="torch output readable by PyTorch 1.0-1.5.")
@click.option("--rules", type=click.Path(path_type=Path), default=None,
              help="JSON/YAML file of [pattern, replacement] renames (null drops a key).")
@click.option("--drop-extras", is_flag=True, help="Write the weights only.")
@click.option("--max-shard-size", default=None, help="Shard the output, e.g. 2GB.")
@click.option("--keep-wrappers", is_flag=True,
              help="Keep the 'module.' / '_orig_mod.' prefixes (removed by default).")
@click.option("--experts", type=click.Choice(["per-expert", "mixtral"]), default=None,
              help="Write stacked MoE experts one per expert, as the Hub stores them.")
@click.option("--ranks", type=click.IntRange(min=1), default=None,
              help="DCP: write as this many FSDP ranks save it (rows split, a file per rank).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--unsafe", is_flag=True, help="Let SRC's pickle run code. Trusted files only.")
@source_options
@click.option("--quiet", "-q", is_flag=True, help="Print the one-line summary only.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def convert_command(src: Path, dst: Path, fmt: str | None, dtype: str | None, legacy: bool,
                    rules: Path | None, drop_extras: bool, max_shard_size: str | None,
                    keep_wrappers: bool, experts: str | None, ranks: int | None,
                    overwrite: bool, unsafe: bool,
                    weights_key: str | None, component: str | None, follow_links: bool, quiet: bool,
                    as_json: bool) -> int:
    """Convert checkpoint SRC (any format) to DST, one tensor in memory at a time.

    Exit codes: 0 written, 2 bad input.
    """
    from ..convert import convert

    console = Console(soft_wrap=as_json)
    with Progress(console=Console(stderr=True), transient=True, disable=quiet) as bar:
        task = bar.add_task("converting", total=None)
        report = convert(src, dst, format=fmt, dtype=dtype, legacy=legacy, rules=rules,
                         drop_extras=drop_extras, max_shard_size=max_shard_size,
                         overwrite=overwrite, unsafe=unsafe, keep_wrappers=keep_wrappers,
                         ranks=ranks, experts=experts,
                         weights_key=weights_key, component=component,
                         follow_links=follow_links,
                         progress=lambda done, total: bar.update(task, completed=done,
                                                                 total=total))
    if as_json:
        print_json(console, report.to_dict())
    else:
        lines = [one_line(line) for line in str(report).splitlines()]
        console.print(escape("\n".join(lines[:1] if quiet else lines)), highlight=False)
    return 0
