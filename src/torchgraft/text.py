"""Text from files made safe to show: one line, no control characters, shortened readably."""

from __future__ import annotations

__all__ = ["one_line", "shorten"]


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

