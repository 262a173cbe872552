"""Atomic file writes: a failed or killed write never leaves a partial file at the destination."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import os
import secrets
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import CheckpointWriteError, TorchgraftError

__all__ = ["abandon", "alive", "atomic_dir", "atomic_path", "clean_stale", "under_way"]


def _umask() -> int:
    """The process umask (read by setting it, then restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Temporary names carry the writing process's id, so a later write can tell stale ones.
_TEMP = ".{name}.tg-{pid}-"


#: Held while a finished write is moved into place, and by :func:`abandon` to the end.
_COMMITTING = threading.RLock()
#: What to remove if the process must end now, for each write under way.
_UNDER_WAY: dict[int, Callable[[], None]] = {}


@contextlib.contextmanager
def under_way(cleanup: Callable[[], None]) -> Iterator[None]:
    """Register what removes a write's leftovers while it runs, for :func:`abandon`.

    Args:
        cleanup: Removes what the write has put on disk so far (and puts back what it moved
            out); it may run while the write goes on in another thread.
    """
    token = id(cleanup)
    with _COMMITTING:
        _UNDER_WAY[token] = cleanup
    try:
        yield
    finally:
        with _COMMITTING:
            _UNDER_WAY.pop(token, None)


def abandon(timeout: float = 5.0) -> None:
    """Remove the leftovers of every write under way, for a process that ends right after.

    A commit in progress finishes first; none starts afterwards (the lock is kept: the caller
    ends the process, as the command line does on Ctrl-C when a copy does not stop at once).
    Unnamed temporaries need nothing: they vanish with the process.

    Args:
        timeout: How long to wait for a commit in progress.
    """
    _COMMITTING.acquire(timeout=timeout)
    for cleanup in list(_UNDER_WAY.values()):
        with contextlib.suppress(OSError):
            cleanup()


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (one of another user's counts as running)."""
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
        if not _ours(leftover):
            continue  # another user's (a shared folder): never adopted, never removed
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            if leftover.is_dir() and not leftover.is_symlink():
                old = leftover / "old"  # killed between moving the old folder out and the new in
                if destination is not None and old.exists() and not destination.exists():
                    os.replace(old, destination)
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)


def _ours(path: Path) -> bool:
    """Whether this user owns ``path`` (and, for a folder, what a swap keeps in it)."""
    try:
        uid = os.getuid()
        if path.lstat().st_uid != uid:
            return False
        old = path / "old"
        return not path.is_dir() or not old.exists() or old.lstat().st_uid == uid
    except OSError:
        return False


def _temporary_name(path: str | None, destination: Path, unnamed: Path | None) -> bool:
    """Whether an error's path is this write's temporary (never a file it reads from)."""
    return path is not None and (
        f"{destination.parent}{os.sep}.{destination.name}.tg-" in path
        or (unnamed is not None and path == str(unnamed)))


@contextlib.contextmanager
def _writing(destination: Path, unnamed: Path | None = None) -> Iterator[None]:
    """Turn a failed write (full disk, read-only folder...) into an error naming it.

    A writer's error about the temporary file (``unnamed``: the unnamed file's
    ``/proc/self/fd`` name) names the destination instead; an error about a file the write
    reads keeps that file's name. torch's ``CheckpointException`` (a DCP save's failures,
    gathered from its ranks) becomes a :class:`CheckpointWriteError` too.
    """
    try:
        yield
    except TorchgraftError as exc:
        if _temporary_name(exc.path, destination, unnamed):
            exc.path = None
            exc.located(destination)
        raise
    except (OSError, RuntimeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckpointWriteError(f"cannot write it: {reason}; an existing file there is "
                                   "left as it was", path=destination) from exc
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if type(exc).__name__ != "CheckpointException":
            raise
        if _interrupted(exc):
            raise KeyboardInterrupt from exc
        raise CheckpointWriteError(f"cannot write it: {_first_failure(exc)}; an existing "
                                   "checkpoint there is left as it was",
                                   path=destination) from exc


def _failures(exc: BaseException) -> list[BaseException]:
    """Each rank's error inside torch's ``CheckpointException``.

    torch keeps each as ``(exception, frames)`` (or an object with ``.exc``).
    """
    failures = getattr(exc, "failures", None)
    found: list[BaseException] = []
    for failure in failures.values() if isinstance(failures, dict) else ():
        inner = getattr(failure, "exc", failure)
        if isinstance(inner, tuple) and inner:
            inner = inner[0]
        if isinstance(inner, BaseException):
            found.append(inner)
    return found


def _interrupted(exc: BaseException) -> bool:
    """Whether a rank of torch's ``CheckpointException`` stopped on Ctrl-C."""
    return any(isinstance(inner, KeyboardInterrupt) for inner in _failures(exc))


def _first_failure(exc: BaseException) -> str:
    """The first rank's error inside torch's ``CheckpointException``."""
    failures = _failures(exc)
    if failures:
        inner = failures[0]
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror
        return str(inner).splitlines()[0] if str(inner) else type(inner).__name__
    return str(exc)


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


def _anonymous(folder: Path) -> int | None:
    """An unnamed file in ``folder`` (Linux ``O_TMPFILE``), or ``None`` where there is none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError:
        return None


def _link_unnamed(fd: int, target: Path) -> None:
    """Give the unnamed file ``fd`` the name ``target`` (which must not exist).

    ``linkat(fd, "", AT_EMPTY_PATH)`` where allowed, else through ``/proc/self/fd``.

    Raises:
        FileExistsError: If ``target`` exists.
        OSError: If the system links it neither way.
    """
    try:
        linkat = ctypes.CDLL(None, use_errno=True).linkat
    except (OSError, AttributeError):
        linkat = None
    if linkat is not None:
        at_cwd, at_empty_path = -100, 0x1000
        if int(linkat(fd, b"", at_cwd, os.fsencode(target), at_empty_path)) == 0:
            return
        if ctypes.get_errno() == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    os.link(f"/proc/self/fd/{fd}", target, follow_symlinks=True)


def _commit_unnamed(fd: int, destination: Path, *, overwrite: bool) -> None:
    """Name the finished unnamed file: the destination itself, or a temporary moved over it.

    Where the system can name it neither way, its bytes are copied into a named temporary.
    """
    if overwrite:
        named = destination.with_name(_TEMP.format(name=destination.name, pid=os.getpid())
                                      + f"{secrets.token_hex(4)}.tmp")
    else:
        named = destination
    try:
        _link_unnamed(fd, named)
    except FileExistsError:
        raise TorchgraftError("already exists (written meanwhile by another process); pass "
                              "overwrite=True to replace it", path=destination) from None
    except OSError:
        handle, name = tempfile.mkstemp(prefix=_TEMP.format(name=destination.name,
                                                            pid=os.getpid()),
                                        suffix=".tmp", dir=destination.parent)
        try:
            with os.fdopen(handle, "wb") as copy, os.fdopen(os.dup(fd), "rb") as source:
                source.seek(0)
                shutil.copyfileobj(source, copy, 1 << 24)
                copy.flush()
                os.fsync(copy.fileno())
            os.chmod(name, 0o666 & ~_umask())
            _commit(Path(name), destination, overwrite=overwrite)
        finally:
            Path(name).unlink(missing_ok=True)
        return
    if named != destination:
        try:
            os.replace(named, destination)
        finally:
            named.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, overwrite: bool = False,
                unnamed: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and moved over it.

    With ``overwrite=False`` the move is exclusive: of two processes saving to one path, one
    succeeds and the other raises. With ``unnamed=True`` on Linux, the temporary is a file
    without a name (``O_TMPFILE``, written through ``/proc/self/fd``) that gets its name only
    when whole: a killed write leaves nothing at all. Otherwise a killed write leaves a
    ``.<name>.tg-<pid>-*.tmp`` file, removed by the next write to the same destination.

    Args:
        path: The destination.
        overwrite: Replace an existing file; otherwise an existing one is an error.
        unnamed: Write to an unnamed file where the system has them (the writer must write
            the one path it is given, nothing beside it).

    Yields:
        The temporary file's path, to write to.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
        CheckpointWriteError: If the file cannot be written; the old one is left as it was.
    """
    destination = _writable(path, overwrite=overwrite)
    anonymous = _anonymous(destination.parent) if unnamed else None
    if anonymous is not None:
        unnamed_path = Path(f"/proc/self/fd/{anonymous}")
        try:
            with _writing(destination, unnamed_path):
                yield unnamed_path
                os.fsync(anonymous)
                os.fchmod(anonymous, 0o666 & ~_umask())
                with _COMMITTING:
                    _commit_unnamed(anonymous, destination, overwrite=overwrite)
                    _sync_folder(destination.parent)
        finally:
            os.close(anonymous)
        return
    with _writing(destination):
        fd, name = tempfile.mkstemp(prefix=_TEMP.format(name=destination.name, pid=os.getpid()),
                                    suffix=".tmp", dir=destination.parent)
        os.close(fd)
    temporary = Path(name)
    try:
        with _writing(destination), under_way(lambda: temporary.unlink(missing_ok=True)):
            yield temporary
            with temporary.open("rb+") as f:
                os.fsync(f.fileno())
            os.chmod(temporary, 0o666 & ~_umask())  # as open() would: mkstemp makes it 0600
            with _COMMITTING:
                _commit(temporary, destination, overwrite=overwrite)
                _sync_folder(destination.parent)
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
        with _writing(destination), under_way(lambda: _settle(work, destination)):
            yield temporary
            with _COMMITTING:
                _swap_in(temporary, destination, work / "old", overwrite=overwrite)
    finally:
        _settle(work, destination)


def _swap_in(folder: Path, destination: Path, old: Path, *, overwrite: bool) -> None:
    """Move a finished folder to its destination, swapping out one already there."""
    if not destination.exists():
        os.replace(folder, destination)
        return
    if not overwrite:
        raise TorchgraftError("already exists (written meanwhile by another process); pass "
                              "overwrite=True to replace it", path=destination)
    if not _exchange(folder, destination):
        os.replace(destination, old)  # put back by _settle (or the next write) if stopped
        os.replace(folder, destination)  # between these two moves


def _settle(work: Path, destination: Path) -> None:
    """Remove a folder write's work folder, first putting back an old folder it moved out."""
    old = work / "old"
    if old.exists() and not destination.exists():
        os.replace(old, destination)
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
