"""Atomic file writes: a failed or killed write never leaves a partial file at the destination."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import CheckpointWriteError, TorchgraftError

__all__ = ["atomic_dir", "atomic_path", "clean_stale"]


def _umask() -> int:
    """The process umask (read by setting it, then restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Temporary names carry the writing process's id, so a later write can tell stale ones.
_TEMP = ".{name}.tg-{pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(destination: Path) -> None:
    """Remove what killed writes to ``destination`` left beside it (their process is gone)."""
    clean_stale(destination.parent, f"{glob.escape(f'.{destination.name}.tg-')}*",
                destination=destination)


def clean_stale(folder: Path, names: str, *, destination: Path | None = None) -> None:
    """Remove temporaries (``.<name>.tg-<pid>-*``) of killed writes whose process is gone.

    Args:
        folder: Where they are.
        names: A glob pattern for their names.
        destination: For a killed folder swap: where to put back the old folder it moved out.
    """
    for leftover in folder.glob(names):
        pid = leftover.name.rpartition(".tg-")[2].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            if leftover.is_dir() and not leftover.is_symlink():
                old = leftover / "old"  # killed between moving the old folder out and the new in
                if destination is not None and old.exists() and not destination.exists():
                    os.replace(old, destination)
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def _writing(destination: Path) -> Iterator[None]:
    """Turn a failed write (full disk, read-only folder...) into an error naming it.

    A writer's error about the temporary file names the destination instead.
    """
    try:
        yield
    except TorchgraftError as exc:
        if exc.path is not None and f"{destination.parent}{os.sep}.{destination.name}.tg-" in \
                exc.path:
            exc.path = None
            exc.located(destination)
        raise
    except (OSError, RuntimeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckpointWriteError(f"cannot write it: {reason}; an existing file there is "
                                   "left as it was", path=destination) from exc


def _writable(path: str | os.PathLike[str], *, overwrite: bool) -> Path:
    """The destination as a Path, its folder created; an error if it exists and may not go."""
    destination = Path(path)
    if destination.exists() and not overwrite:
        raise TorchgraftError("already exists; pass overwrite=True (CLI: --overwrite) to "
                              "replace it", path=destination)
    with _writing(destination):
        destination.parent.mkdir(parents=True, exist_ok=True)
        _clean_stale(destination)
    return destination


def _commit(temporary: Path, destination: Path, *, overwrite: bool) -> None:
    """Move the finished file into place: replacing, or only if nothing is there yet."""
    if overwrite:
        os.replace(temporary, destination)
        return
    try:
        os.link(temporary, destination)  # atomic: fails if another writer got there first
    except FileExistsError:
        raise TorchgraftError("already exists (written meanwhile by another process); pass "
                              "overwrite=True to replace it", path=destination) from None
    except OSError:  # a filesystem without hard links
        if destination.exists():
            raise TorchgraftError("already exists; pass overwrite=True to replace it",
                                  path=destination) from None
        os.replace(temporary, destination)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and moved over it.

    With ``overwrite=False`` the move is exclusive: of two processes saving to one path, one
    succeeds and the other raises. A killed write leaves a ``.<name>.tg-<pid>-*.tmp`` file,
    removed by the next write to the same destination.

    Args:
        path: The destination.
        overwrite: Replace an existing file; otherwise an existing one is an error.

    Yields:
        The temporary file's path, to write to.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
        CheckpointWriteError: If the file cannot be written; the old one is left as it was.
    """
    destination = _writable(path, overwrite=overwrite)
    with _writing(destination):
        fd, name = tempfile.mkstemp(prefix=_TEMP.format(name=destination.name, pid=os.getpid()),
                                    suffix=".tmp", dir=destination.parent)
        os.close(fd)
    temporary = Path(name)
    try:
        with _writing(destination):
            yield temporary
            with temporary.open("rb+") as f:
                os.fsync(f.fileno())
            os.chmod(temporary, 0o666 & ~_umask())  # as open() would: mkstemp makes it 0600
            _commit(temporary, destination, overwrite=overwrite)
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
        CheckpointWriteError: If it cannot be written; the old one is left as it was.
    """
    destination = _writable(path, overwrite=overwrite)
    with _writing(destination):
        work = Path(tempfile.mkdtemp(prefix=_TEMP.format(name=destination.name,
                                                         pid=os.getpid()),
                                     dir=destination.parent))
    temporary = work / "new"
    try:
        with _writing(destination):
            yield temporary
            if destination.exists():
                if not overwrite:
                    raise TorchgraftError("already exists (written meanwhile by another "
                                          "process); pass overwrite=True to replace it",
                                          path=destination)
                if not _exchange(temporary, destination):
                    os.replace(destination, work / "old")  # restored by the next write if
                    os.replace(temporary, destination)    # killed between these two moves
            else:
                os.replace(temporary, destination)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``).

    A reader of ``b`` sees the old folder or the new one, never none. False where the system
    cannot (then the caller moves in two steps).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, exchange = -100, 2
    return int(renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange)) == 0
