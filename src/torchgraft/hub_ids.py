"""How a Hugging Face Hub repository id is spelled: ``org/name[@revision]``.

Told apart from a path without importing torch or the readers (the command line checks its
arguments with it); :mod:`torchgraft.io.hub` resolves an id in the local cache.
"""

from __future__ import annotations

import re

__all__ = ["REPO_ID", "repo_id"]

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
