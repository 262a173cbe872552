"""Filling tensors on an accelerator through pinned staging buffers, reads overlapping copies.

A tensor bound for a GPU is read from the file into one of a few pinned host buffers, then
copied to the device asynchronously; while that copy runs, the next tensor is read into the
next buffer. A buffer is reused only once the copy out of it has finished (an event per
buffer), so host memory stays at the buffers' size, never a CPU copy of the model. Tensors
larger than a buffer are read and copied in slices of it.

On a machine without a GPU the same pipeline runs with ordinary buffers and synchronous
copies (``pin=False``), which is how it is tested here.
"""

from __future__ import annotations

from typing import Any

import torch

from ..meta import TensorRef

__all__ = ["STAGING_BYTES", "StagedFiller"]

#: Bytes of one staging buffer; two buffers are used.
STAGING_BYTES = 64 * 1024 * 1024


class _Done:
    """Stands for a finished copy where there is no device event (CPU)."""

    def synchronize(self) -> None:
        """Nothing to wait for."""


class StagedFiller:
    """Fills device tensors from lazy tensors through a ring of staging buffers.

    Args:
        device: Where the targets are.
        buffer_bytes: Size of each staging buffer.
        buffers: How many buffers (2: one being read while the other is copied).
        pin: Use pinned (page-locked) buffers and asynchronous copies; by default when the
            device is CUDA.
    """

    def __init__(self, device: torch.device, *, buffer_bytes: int = STAGING_BYTES,
                 buffers: int = 2, pin: bool | None = None) -> None:
        self.device = device
        self.pin = device.type == "cuda" if pin is None else pin
        self.buffer_bytes = buffer_bytes
        self._buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, pin_memory=self.pin)
                         for _ in range(buffers)]
        self._pending: list[Any] = [_Done() for _ in range(buffers)]
        self._next = 0
        self._current = 0
        #: Copies made through the buffers (for tests and logs).
        self.staged = 0

    def _buffer(self) -> torch.Tensor:
        index = self._next
        self._next = (self._next + 1) % len(self._buffers)
        self._pending[index].synchronize()  # the copy out of this buffer has finished
        self._current = index
        return self._buffers[index]

    def _copied(self) -> None:
        if self.device.type == "cuda":
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
            self._pending[self._current] = event
        self.staged += 1

    def fill(self, ref: TensorRef, out: torch.Tensor) -> None:
        """Copy ``ref`` into ``out`` (same shape) through the staging buffers.

        Args:
            ref: The source tensor.
            out: The target, on :attr:`device`, contiguous.
        """
        meta = ref.meta
        if meta.nbytes <= self.buffer_bytes:
            staged = self._buffer()[:meta.nbytes].view(meta.dtype).view(meta.shape)
            ref.read_into(staged)
            out.detach().copy_(staged, non_blocking=self.pin)
            self._copied()
            return
        if len(meta.shape) == 0 or meta.shape[0] == 0:
            out.detach().copy_(ref.read())
            return
        # Larger than a buffer: slices of whole rows, each read from the full tensor's view.
        row_bytes = meta.nbytes // meta.shape[0]
        rows = max(1, self.buffer_bytes // max(row_bytes, 1))
        if row_bytes > self.buffer_bytes:
            out.detach().copy_(ref.read())
            return
        source = ref.read()  # memory-mapped where the format allows: pages, not a copy
        for start in range(0, meta.shape[0], rows):
            count = min(rows, meta.shape[0] - start)
            staged = self._buffer()[:count * row_bytes].view(meta.dtype).view(
                count, *meta.shape[1:])
            staged.copy_(source[start:start + count])
            out.detach()[start:start + count].copy_(staged, non_blocking=self.pin)
            self._copied()

    def finish(self) -> None:
        """Wait for every copy in flight."""
        for pending in self._pending:
            pending.synchronize()

