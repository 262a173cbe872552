"""What a format plug-in is: how it is recognised, and what opening a file gives back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Contents", "Format", "ReadOptions"]


@dataclass(frozen=True)
class ReadOptions:
    """Options every format receives.

    Attributes:
        unsafe: Allow pickles to call globals outside the allow-list (runs code from the file).
    """

    unsafe: bool = False


@dataclass
class Contents:
    """An opened checkpoint: its object tree with lazy tensors, before weights are picked out.

    Attributes:
        format: The format's name, e.g. ``"torch-zip"``.
        path: The file or directory opened.
        root: The saved object: dicts, lists, :class:`~torchgraft.meta.TensorRef` leaves,
            :class:`~torchgraft.safe_pickle.PickledObject` records, plain values.
        closers: Called by :meth:`close`.
    """

    format: str
    path: Path
    root: Any
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Release files and mappings held by the format."""
        for close in self.closers:
            close()
        self.closers.clear()


@dataclass(frozen=True)
class Format:
    """A checkpoint format: its name, how to recognise it, and how to open it.

    Attributes:
        name: The name reported as ``Checkpoint.format``.
        open: Opens a path of this format.
        suffixes: File name endings of this format, e.g. ``(".safetensors",)``.
        magic: Recognises the format from a file's first bytes; checked before suffixes.
        claims_directory: Recognises a directory that is itself a checkpoint (DCP).
    """

    name: str
    open: Callable[[Path, ReadOptions], Contents]
    suffixes: tuple[str, ...] = ()
    magic: Callable[[bytes], bool] | None = None
    claims_directory: Callable[[Path], bool] | None = None
