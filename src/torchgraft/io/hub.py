"""Hugging Face Hub repository ids (``org/name[@revision]``), resolved in the local cache only.

Nothing is downloaded: an id names a snapshot that ``huggingface_hub`` (``from_pretrained``,
``hf download``, ``snapshot_download``) already put in the cache, found with the cache's own
code (``local_files_only=True``). The snapshot's files are links into the repository's
``blobs/``, which the readers accept as a recognised model store.

The repository's cache folder (``models--org--name``) is the top everything found must stay
in: the ``refs/<revision>`` file is read with
:func:`~torchgraft.io.contain.read_contained` (a regular file inside the folder, never a
FIFO) and must name a commit, and the snapshot folder must lie inside the cache folder, not
be a link out of it (unless ``follow_links``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..hub_ids import repo_id
from .contain import contained, read_contained

__all__ = ["resolve"]

#: What a ``refs/<revision>`` file holds: a commit's hash.
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: A ``refs`` file is a hash and perhaps a newline.
_MAX_REF = 256


def resolve(text: str, *, follow_links: bool = False) -> Path:
    """The cached snapshot folder of the Hub repository ``text`` names (offline).

    Args:
        text: ``org/name`` or ``org/name@revision``.
        follow_links: Accept a snapshot folder that is a link out of the repository's cache
            folder.

    Returns:
        ``<cache>/models--org--name/snapshots/<commit>``.

    Raises:
        CheckpointNotFoundError: If ``text`` is no id, the repository (at that revision) is not
            in the cache, or ``huggingface_hub`` is not installed to look (the message says
            how to install it).
        CorruptCheckpointError: If the cache's ``refs`` file names no commit, or the snapshot
            lies outside the repository's cache folder.
    """
    named = repo_id(text)
    if named is None:
        raise CheckpointNotFoundError("no such file or directory", path=text)
    repo, revision = named
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        raise CheckpointNotFoundError(
            "no such file or directory. If it is a Hugging Face Hub repository id, opening it "
            "from the local cache needs huggingface_hub, which is not installed: pip install "
            "huggingface_hub (or torchgraft[hub])", path=text) from None
    storage = Path(HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    commit = _commit(storage, revision or "main")
    try:
        folder = Path(snapshot_download(repo, revision=commit or revision,
                                        local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, a malformed id, an unreadable cache
        at = f" at revision '{revision}'" if revision else ""
        raise CheckpointNotFoundError(
            f"no such file or directory, and no Hugging Face Hub repository '{repo}'{at} in the "
            f"local cache ({HF_HUB_CACHE}; nothing is downloaded: {type(exc).__name__}). "
            f"Download it first (`hf download {repo}`, or from_pretrained once online), set "
            "HF_HUB_CACHE to the cache that holds it, or pass a path", path=text) from None
    return _snapshot(storage, folder, follow_links=follow_links)


def _commit(storage: Path, revision: str) -> str | None:
    """The commit ``refs/<revision>`` names (``None``: no such file, or a commit given)."""
    if _COMMIT.fullmatch(revision) or not (storage / "refs" / revision).exists():
        return None
    raw = read_contained(storage, f"refs/{revision}", named_by=storage,
                         what="Hub cache reference", limit=_MAX_REF)
    commit = raw.decode("utf-8", "replace").strip()
    if not _COMMIT.fullmatch(commit):
        raise CorruptCheckpointError(
            f"the cache's refs/{revision} holds {commit[:80]!r}, not a commit hash (40 hex "
            "digits): the cache is damaged or was edited; download the repository again",
            path=storage)
    return commit


def _snapshot(storage: Path, folder: Path, *, follow_links: bool) -> Path:
    """The snapshot folder, refused if it lies (or links) outside the repository's folder."""
    return contained(storage, os.path.relpath(folder, storage), named_by=storage,
                     what="Hub cache snapshot", follow_links=follow_links)
