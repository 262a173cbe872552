"""Containment: every part a checkpoint names stays inside the checkpoint's folder.

A checkpoint names other files: an index its shards, DCP ``.metadata`` its data files, a
DeepSpeed folder its tag (``latest``) and rank files, a pipeline its part folders and the
weight files inside them. Each name goes through :func:`contained` before anything is opened:
an absolute name or one with ``..`` leading out is refused; a symbolic link is followed only
while its target stays inside the folder, or inside the object area of a recognised model
store the folder belongs to (:data:`STORES`: the Hugging Face Hub cache's
``models--org--name/snapshots/<rev>/x`` -> ``../../blobs/<hash>`` of the same repository,
git-annex's and DVC's objects of the same repository). Any other link out is refused, naming
the link, its target and the opt-in (``follow_links=True``, CLI ``--follow-links``).
A link that leads back to itself (a loop) is refused as a damaged folder.

The top is always the folder the checkpoint was named by (a pipeline's folder, a DCP
directory, a Hub repository's cache folder), never what a link inside it resolves to.
Only regular files are opened: a FIFO, device or socket is refused before it is opened
(:func:`open_regular`, :func:`check_regular`), since opening or reading one may block or never
end. A file beside a checkpoint that a reader or graft takes settings from (a
``config.json``, an ``adapter_config.json``, a Hub cache's ``refs/main``) is read with
:func:`read_contained`: contained, a regular file, bounded in size.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bounds import parse_json
from ..errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    OutsideCheckpointError,
    TorchgraftError,
    UnsupportedCheckpointError,
    brief,
    reading,
)

__all__ = ["STORES", "Store", "check_regular", "contained", "open_regular", "read_contained",
           "read_json",
           "store_areas"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Store:
    """A kind of model store whose files are links into its own object area.

    Attributes:
        name: The store, in words (``"the Hugging Face Hub cache"``).
        area: Given a folder that may be the store's top (an ancestor of the checkpoint),
            the object area links may lead into, or ``None`` if the folder is not one.
    """

    name: str
    area: Callable[[Path], Path | None]


def _hub_repository(folder: Path) -> Path | None:
    """``models--org--name/snapshots/<rev>``: the repository's ``blobs``."""
    snapshots = folder.parent
    repository = snapshots.parent
    if snapshots.name == "snapshots" and repository.name.startswith(
            ("models--", "datasets--", "spaces--")):
        return repository / "blobs"
    return None


def _annex(folder: Path) -> Path | None:
    area = folder / ".git" / "annex" / "objects"
    return area if area.is_dir() else None


def _dvc(folder: Path) -> Path | None:
    area = folder / ".dvc" / "cache"
    return area if area.is_dir() else None


#: The recognised model stores, nearest ancestor first.
STORES = (
    Store("the Hugging Face Hub cache", _hub_repository),
    Store("a git-annex repository", _annex),
    Store("a DVC repository", _dvc),
)


def store_areas(folder: Path) -> list[tuple[str, Path]]:
    """The object areas that links from ``folder`` may lead into, with their stores' names.

    Args:
        folder: A checkpoint's folder (resolved here).

    Returns:
        For the nearest ancestor of ``folder`` that is a recognised store's top, its areas;
        empty when ``folder`` lies in no recognised store.
    """
    real = _resolved(folder, folder)
    for ancestor in (real, *real.parents):
        found = [(store.name, _resolved(area, folder)) for store in STORES
                 if (area := store.area(ancestor)) is not None]
        if found:
            return found
    return []


def _resolved(path: Path, named_by: Path) -> Path:
    """``path`` with every link followed; a link loop is a damaged folder, not a crash."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: "Symlink loop" (Python < 3.13)
        raise CorruptCheckpointError(
            f"'{path}' is a symbolic link that leads back to itself (a link loop: {brief(exc)}): "
            "replace it by the folder or file it should name", path=named_by) from None


def _outward_link(folder: Path, name: str, inside: Callable[[Path], bool],
                  named_by: Path) -> tuple[Path, str]:
    """The first link on the way from ``folder`` to ``name`` whose target is not inside."""
    step = folder
    for part in Path(name).parts:
        step = step / part
        if step.is_symlink() and not inside(_resolved(step, named_by)):
            return step, os.readlink(step)
    return folder / name, str(_resolved(folder / name, named_by))


def contained(folder: Path, name: str, *, named_by: Path, what: str,
              follow_links: bool = False) -> Path:
    """The path of a part a checkpoint names, refused if it leads out of the checkpoint.

    Args:
        folder: The folder the name is relative to (an index's folder, a DCP directory, a
            DeepSpeed tag folder, a pipeline or one of its part folders).
        name: The name as the checkpoint gives it (``"model-00001-of-00002.safetensors"``).
        named_by: The file or folder that names it, for the message.
        what: What the part is, in words (``"shard"``, ``"data file"``).
        follow_links: Follow links out of the folder too (the user trusts the folder).

    Returns:
        ``folder / name`` as named (not resolved: suffixes and messages stay the user's).

    Raises:
        OutsideCheckpointError: If the name is absolute or leads out with ``..``, or a link
            on its way leads out of ``folder`` and not into a recognised model store.
        CorruptCheckpointError: If a link on its way is a loop.
    """
    normal = os.path.normpath(name) if name else ""
    if (not name or "\0" in name or os.path.isabs(name) or normal == ".."
            or normal.startswith(".." + os.sep)):
        raise OutsideCheckpointError(
            f"{what} '{name}' lies outside the checkpoint's folder (an absolute path or '..'): "
            "refused", path=named_by)
    path = folder / name
    real = _resolved(path, named_by)
    top = _resolved(folder, named_by)
    if real == top or real.is_relative_to(top):
        return path
    if follow_links:
        logger.debug("%s '%s' links out of %s to %s: followed (follow_links)", what, name,
                     folder, real)
        return path
    areas = store_areas(folder)

    def inside(target: Path) -> bool:
        return target.is_relative_to(top) or any(target.is_relative_to(a) for _, a in areas)

    if any(real.is_relative_to(area) for _, area in areas):
        logger.debug("%s '%s' links into %s: followed", what, name, areas[0][0])
        return path
    link, target = _outward_link(folder, name, inside, named_by)
    stores = ", ".join(name for name, _ in areas)
    where = f" nor into the object store of {stores} it is in" if stores else ""
    raise OutsideCheckpointError(
        f"{what} '{name}' lies outside the checkpoint's folder: '{link}' is a link to "
        f"'{target}', which leads out of '{folder}'{where}: refused. If you trust where it "
        "leads, pass follow_links=True (CLI: --follow-links)", path=named_by)


#: File types that are neither regular files nor folders, named for messages.
_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refuse_special(mode: int, path: Path, what: str, *, folder_ok: bool) -> None:
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return
    kind = next((name for test, name in _SPECIAL if test(mode)),
                "a folder" if stat.S_ISDIR(mode) else "no regular file")
    raise UnsupportedCheckpointError(
        f"{what} '{path.name}' is not a regular file but {kind} (a FIFO, device or socket could "
        "block or never end): refused before opening it; copy the data to a regular file",
        path=path)


def check_regular(path: Path, *, what: str = "file", folder_ok: bool = False) -> None:
    """Refuse, without opening it, anything at ``path`` but a regular file (or a folder).

    Links are followed (containment is :func:`contained`'s work). A library that opens the
    file itself (tensorstore, h5py) is only given paths checked here first.

    Args:
        path: The path.
        what: What it is, for the message (``"chunk"``).
        folder_ok: Accept a folder too (a walk of a checkpoint's folder).

    Raises:
        UnsupportedCheckpointError: If it is a FIFO, a device or a socket (or a folder).
        FileNotFoundError: If nothing is there.
    """
    _refuse_special(os.stat(path).st_mode, path, what, folder_ok=folder_ok)


def open_regular(path: Path, *, what: str = "file") -> int:
    """Open a regular file for reading; anything else is refused before it is opened.

    The type is checked by path first (a FIFO is never opened: opening one for reading blocks
    until a writer comes), then again on the descriptor (the path may have been replaced in
    between; the open itself does not block, ``O_NONBLOCK``).

    Args:
        path: The file.
        what: What it is, for the message.

    Returns:
        A read-only, blocking descriptor, closed on exec.

    Raises:
        UnsupportedCheckpointError: If it is not a regular file.
        OSError: If it cannot be opened (``FileNotFoundError`` if missing).
    """
    check_regular(path, what=what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _refuse_special(os.fstat(fd).st_mode, path, what, folder_ok=False)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_contained(folder: Path, name: str, *, named_by: Path, what: str, limit: int,
                   follow_links: bool = False) -> bytes:
    """The bytes of a small file a checkpoint's folder holds, read safely: the one way to do so.

    Every file beside a checkpoint that settings are read from (``config.json``,
    ``adapter_config.json``, ``latest``, a Hub cache's ``refs/main``) is read here: its name
    must stay inside ``folder`` (:func:`contained`: the folder the user named is the top, a
    link out is refused unless ``follow_links``), it must be a regular file (refused before
    it is opened otherwise) and at most ``limit`` bytes.

    Args:
        folder: The folder the user named (or one :func:`contained` accepted in it).
        name: The file's name relative to ``folder``.
        named_by: The checkpoint that names it, for the messages.
        what: What the file is, for the messages (``"config.json"``).
        limit: The most bytes such a file may have.
        follow_links: Follow a link out of ``folder`` (the user trusts the folder).

    Returns:
        Its bytes.

    Raises:
        CheckpointNotFoundError: If there is no such file.
        OutsideCheckpointError: If it lies outside ``folder``.
        UnsupportedCheckpointError: If it is a FIFO, a device, a socket or a folder.
        CorruptCheckpointError: If it is larger than ``limit``, or a link loop.
        TorchgraftError: If it cannot be read (no permission...).
    """
    path = contained(folder, name, named_by=named_by, what=what, follow_links=follow_links)
    with reading(named_by):  # an unreadable file (no permission...) is a library error
        try:
            fd = open_regular(path, what=what)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"{what} '{name}' is missing",
                                          path=named_by) from None
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    if len(data) > limit:
        raise CorruptCheckpointError(f"{what} '{name}' is larger than the {limit} bytes such a "
                                     "file can be", path=named_by)
    return data


def read_json(path: Path, *, what: str, limit: int, named_by: Path | None = None,
              follow_links: bool = False,
              error: type[TorchgraftError] = CorruptCheckpointError) -> Any:
    """A small JSON file in a checkpoint's folder (an index, a config), read within bounds.

    Read as :func:`read_contained` reads (inside its folder, a regular file, at most
    ``limit`` bytes) and parsed with its nesting bounded
    (:func:`~torchgraft.bounds.parse_json`).

    Args:
        path: The file.
        what: What it is, for messages (``"the index"``, ``"config.json"``).
        limit: Its largest plausible size in bytes.
        named_by: The checkpoint that names it (by default the file itself).
        follow_links: Follow a link out of its folder.
        error: The class a file that is not valid JSON (or too large, too deep) is refused
            with: a file of the checkpoint is corrupt; a setting beside it a plain
            :class:`~torchgraft.errors.TorchgraftError`.

    Returns:
        The parsed value (any JSON value: the caller checks its shape).

    Raises:
        TorchgraftError: Naming the file, as :func:`read_contained` does, or of class
            ``error`` if it is too large or not valid JSON.
    """
    try:
        data = read_contained(path.parent, path.name, named_by=named_by or path, what=what,
                              limit=limit, follow_links=follow_links)
        return parse_json(data, what=what, path=path)
    except CorruptCheckpointError as exc:
        if error is CorruptCheckpointError:
            raise
        raise error(exc.message, path=path) from None
