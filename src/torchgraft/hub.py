"""Hugging Face Hub repository ids (``org/name[@revision]``), resolved in the local cache only.

Nothing is downloaded: an id names a snapshot that ``huggingface_hub`` (``from_pretrained``,
``hf download``, ``snapshot_download``) already put in the cache, found with the cache's own
code (``local_files_only=True``). The snapshot's files are links into the repository's
``blobs/``, which the readers accept as a recognised model store.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import CheckpointNotFoundError

__all__ = ["REPO_ID", "repo_id", "resolve"]

#: ``org/name`` or ``org/name@revision`` (a branch, tag or commit), as the Hub spells ids.
REPO_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})"
                     r"(?:@(?P<revision>[\w.-]{1,255}))?")


def repo_id(text: str) -> tuple[str, str | None] | None:
    """The repository and revision ``text`` names, if it is spelled as a Hub id.

    Args:
        text: A command-line argument or a path given as a string.

    Returns:
        ``(repo, revision)``; ``None`` when it is not an id (an absolute path, ``./x``, ``a/b/c``).
    """
    match = REPO_ID.fullmatch(text)
    if match is None or ".." in text:
        return None
    return match["repo"], match["revision"]


def resolve(text: str) -> Path:
    """The cached snapshot folder of the Hub repository ``text`` names (offline).

    Args:
        text: ``org/name`` or ``org/name@revision``.

    Returns:
        ``<cache>/models--org--name/snapshots/<commit>``.

    Raises:
        CheckpointNotFoundError: If ``text`` is no id, the repository (at that revision) is not
            in the cache, or ``huggingface_hub`` is not installed to look (the message says
            how to install it).
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
    try:
        folder = snapshot_download(repo, revision=revision, local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, a malformed id, an unreadable cache
        at = f" at revision '{revision}'" if revision else ""
        raise CheckpointNotFoundError(
            f"no such file or directory, and no Hugging Face Hub repository '{repo}'{at} in the "
            f"local cache ({HF_HUB_CACHE}; nothing is downloaded: {type(exc).__name__}). "
            f"Download it first (`hf download {repo}`, or from_pretrained once online), set "
            "HF_HUB_CACHE to the cache that holds it, or pass a path", path=text) from None
    return Path(folder)
