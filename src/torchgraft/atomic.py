"""Atomic file writes: a failed or killed write never leaves a partial file at the destination."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import CheckpointWriteError, TorchgraftError

__all__ = ["HOST", "abandon", "alive", "atomic_dir", "atomic_path", "clean_stale",
           "temporary_prefix", "under_way", "writer_gone"]

logger = logging.getLogger("torchgraft")


def _umask() -> int:
    """The process umask (read by setting it, then restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: This machine, as temporaries' names carry it (a hash of its host name): in a folder that
#: machines share, a temporary of another host's write is never taken for a killed one's.
HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
#: What follows ``.tg-`` in a temporary's name: the host (absent in names written before it
#: was added) and the process id of the write.
_WRITER = re.compile(r"(?:(?P<host>[0-9a-f]{8})-)?(?P<pid>[0-9]{1,10})-")


def temporary_prefix(name: str) -> str:
    """How the temporaries of a write to ``name`` are named: ``.<name>.tg-<host>-<pid>-``.

    The host and the process let a later write tell a killed write's leftovers
    (:func:`clean_stale`) from those of a write still under way, here or on another machine.
    """
    return f".{name}.tg-{HOST}-{os.getpid()}-"


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
    """Whether process ``pid`` is running (one of another user's counts as running).

    A number no process can have (0, or past the system's range) counts as running too: it
    was not written by a write of this host, so nothing is removed on its word.
    """
    if not 0 < pid < 2**31:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_gone(host: str | None, pid: int) -> bool:
    """Whether the write of process ``pid`` on ``host`` was killed: it no longer runs here.

    A write of another host, or of this process, or of a process still running, is not; a
    name without a host (written before hosts were named) is taken as this host's.
    """
    return (host is None or host == HOST) and pid != os.getpid() and not alive(pid)


def clean_stale(folder: Path) -> list[Path]:
    """Remove what killed writes left in ``folder``: their temporaries, whatever they wrote.

    A temporary (``.<name>.tg-<host>-<pid>-...``, a file or a folder) whose write ran on
    this host in a process that no longer runs is removed; a folder swap killed between its
    two moves gets its old folder put back first. Temporaries of other users, other hosts,
    and writes still running are left alone. Each removal is logged (debug).

    Args:
        folder: The folder a write is about to write into.

    Returns:
        What was removed.
    """
    removed: list[Path] = []
    try:
        leftovers = sorted(folder.glob(".*.tg-*"))
    except OSError:
        return removed
    for leftover in leftovers:
        head, _, tail = leftover.name.rpartition(".tg-")
        writer = _WRITER.match(tail)
        if writer is None or not _ours(leftover):
            continue  # another user's (a shared folder): never adopted, never removed
        pid = int(writer["pid"])
        if not writer_gone(writer["host"], pid):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            old = leftover / "old"  # killed between moving the old folder out and the new in
            destination = folder / head[1:]
            if old.exists() and not os.path.lexists(destination):
                os.replace(old, destination)
                logger.debug("put back %s, which a write killed mid-swap (process %d) had "
                             "moved aside", destination, pid)
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        logger.debug("removed %s, left by a write that no longer runs (process %d)", leftover,
                     pid)
        removed.append(leftover)
    return removed


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


def _writable(path: str | os.PathLike[str], *, overwrite: bool, clean: bool) -> Path:
    """The destination as a Path, its folder created; an error if it exists and may not go.

    With ``clean``, what killed writes left in the folder is removed first (:func:`clean_stale`).
    """
    destination = Path(path)
    with _writing(destination):
        destination.parent.mkdir(parents=True, exist_ok=True)
        if clean:  # first: a killed swap's old folder is put back before it is looked for
            clean_stale(destination.parent)
    if destination.exists() and not overwrite:
        raise TorchgraftError("already exists; pass overwrite=True (CLI: --overwrite) to "
                              "replace it", path=destination)
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
        named = destination.with_name(temporary_prefix(destination.name)
                                      + f"{secrets.token_hex(4)}.tmp")
    else:
        named = destination
    try:
        _link_unnamed(fd, named)
    except FileExistsError:
        raise TorchgraftError("already exists (written meanwhile by another process); pass "
                              "overwrite=True to replace it", path=destination) from None
    except OSError:
        handle, name = tempfile.mkstemp(prefix=temporary_prefix(destination.name),
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
                unnamed: bool = False, clean: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and moved over it.

    With ``overwrite=False`` the move is exclusive: of two processes saving to one path, one
    succeeds and the other raises. With ``unnamed=True`` on Linux, the temporary is a file
    without a name (``O_TMPFILE``, written through ``/proc/self/fd``) that gets its name only
    when whole: a killed write leaves nothing at all but, for an overwrite killed right before
    its last move, the finished file under a temporary name. Otherwise a killed write leaves a
    ``.<name>.tg-<host>-<pid>-*.tmp`` file. The next write into the same folder removes them
    (:func:`clean_stale`).

    Args:
        path: The destination.
        overwrite: Replace an existing file; otherwise an existing one is an error.
        unnamed: Write to an unnamed file where the system has them (the writer must write
            the one path it is given, nothing beside it).
        clean: Remove what killed writes left in the folder first (a caller writing many
            files there does it once).

    Yields:
        The temporary file's path, to write to.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
        CheckpointWriteError: If the file cannot be written; the old one is left as it was.
    """
    destination = _writable(path, overwrite=overwrite, clean=clean)
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
        fd, name = tempfile.mkstemp(prefix=temporary_prefix(destination.name), suffix=".tmp",
                                    dir=destination.parent)
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
def atomic_dir(path: str | os.PathLike[str], *, overwrite: bool = False,
               clean: bool = True) -> Iterator[Path]:
    """Yield a temporary directory path beside ``path``; on success it is renamed to ``path``.

    A killed write leaves its work folder (``.<name>.tg-<host>-<pid>-*``; the old folder in
    it, when killed mid-swap), which the next write into the same folder removes, putting the
    old folder back (:func:`clean_stale`).

    Args:
        path: The destination directory.
        overwrite: Replace an existing file or directory; otherwise it is an error.
        clean: Remove what killed writes left in the folder first.

    Yields:
        A path that does not exist yet, for the writer to create.

    Raises:
        TorchgraftError: If ``path`` exists and ``overwrite`` is false.
        CheckpointWriteError: If it cannot be written; the old one is left as it was.
    """
    destination = _writable(path, overwrite=overwrite, clean=clean)
    with _writing(destination):
        work = Path(tempfile.mkdtemp(prefix=temporary_prefix(destination.name),
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
