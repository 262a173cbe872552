"""A byte range of a file seen as a file of its own: a chunk's archive inside a ``.distcp``.

Every read is checked against the range, then against the file (its own check), so nothing
outside the range is ever read; tensors of an archive in the range keep positioned reads,
and a rank reading a block of a chunk reads only that block's bytes.
"""

from __future__ import annotations

import io

import torch

from .source import ByteSource, FileSource

__all__ = ["Window", "WindowStream"]


class Window(FileSource):
    """Bytes ``[start, start + length)`` of ``file``, addressed from 0.

    Args:
        file: The whole file.
        start: The range's first byte in it.
        length: The range's size.
    """

    def __init__(self, file: FileSource, start: int, length: int) -> None:
        file.check_range(start, length, what="a stored item")
        ByteSource.__init__(self, f"{file.name}[{start}:+{length}]", length)
        self.path = file.path
        self.file = file
        self.start = start

    def read(self, offset: int, nbytes: int, *, what: str = "data") -> bytes:
        """Read bytes of the range, checking them against it first."""
        self.check_range(offset, nbytes, what=what)
        return self.file.read(self.start + offset, nbytes, what=what)

    def read_into(self, offset: int, out: torch.Tensor, *, what: str = "data") -> None:
        """Copy bytes of the range straight into a contiguous CPU tensor."""
        self.check_range(offset, out.numel() * out.element_size(), what=what)
        self.file.read_into(self.start + offset, out, what=what)

    def _raw(self, offset: int, nbytes: int) -> torch.Tensor:
        return self.file._raw(self.start + offset, nbytes)

    def _mapped(self, offset: int, nbytes: int, dtype: torch.dtype,
                shape: tuple[int, ...]) -> torch.Tensor | None:
        return self.file._mapped(self.start + offset, nbytes, dtype, shape)

    def place(self, offset: int) -> tuple[str, int]:
        """The whole file's held name, and where byte ``offset`` of the range lies in it."""
        return self.file.place(self.start + offset)

    def close(self) -> None:
        """Nothing to close: the whole file's source owns the descriptor."""


class WindowStream(io.RawIOBase):
    """A seekable read-only stream over a :class:`Window` (for ``zipfile``)."""

    def __init__(self, window: Window) -> None:
        super().__init__()
        self.window = window
        self.position = 0

    def readable(self) -> bool:
        """A stream to read."""
        return True

    def seekable(self) -> bool:
        """It seeks."""
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move within the range (clamped to it)."""
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.window.size}
        self.position = min(max(base[whence] + offset, 0), self.window.size)
        return self.position

    def tell(self) -> int:
        """Where the next read starts."""
        return self.position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Read up to ``len(buffer)`` bytes, fewer at the range's end."""
        count = min(len(buffer), self.window.size - self.position)
        if count <= 0:
            return 0
        memoryview(buffer)[:count] = self.window.read(self.position, count)
        self.position += count
        return count
