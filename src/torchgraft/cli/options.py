"""Options every command that reads a checkpoint takes: where its weights are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["source_options"]

F = TypeVar("F", bound=Callable[..., Any])


def source_options(command: F) -> F:
    """Add ``--weights-key``, ``--component`` and ``--follow-links`` to a command."""
    command = click.option(
        "--follow-links", is_flag=True,
        help="Follow links out of the checkpoint's folder (links into the Hugging Face Hub "
             "cache's blobs are followed anyway). Trusted folders only.")(command)
    command = click.option(
        "--component", default=None, metavar="NAME",
        help="In a folder of several models (diffusers pipeline, sentence-transformers), "
             "read this part alone, e.g. unet.")(command)
    return click.option(
        "--weights-key", default=None, metavar="KEY",
        help="Where the weights are in a training checkpoint, e.g. state_dict_ema.")(command)
