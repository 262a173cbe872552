"""What a format plug-in is: how it is recognised, and what opening a file gives back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import UnsupportedCheckpointError
from ..meta import TensorRef, dtype_name
from ..quantized import is_quantized

__all__ = ["Contents", "Format", "ReadOptions", "WriteJob", "closed_on_error", "unwritable"]


@contextmanager
def closed_on_error(*closers: Callable[[], None]) -> Iterator[None]:
    """Call ``closers`` (in reverse) if the body fails, then re-raise.

    A refused file so keeps no descriptor or mapping.

    Args:
        closers: What releases the resources opened so far (``source.close``...).

    Yields:
        Nothing.
    """
    try:
        yield
    except BaseException:
        for close in reversed(closers):
            close()
        raise


def unwritable(name: str, dtype: torch.dtype, fmt: str) -> str:
    """The message for a tensor whose dtype a format cannot store, with the fix.

    Args:
        name: The tensor's key.
        dtype: Its dtype.
        fmt: The format, in words (``"safetensors"``).

    Returns:
        The message.
    """
    fix = ("dequantize it with dtype=torch.float32 (--dtype float32)" if is_quantized(dtype)
           else "cast it with dtype=torch.float32 (--dtype float32)")
    return (f"'{name}' is {dtype_name(dtype)}, which {fmt} cannot store: {fix}, or write a "
            "torch file (.pt)")


def _numpy_has(dtype: torch.dtype) -> bool:
    try:
        torch.empty(0, dtype=dtype).numpy()
    except (TypeError, RuntimeError):
        return False
    return True


@dataclass(frozen=True)
class ReadOptions:
    """Options every format receives.

    Attributes:
        unsafe: Allow pickles to call globals outside the allow-list (runs code from the file).
        component: In a folder of several models (diffusers, sentence-transformers), the one
            part to open.
        follow_links: Follow links out of the checkpoint's folder that lead nowhere known
            (see :func:`~torchgraft.io.contain.contained`).
    """

    unsafe: bool = False
    component: str | None = None
    follow_links: bool = False

    def part(self) -> ReadOptions:
        """The options a part of this checkpoint is opened with (no component)."""
        return ReadOptions(unsafe=self.unsafe, follow_links=self.follow_links)


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
        closers, self.closers = self.closers, []
        for close in closers:
            close()

    def __enter__(self) -> Contents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class WriteJob:
    """What a writer writes: named lazy tensors, read one at a time, plus what goes beside them.

    Attributes:
        tensors: Name to lazy tensor, in the order to write.
        dtype: Cast floating-point tensors to this dtype while writing.
        metadata: String metadata (safetensors header, shard index).
        extras: Plain data to keep beside the weights (torch formats; safetensors as JSON
            strings in the metadata).
        weights_key: Where the weights go in a torch file with extras (``"state_dict"``).
        kinds: Name to module kind (``"linear"``...), for layouts that store some weights
            transposed (Paddle).
        legacy: For torch files: the pre-1.6 (non-zip) serialization.
        ranks: For DCP: lay the checkpoint out as this many ranks save it, rows split.
        progress: Called with (tensors done, total).
    """

    tensors: dict[str, TensorRef]
    dtype: torch.dtype | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    weights_key: str = ""
    kinds: dict[str, str | None] = field(default_factory=dict)
    legacy: bool = False
    ranks: int = 1
    progress: Callable[[int, int], None] | None = None

    def out_dtype(self, ref: TensorRef) -> torch.dtype:
        """The dtype a tensor is written with: ``dtype`` for floating and quantized tensors."""
        if self.dtype is not None and (ref.meta.dtype.is_floating_point
                                       or is_quantized(ref.meta.dtype)):
            return self.dtype
        return ref.meta.dtype

    def read(self, name: str) -> torch.Tensor:
        """Read one tensor as written: on the CPU, contiguous, cast.

        A fresh buffer is filled straight from the file where the format allows, so only
        this tensor is in memory.
        """
        ref = self.tensors[name]
        if is_quantized(ref.meta.dtype):
            value = ref.read()
            dtype = self.out_dtype(ref)
            return value if dtype == ref.meta.dtype else value.dequantize().to(dtype)
        buffer = torch.empty(ref.meta.shape, dtype=ref.meta.dtype)
        ref.read_into(buffer)
        return buffer.to(self.out_dtype(ref))

    def read_numpy(self, name: str, fmt: str, path: Path) -> Any:
        """Read one tensor as written, as a numpy array (formats that store numpy arrays).

        Raises:
            UnsupportedCheckpointError: For dtypes numpy lacks (bfloat16, quantized...).
        """
        dtype = self.out_dtype(self.tensors[name])
        if is_quantized(dtype) or not _numpy_has(dtype):
            raise UnsupportedCheckpointError(unwritable(name, dtype, fmt), path=path)
        return self.read(name).numpy()

    def read_all(self) -> dict[str, torch.Tensor]:
        """Every tensor as written, each in its own memory, tied names sharing theirs.

        For formats that need all tensors at once (torch.save, DCP). Each tensor gets its own
        storage: views into a memory-mapped source would make torch write the whole mapping.
        """
        out: dict[str, torch.Tensor] = {}
        by_alias: dict[Any, torch.Tensor] = {}
        for name, ref in self.tensors.items():
            if ref.alias_key not in by_alias:
                by_alias[ref.alias_key] = self.read(name)
            out[name] = by_alias[ref.alias_key]
        return out

    def done(self, count: int) -> None:
        """Report progress."""
        if self.progress is not None:
            self.progress(count, len(self.tensors))


@dataclass(frozen=True)
class Format:
    """A checkpoint format: its name, how to recognise it, and how to open it.

    Attributes:
        name: The name reported as ``Checkpoint.format``.
        open: Opens a path of this format.
        suffixes: File name endings of this format, e.g. ``(".safetensors",)``.
        magic: Recognises the format from a file's first bytes; checked before suffixes.
        claims_directory: Recognises a directory that is itself a checkpoint (DCP).
        writes: The name ``tg.save(format=...)`` uses for this format's writer, if it has one.
        write: Writes a job to a path (a temporary one: atomicity is the caller's).
    """

    name: str
    open: Callable[[Path, ReadOptions], Contents]
    suffixes: tuple[str, ...] = ()
    magic: Callable[[bytes], bool] | None = None
    claims_directory: Callable[[Path], bool] | None = None
    writes: str | None = None
    write: Callable[[WriteJob, Path], None] | None = None
