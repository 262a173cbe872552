"""``torchgraft inspect``: what a checkpoint holds, from metadata only."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from .checks import source_path
from .options import source_options
from .render import print_info, print_json

__all__ = ["inspect"]


@click.command()
@click.argument("path", type=click.Path(path_type=Path), callback=source_path)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--all", "show_all", is_flag=True, help="List every tensor (default: first 50).")
@source_options
@click.option("--unsafe", is_flag=True,
              help="Let the file's pickle call code outside the allow-list. Trusted files only.")
def inspect(path: Path, as_json: bool, show_all: bool, weights_key: str | None,
            component: str | None, follow_links: bool, unsafe: bool) -> int:
    """Show a checkpoint's format, devices, wrappers, totals, extras and tensors.

    PATH is a checkpoint file, a folder holding one, or a Hub id (org/name[@revision]) already
    in the local cache. Tensor data is not read; a safetensors, NumPy or torch.save
    state-dict file is summarised without importing torch. Exit codes: 0 shown, 2 bad input.
    """
    from ..quick_inspect import quick_inspect

    plain = not (unsafe or weights_key or component or follow_links)
    info = quick_inspect(path) if plain else None
    if info is None:
        from ..inspect import inspect as inspect_checkpoint

        info = inspect_checkpoint(path, unsafe=unsafe, weights_key=weights_key,
                                  component=component, follow_links=follow_links)
    console = Console(soft_wrap=as_json)
    if as_json:
        print_json(console, info.to_dict())
    else:
        print_info(console, info, limit=None if show_all else 50)
    return 0
