"""Reading many tensors straight into their targets: in byte ranges, a few threads, few calls.

Tensors whose bytes lie in a file exactly as the target holds them (same dtype, contiguous)
are sorted by file and offset; neighbours whose bytes follow each other form one run, read
by a single ``preadv`` into all their targets at once (one system call for up to
:data:`IOV_MAX` tensors). Runs are dealt into a few batches of about equal bytes, one batch
per thread, so the cost is one task per thread, not one per tensor, and the copies from the
page cache use every core (``preadv`` releases the GIL). Other tensors are read one by one
(:meth:`~torchgraft.meta.TensorRef.read_into`), in the same batches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..errors import CorruptCheckpointError, TorchgraftError, reading
from ..meta import TensorRef
from .source import file_named

__all__ = ["IOV_MAX", "RUN_BYTES", "Read", "batches", "plan_read", "read_all", "runs"]

#: Buffers one ``preadv`` call takes at most (the POSIX minimum, and Linux's limit).
IOV_MAX = 1024
#: Bytes of one run at most: enough runs to keep every thread busy on one large file.
RUN_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Read:
    """One tensor to read into its target.

    Attributes:
        name: The source key, for errors.
        ref: The lazy tensor.
        out: The target tensor (CPU).
        path: The file holding its bytes as stored, when known.
        offset: Where they start in that file.
    """

    name: str
    ref: TensorRef
    out: torch.Tensor
    path: str | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes."""
        return self.ref.meta.nbytes


def plan_read(name: str, ref: TensorRef, out: torch.Tensor) -> Read:
    """Describe a read, with its byte range where the bytes can go straight into ``out``.

    Args:
        name: The source key.
        ref: The lazy tensor.
        out: The target tensor.

    Returns:
        The read.
    """
    direct = (ref.span is not None and out.device.type == "cpu" and out.is_contiguous()
              and out.dtype == ref.meta.dtype and tuple(out.shape) == ref.meta.shape)
    if direct and ref.span is not None:
        path, offset = ref.span()
        return Read(name, ref, out, path, offset)
    return Read(name, ref, out)


def runs(reads: Sequence[Read]) -> list[list[Read]]:
    """Group reads into runs: byte ranges that follow each other in one file.

    Args:
        reads: The reads, in any order.

    Returns:
        The runs, in file order; a read without a byte range is a run of its own.
    """
    spans = sorted((r for r in reads if r.path is not None),
                   key=lambda r: (r.path or "", r.offset))
    out: list[list[Read]] = []
    size = 0
    for read in spans:
        last = out[-1][-1] if out else None
        if (last is not None and last.path == read.path and len(out[-1]) < IOV_MAX
                and last.offset + last.nbytes == read.offset and size < RUN_BYTES):
            out[-1].append(read)
            size += read.nbytes
        else:
            out.append([read])
            size = read.nbytes
    return out + [[r] for r in reads if r.path is None]


def batches(groups: Sequence[list[Read]], count: int) -> list[list[list[Read]]]:
    """Deal runs, in order, into at most ``count`` batches of about equal bytes.

    Args:
        groups: The runs.
        count: How many batches (threads).

    Returns:
        The batches; none is empty.
    """
    total = sum(r.nbytes for group in groups for r in group) or 1
    share = total / max(count, 1)
    out: list[list[list[Read]]] = [[]]
    filled = 0
    for group in groups:
        size = sum(r.nbytes for r in group)
        if out[-1] and filled + size / 2 > share * len(out) and len(out) < count:
            out.append([])
        out[-1].append(group)
        filled += size
    return [b for b in out if b]


def _read_run(fds: dict[str, int], run: list[Read]) -> None:
    """Read one run with ``preadv`` calls straight into its targets."""
    first = run[0]
    if first.path is None:
        with torch.no_grad():  # grad mode is per thread
            first.ref.read_into(first.out)
        return
    views = [r.out.detach().reshape(-1).view(torch.uint8).numpy().data
             for r in run if r.nbytes]
    offset = first.offset
    named = file_named(first.path)  # a held file's descriptor name: the file it stands for
    while views:
        try:
            with reading(named):
                count = os.preadv(fds[first.path], views, offset)
        except TorchgraftError as exc:
            raise exc.about(first.name) from exc.__cause__
        if count <= 0:
            raise CorruptCheckpointError(f"'{first.name}' or a tensor after it ends early: "
                                         "the file shrank while open", path=named)
        offset += count
        while views and count >= len(views[0]):
            count -= len(views[0])
            views.pop(0)
        if views and count:
            views[0] = views[0][count:]


def read_all(reads: Sequence[Read], *, threads: int,
             done: Callable[[int], None] | None = None) -> None:
    """Read every tensor into its target, in runs and batches.

    Args:
        reads: The reads.
        threads: How many threads read at once.
        done: Called, on this thread, with the number of tensors each finished batch held.
    """
    groups = runs(reads)
    paths = {r.path for group in groups for r in group if r.path is not None}
    fds: dict[str, int] = {}
    try:
        for path in paths:
            fds[path] = os.open(path, os.O_RDONLY)

        def work(batch: list[list[Read]]) -> int:
            for group in batch:
                _read_run(fds, group)
            return sum(len(group) for group in batch)

        parts = batches(groups, threads)
        if len(parts) <= 1:
            for part in parts:
                finished = work(part)
                if done is not None:
                    done(finished)
            return
        with ThreadPoolExecutor(len(parts)) as pool:
            for finished in pool.map(work, parts):
                if done is not None:
                    done(finished)
    finally:
        for fd in fds.values():
            os.close(fd)
