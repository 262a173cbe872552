"""Text from files made safe to show: one line, no control characters, shortened readably."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["few", "one_line", "quoted", "shorten"]

_Item = TypeVar("_Item")


def one_line(text: str) -> str:
    r"""Text with every control character written as an escape (one line, no terminal codes).

    Args:
        text: Any text, such as a tensor name or an error message naming one.

    Returns:
        The text, ``\n`` and ``\x1b`` written out.
    """
    if text.isprintable():  # nearly always: checked at C speed
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shorten(text: str, width: int) -> str:
    """Fit text in ``width`` characters by cutting its middle, keeping both ends readable.

    A dotted key keeps its first and last parts (``encoder.layer.0...attention.self.query``),
    so a key is shortened, never broken across lines.

    Args:
        text: The text.
        width: The most characters to use (at least 5).

    Returns:
        The text, or its two ends joined by ``...``.
    """
    width = max(width, 5)
    if len(text) <= width:
        return text
    keep = width - 3
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2:]
    return f"{head}...{tail}"



def few(items: Sequence[_Item], most: int = 3, show: Callable[[_Item], str] = str) -> str:
    """The first ``most`` items, each as ``show`` writes it, then how many more there are.

    Only the items shown are written out: a list of 100,000 keys costs three.

    Args:
        items: The items.
        most: How many to show.
        show: One item as text (:func:`quoted` quotes it).

    Returns:
        ``'a', 'b', 'c' and 4 more``.
    """
    shown = ", ".join(show(item) for item in items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def quoted(item: object) -> str:
    """An item in single quotes, as messages name keys and modules: ``'layer1.0'``."""
    return f"'{item}'"
