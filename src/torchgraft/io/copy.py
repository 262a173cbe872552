"""Appending a tensor's bytes to a file: copied in the kernel where it can be, else written.

A tensor stored contiguously and as it will be written (the same dtype) needs no trip
through this process's memory: ``os.copy_file_range`` moves the bytes between files (on
filesystems that support reflinks, without copying at all). Where the system cannot, the
writer reads the tensor instead.
"""

from __future__ import annotations

import errno
import os
from types import TracebackType

from ..errors import CorruptCheckpointError
from .source import file_named

__all__ = ["FileCopier"]

#: Errors that mean "not here" (another filesystem, an old kernel): fall back to reading.
_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}
_CHUNK = 1 << 30


class FileCopier:
    """Appends bytes, and byte ranges of source files, to an open destination file.

    Args:
        destination: The destination's file descriptor, positioned where bytes go.
    """

    def __init__(self, destination: int) -> None:
        self.destination = destination
        self._sources: dict[str, int] = {}
        self.supported = hasattr(os, "copy_file_range")

    def open(self, path: str) -> int:
        """The descriptor of a source file, opened once (before threads copy from it)."""
        if path not in self._sources:
            self._sources[path] = os.open(path, os.O_RDONLY)
        return self._sources[path]

    def copy(self, path: str, offset: int, nbytes: int, *, what: str,
             at: int | None = None) -> bool:
        """Append ``nbytes`` from ``path`` at ``offset``; ``False`` if the system cannot.

        With ``at``, the bytes go to that offset of the destination instead, and its file
        position does not move: several threads may copy at once (sources opened first with
        :meth:`open`).

        Raises:
            CorruptCheckpointError: If the source ends before the range does.
        """
        if not self.supported:
            return False
        source = self.open(path)
        if os.fstat(source).st_size < offset + nbytes:
            raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                         path=file_named(path))
        done = 0
        while done < nbytes:
            try:
                moved = os.copy_file_range(source, self.destination,
                                           min(nbytes - done, _CHUNK), offset + done,
                                           None if at is None else at + done)
            except OSError as exc:
                if exc.errno in _UNSUPPORTED and done == 0:
                    self.supported = False
                    return False
                raise
            if moved == 0:
                raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                             path=file_named(path))
            done += moved
        return True

    def write(self, data: bytes | memoryview, *, at: int | None = None) -> None:
        """Append bytes, all of them (an unbuffered write may take only part).

        With ``at``, the bytes go to that offset instead, and the file position does not move.
        """
        view = memoryview(data).cast("B")
        while view:
            written = (os.write(self.destination, view) if at is None
                       else os.pwrite(self.destination, view, at))
            if written <= 0:
                raise OSError(errno.EIO, "the write made no progress")
            view = view[written:]
            at = None if at is None else at + written

    def __enter__(self) -> FileCopier:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()
