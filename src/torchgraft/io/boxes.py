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

__all__ = ["box_reader", "box_runs", "permuted_reader", "storage_order"]


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


def storage_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """The order of dimensions in which a strided tensor is stored contiguously, if any.

    A transposed (or otherwise permuted) tensor saved as it was, such as ``w.t()`` or a
    channels-last image batch, is a row-major tensor whose dimensions were reordered: its
    blocks are still runs of bytes, in that order.

    Args:
        shape: The tensor's shape.
        stride: Its strides, in elements.

    Returns:
        The dimensions from the outermost in storage to the innermost; ``None`` where the
        tensor has gaps or overlaps (no permutation makes it contiguous).
    """
    order = tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))
    permuted = torch.empty_strided(shape, stride, device="meta").permute(order)
    return order if permuted.is_contiguous() else None


def permuted_reader(shape: tuple[int, ...], dtype: torch.dtype, order: tuple[int, ...],
                    read_at: Callable[[int, torch.Tensor], None],
                    ) -> Callable[[tuple[int, ...], torch.Tensor], None]:
    """A :meth:`~torchgraft.meta.TensorRef.read_box` for a tensor stored in ``order``.

    The block is read as a block of the stored (permuted) tensor, only its bytes, into a
    buffer of the block's size, then put back in the tensor's own order.

    Args:
        shape: The tensor's shape.
        dtype: Its dtype.
        order: Its dimensions in storage order (:func:`storage_order`).
        read_at: As for :func:`box_reader`.

    Returns:
        A function filling a tensor (the block's shape, any layout) from the block at an index.
    """
    stored = box_reader(tuple(shape[d] for d in order), dtype, read_at)
    back = tuple(order.index(d) for d in range(len(order)))

    def read_box(start: tuple[int, ...], out: torch.Tensor) -> None:
        block = torch.empty(tuple(out.shape[d] for d in order), dtype=dtype)
        stored(tuple(start[d] for d in order), block)
        out.copy_(block.permute(back))

    return read_box
