"""``torchgraft convert``: any checkpoint to any format, with a progress bar."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from ..dtype_names import CASTS
from ..text import one_line
from .checks import existing_file, shard_size, source_path
from .options import source_options
from .outputs import output_format
from .progress import steps
from .render import print_json
from .words import cli_words

__all__ = ["WRITES", "convert_command"]


#: The formats convert writes (Paddle needs the model: graft writes it).
WRITES = ["safetensors", "torch", "numpy", "dcp"]


@click.command("convert")
@click.argument("src", type=click.Path(path_type=Path), callback=source_path)
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(WRITES), default=None,
              help="Output format; dcp writes a torch.distributed.checkpoint folder. Default: "
                   "from DST's suffix (.safetensors; .pt, .pth, .bin, .ckpt, .tar; .npz); a "
                   "DST without a suffix needs --format (or --ranks, which writes dcp).")
@click.option("--dtype", type=click.Choice(CASTS, case_sensitive=False), default=None,
              metavar="DTYPE", help="Cast floating-point tensors (integer buffers are kept): "
                                    "fp16, bf16, fp32, fp64, float8_e4m3fn, float8_e5m2 or "
                                    "torch's names (float16...).")
@click.option("--legacy", is_flag=True,
              help="With torch output: the pre-1.6 layout, readable by PyTorch 1.0-1.5.")
@click.option("--rules", type=click.Path(path_type=Path), default=None, callback=existing_file,
              help="JSON/YAML file of [pattern, replacement] renames (null drops a key).")
@click.option("--drop-extras", is_flag=True,
              help="Write the weights only (by default plain extras such as epoch are kept).")
@click.option("--max-shard-size", default=None, callback=shard_size, metavar="SIZE",
              help="Shard safetensors or torch output, e.g. 2GB or 500MiB, with an "
                   "*.index.json beside the shards.")
@click.option("--keep-wrappers", is_flag=True,
              help="Keep the 'module.' / '_orig_mod.' prefixes (removed by default).")
@click.option("--experts", type=click.Choice(["per-expert", "mixtral"]), default=None,
              help="Write stacked MoE experts one per expert, as the Hub stores them.")
@click.option("--ranks", type=click.IntRange(min=1), default=None,
              help="Write DCP laid out as this many FSDP ranks save it (rows split, a file per "
                   "rank).")
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

    The output format comes from DST's suffix, or --format (a DST without a suffix needs it:
    --format dcp, or --ranks, writes a DCP folder). SRC is a file, a folder or a Hub id
    (org/name).
    Exit codes: 0 written, 2 bad input, 130 interrupted (nothing half-written is left).
    """
    if fmt is None and ranks is not None and not dst.suffix:
        fmt = "dcp"  # only DCP is laid out by rank
    writes = output_format(dst, fmt, option="DST", choices=WRITES)
    _fits(writes, legacy=legacy, ranks=ranks, max_shard_size=max_shard_size)
    if dst.exists() and not overwrite:
        raise click.UsageError(f"{dst} exists; pass --overwrite to replace it")
    from ..convert import convert  # torch: after the arguments are checked

    console = Console(soft_wrap=as_json)
    with steps(f"converting {one_line(src.name)}", quiet=quiet) as shown:
        report = convert(src, dst, format=writes, dtype=dtype, legacy=legacy, rules=rules,
                         drop_extras=drop_extras, max_shard_size=max_shard_size,
                         overwrite=overwrite, unsafe=unsafe, keep_wrappers=keep_wrappers,
                         ranks=ranks, experts=experts,
                         weights_key=weights_key, component=component,
                         follow_links=follow_links, progress_bytes=shown.counter("bytes"))
    if as_json:
        print_json(console, report.to_dict())
    else:
        lines = [one_line(_cli_line(line)) for line in str(report).splitlines()]
        console.print(escape("\n".join(lines[:1] if quiet else lines)), highlight=False)
    return 0


def _fits(writes: str, *, legacy: bool, ranks: int | None, max_shard_size: str | None) -> None:
    """Refuse options the output format does not take, before any work."""
    if legacy and writes != "torch":
        raise click.UsageError(f"--legacy writes torch files (.pt); this output is {writes}")
    if ranks is not None and writes != "dcp":
        raise click.UsageError(f"--ranks lays out a DCP folder (--format dcp); {writes} files "
                               "are not split by rank")
    if max_shard_size is not None and writes not in ("safetensors", "torch"):
        raise click.UsageError(f"--max-shard-size shards safetensors and torch files, not "
                               f"{writes}")


def _cli_line(line: str) -> str:
    """A line of the report with Python arguments as flags; lines naming keys are left as read."""
    return cli_words(line) if line.startswith("  wrappers") else line
