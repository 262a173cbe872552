"""Atomic file writes: a failed or killed write never leaves a partial file at the destination."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import TorchgraftError

__all__ = ["atomic_dir", "atomic_path"]


def _umask() -> int:
    """The process umask (read by setting it, then restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _writable(path: str | os.PathLike[str], *, overwrite: bool) -> Path:
    """The destination as a Path, its folder created; an error if it exists and may not go."""
    destination = Path(path)
    if destination.exists() and not overwrite:
        raise TorchgraftError("already exists; pass overwrite=True (CLI: --overwrite) to "
                              "replace it", path=destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    return destination


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over it.

    Args:
        path: The destination.
        overwrite: Replace an existing file; otherwise an existing one is an error.

    Yields:
        The temporary file's path, to write to.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
    """
    destination = _writable(path, overwrite=overwrite)
    fd, name = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".tmp",
                                dir=destination.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        with temporary.open("rb+") as f:
            os.fsync(f.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # as open() would: mkstemp makes it 0600
        os.replace(temporary, destination)
        directory = os.open(destination.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory path beside ``path``; on success it is renamed to ``path``.

    Args:
        path: The destination directory.
        overwrite: Replace an existing file or directory; otherwise it is an error.

    Yields:
        A path that does not exist yet, for the writer to create.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
    """
    destination = _writable(path, overwrite=overwrite)
    work = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    temporary = work / "new"
    try:
        yield temporary
        if destination.exists():
            old = work / "old"
            os.replace(destination, old)
        os.replace(temporary, destination)
    finally:
        shutil.rmtree(work, ignore_errors=True)
