"""How numbers read in text: one unit style for sizes, and counts with their nouns."""

from __future__ import annotations

import re

from .errors import TorchgraftError

__all__ = ["human_bytes", "parse_size", "plural"]


def human_bytes(n: int) -> str:
    """Format a byte count in binary units, e.g. ``1.0 GiB`` (exact counts go in JSON)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 tensor``, ``2 tensors``: the count with its noun, singular or plural."""
    return f"{count:,} {noun if count == 1 else (nouns or noun + 's')}"


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Parse ``"2GB"`` (10**9 bytes, as transformers counts), ``"500MiB"`` or a byte count.

    Args:
        size: The size.

    Returns:
        Bytes.

    Raises:
        TorchgraftError: If the text is not a size.
    """
    if isinstance(size, int):
        return size
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]I?B|B)?\s*",
                         size.upper())
    if match is None or float(match.group(1)) * _UNITS[match.group(2) or ""] < 1:
        raise TorchgraftError(f"{size!r} is not a size such as '2GB' or '500MiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])
