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

    def copy(self, path: str, offset: int, nbytes: int, *, what: str) -> bool:
        """Append ``nbytes`` from ``path`` at ``offset``; ``False`` if the system cannot.

        Raises:
            CorruptCheckpointError: If the source ends before the range does.
        """
        if not self.supported:
            return False
        if path not in self._sources:
            self._sources[path] = os.open(path, os.O_RDONLY)
        source = self._sources[path]
        if os.fstat(source).st_size < offset + nbytes:
            raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                         path=path)
        done = 0
        while done < nbytes:
            try:
                moved = os.copy_file_range(source, self.destination,
                                           min(nbytes - done, _CHUNK), offset + done)
            except OSError as exc:
                if exc.errno in _UNSUPPORTED and done == 0:
                    self.supported = False
                    return False
                raise
            if moved == 0:
                raise CorruptCheckpointError(f"{what} ends early: the file shrank while open",
                                             path=path)
            done += moved
        return True

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes, all of them (an unbuffered write may take only part)."""
        view = memoryview(data).cast("B")
        while view:
            written = os.write(self.destination, view)
            if written <= 0:
                raise OSError(errno.EIO, "the write made no progress")
            view = view[written:]

    def __enter__(self) -> FileCopier:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for fd in self._sources.values():
            os.close(fd)
        self._sources.clear()
