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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutsideCheckpointError

__all__ = ["STORES", "Store", "contained", "store_areas"]

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
    real = folder.resolve()
    for ancestor in (real, *real.parents):
        found = [(store.name, area.resolve()) for store in STORES
                 if (area := store.area(ancestor)) is not None]
        if found:
            return found
    return []


def _outward_link(folder: Path, name: str, inside: Callable[[Path], bool]) -> tuple[Path, str]:
    """The first link on the way from ``folder`` to ``name`` whose target is not inside."""
    step = folder
    for part in Path(name).parts:
        step = step / part
        if step.is_symlink() and not inside(step.resolve()):
            return step, os.readlink(step)
    return folder / name, str((folder / name).resolve())


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
    """
    normal = os.path.normpath(name) if name else ""
    if (not name or "\0" in name or os.path.isabs(name) or normal == ".."
            or normal.startswith(".." + os.sep)):
        raise OutsideCheckpointError(
            f"{what} '{name}' lies outside the checkpoint's folder (an absolute path or '..'): "
            "refused", path=named_by)
    path = folder / name
    real = path.resolve()
    top = folder.resolve()
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
    link, target = _outward_link(folder, name, inside)
    stores = ", ".join(name for name, _ in areas)
    where = f" nor into the object store of {stores} it is in" if stores else ""
    raise OutsideCheckpointError(
        f"{what} '{name}' lies outside the checkpoint's folder: '{link}' is a link to "
        f"'{target}', which leads out of '{folder}'{where}: refused. If you trust where it "
        "leads, pass follow_links=True (CLI: --follow-links)", path=named_by)
