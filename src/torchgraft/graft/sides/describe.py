"""What the two sides of a graft state of their models: head counts from modules, configs, files."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from ...checkpoint import Checkpoint
from ...errors import TorchgraftError
from .config import read_config
from .heads import Described, config_heads, model_heads
from .source import GraftSource

__all__ = ["describe_sides"]


def _folder_config(source: Any) -> dict[str, Any] | None:
    """The config.json beside a checkpoint path (or in its folder), if it has a readable one."""
    path = source.path if isinstance(source, Checkpoint) else source
    if not isinstance(path, (str, os.PathLike)):
        return None
    folder = Path(path)
    try:
        return read_config(folder if folder.is_dir() else folder.parent)
    except TorchgraftError:  # an unreadable config describes nothing; verification says why
        return None


def describe_sides(source: Any, opened: GraftSource, target: nn.Module, *,
                   modules: Iterable[tuple[str, nn.Module]] | None = None) -> Described:
    """What a graft's source and model state of their head counts.

    Args:
        source: The graft's source as given (a path, a module...).
        opened: The opened source (its module, its format's stated head sizes).
        target: The model.
        modules: The model's ``named_modules()``, if already walked.

    Returns:
        The source's counts (its module's; else its config.json's and its format's metadata),
        the model's, and whether the source is a module.
    """
    counts, attention = model_heads(target, modules=modules)
    if opened.module is not None:
        return Described(model_heads(opened.module)[0], counts, "the source module",
                         source_is_module=True, target_attention=attention)
    config = _folder_config(source)
    stated = config_heads(config) if config is not None else {}
    if opened.side.head_dims and "head size" not in stated:
        stated["head size"] = frozenset(opened.side.head_dims.values())
    where = "its config.json" if config is not None else "the checkpoint's metadata"
    return Described(stated, counts, where, target_attention=attention)
