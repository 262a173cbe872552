"""Reading a block of a stored tensor (a rank's shard) as the few byte ranges that hold it.

A tensor stored contiguously in row-major order keeps any block of it in runs of contiguous
bytes: rows ``a:b`` of a matrix are one run, columns ``a:b`` are one run per row. A reader
that can read a byte range of a tensor (checking it against the file, as every reader does)
reads a block with :func:`box_reader`, touching those runs and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import product

import torch

__all__ = ["box_reader", "box_runs"]


def box_runs(shape: tuple[int, ...], itemsize: int, start: tuple[int, ...],
             size: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """The contiguous byte runs of a block of a row-major tensor, in the block's order.

    Args:
        shape: The whole tensor's shape.
        itemsize: Bytes per element.
        start: The block's first index in each dimension.
        size: The block's extent in each dimension.

    Yields:
        ``(offset, nbytes)`` of each run, relative to the tensor's first byte.
    """
    if math.prod(size) == 0:
        return
    strides = [itemsize * math.prod(shape[d + 1:]) for d in range(len(shape))]
    inner = len(shape)  # dims inner..end are whole: one run spans them
    while inner > 0 and start[inner - 1] == 0 and size[inner - 1] == shape[inner - 1]:
        inner -= 1
    if inner == 0:
        yield 0, itemsize * math.prod(shape)
        return
    run = size[inner - 1] * strides[inner - 1]
    outer = [range(start[d], start[d] + size[d]) for d in range(inner - 1)]
    base = start[inner - 1] * strides[inner - 1]
    for index in product(*outer):
        yield base + sum(i * strides[d] for d, i in enumerate(index)), run


def box_reader(shape: tuple[int, ...], dtype: torch.dtype,
               read_at: Callable[[int, torch.Tensor], None],
               ) -> Callable[[tuple[int, ...], torch.Tensor], None]:
    """A :meth:`~torchgraft.meta.TensorRef.read_box` for a tensor stored contiguously.

    Args:
        shape: The tensor's shape.
        dtype: Its dtype.
        read_at: Fills a contiguous uint8 tensor with the bytes at an offset relative to the
            tensor's first byte (the reader checks the range against the file).

    Returns:
        A function filling a contiguous tensor (the block's shape) from the block at an index.
    """
    def read_box(start: tuple[int, ...], out: torch.Tensor) -> None:
        flat = out.view(-1).view(torch.uint8)
        done = 0
        for offset, nbytes in box_runs(shape, dtype.itemsize, start, tuple(out.shape)):
            read_at(offset, flat[done:done + nbytes])
            done += nbytes

    return read_box
