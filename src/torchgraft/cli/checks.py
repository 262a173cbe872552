"""Argument checks that need no torch: a bad argument exits 2 in well under a second.

Each is a click callback (or type), run while the command line is parsed, before a command
imports torch (1-4 s): a missing file, a name no format writes, JSON that does not parse, a
size or a dtype that does not exist is a message naming the option, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ..errors import TorchgraftError
from ..hub_ids import repo_id
from ..units import parse_size
from .factory import parse_spec

__all__ = ["MAX_INPUT_VALUES", "existing_file", "factory_spec", "input_shape", "json_object",
           "label_rows", "shard_size", "source_path"]


def source_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A checkpoint to read: an existing file or folder, or a Hub id (``org/name[@rev]``)."""
    if value is None or value.exists() or repo_id(str(value)) is not None:
        return value
    raise click.UsageError(f"{value}: no such file or directory", ctx=ctx)


def existing_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file the command reads (rules, inputs): it must exist and be a file."""
    if value is None or value.is_file():
        return value
    what = "a folder, not a file" if value.is_dir() else "no such file"
    raise click.UsageError(f"{param.opts[0]} {value}: {what}", ctx=ctx)


def json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Keyword arguments as a JSON object (kept as text: the factory gets it parsed)."""
    if value is None:
        return None
    try:
        data: Any = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", ctx=ctx, param=param) from None
    if not isinstance(data, dict):
        raise click.BadParameter("must be a JSON object, such as '{\"num_classes\": 21}'",
                                 ctx=ctx, param=param)
    return value


def shard_size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A size such as ``2GB`` or ``500MiB`` (kept as text: the library parses it again)."""
    if value is None:
        return None
    try:
        parse_size(value)
    except TorchgraftError:
        raise click.BadParameter(f"'{value}' is not a size such as 2GB or 500MiB", ctx=ctx,
                                 param=param) from None
    return value


def factory_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``MODULE:FACTORY``, spelled so, a ``.py`` file it names there."""
    if value is None:
        return None
    try:
        parse_spec(value, option=param.opts[0])
    except TorchgraftError as exc:
        raise click.UsageError(str(exc), ctx=ctx) from None
    return value


def label_rows(ctx: click.Context, param: click.Parameter,
              value: str | None) -> list[int | None] | dict[int, int] | None:
    """``--label-map``: a JSON list of rows (null for new ones) or an object of row pairs."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not JSON: {exc}", ctx=ctx, param=param) from None
    if isinstance(data, dict) and all(k.isascii() and k.isdigit() and _row(v)
                                      for k, v in data.items()):
        return {int(k): v for k, v in data.items()}
    if isinstance(data, list) and all(v is None or _row(v) for v in data):
        return data
    raise click.BadParameter("give a list of checkpoint rows (null for a new row) or an object "
                             '{"model_row": checkpoint_row}', ctx=ctx, param=param)


def _row(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: ``--input-shape`` makes at most this many values (a batch of 16 images of 1024 x 1024).
MAX_INPUT_VALUES = 1 << 26
#: ... of at most this many dimensions.
_MAX_DIMENSIONS = 8


def input_shape(ctx: click.Context, param: click.Parameter,
                value: str | None) -> tuple[int, ...] | None:
    """``--input-shape 1,3,224,224``: whole sizes from 1, a few dimensions, a bounded count."""
    if value is None:
        return None
    parts = value.replace(" ", "").split(",")
    if len(parts) > _MAX_DIMENSIONS or not all(
            part.isascii() and part.isdigit() and len(part) < 12 and int(part) > 0
            for part in parts):
        raise click.BadParameter(f"'{value}' is not a shape such as 1,3,224,224 (sizes from 1, "
                                 f"at most {_MAX_DIMENSIONS} of them)", ctx=ctx, param=param)
    shape = tuple(int(part) for part in parts)
    count = 1
    for size in shape:
        count *= size
    if count > MAX_INPUT_VALUES:
        raise click.BadParameter(f"{value} makes {count:,} values; an input is at most "
                                 f"{MAX_INPUT_VALUES:,}", ctx=ctx, param=param)
    return shape
