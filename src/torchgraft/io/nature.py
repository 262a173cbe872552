"""What a file that is no checkpoint really is: a Git LFS pointer, an HTML page, text.

A download that went wrong leaves such a file under a checkpoint's name (``model.pt``,
``model.safetensors``); saying what it is, and how to get the real file, beats a format
reader's "truncated or malformed".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NATURES", "Nature", "nature_of"]


@dataclass(frozen=True)
class Nature:
    """What a file is, recognised by its first bytes.

    Attributes:
        name: A short name (``"git-lfs-pointer"``).
        matches: Whether the first bytes are of this nature.
        explain: The message: what the file is and the fix.
    """

    name: str
    matches: Callable[[bytes], bool]
    explain: str


_LFS_PREFIX = b"version https://git-lfs.github.com/spec/"
_HTML = re.compile(rb"^\s*(<!doctype\s+html|<html|<head|<body|<\?xml)", re.IGNORECASE)


def _text(head: bytes) -> bool:
    """Whether the bytes are text: UTF-8 (a cut final character allowed), printable or spaces."""
    if b"\x00" in head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return False
        text = head[:exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\r\n\f" for c in text)


#: Checked in order, on the first bytes of a file that no format's magic recognised.
NATURES = (
    Nature("git-lfs-pointer", lambda head: head.startswith(_LFS_PREFIX),
           "a Git LFS pointer (a small text file standing for the real one), not the "
           "checkpoint: the repository was cloned without its LFS files. Run `git lfs pull` "
           "(or `git lfs pull --include <file>`) in the repository, or download the file itself"),
    Nature("html", lambda head: _HTML.match(head) is not None,
           "an HTML page, not a checkpoint: a web page (a login, error or 'blob' page) was "
           "saved in place of the file. Download the file itself (on the Hugging Face Hub, the "
           "'resolve' link, not 'blob'; on GitHub, the 'raw' link)"),
    Nature("text", _text,
           "a text file, not a checkpoint (its first bytes are all readable text; a note, a "
           "log or a config saved under a checkpoint's name?). Check that the download or copy "
           "fetched the checkpoint itself"),
)


def nature_of(head: bytes) -> str | None:
    """Say what a file is, from its first bytes, when it is plainly no checkpoint.

    Args:
        head: The file's first bytes (non-empty).

    Returns:
        The message for the first nature that matches, or ``None``. It never quotes the file
        (a text file may hold a secret).
    """
    return next((nature.explain for nature in NATURES if nature.matches(head)), None)
