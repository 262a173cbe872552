"""Text from files made safe for a terminal: one line, no control characters."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(text: str) -> str:
    r"""Text with every control character written as an escape (one line, no terminal codes).

    Args:
        text: Any text, such as a tensor name or an error message naming one.

    Returns:
        The text, ``\n`` and ``\x1b`` written out.
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
