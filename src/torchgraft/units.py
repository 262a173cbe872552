"""How numbers read in text: one unit style for sizes, and counts with their nouns."""

from __future__ import annotations

__all__ = ["human_bytes", "plural"]


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
