"""Renaming rules: a regex searched in a key and its replacement, or ``None`` to drop the key.

The one vocabulary of renames, below every stage: users' rules, the layouts between code
bases and the writers of other frameworks' files (Paddle's names) all rename keys with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TorchgraftError, shown
from .patterns import Matcher, TimedPattern

__all__ = ["Rule", "rename"]


@dataclass(frozen=True)
class Rule:
    r"""Rename checkpoint keys matching ``pattern`` (``re.sub``), or drop them.

    Attributes:
        pattern: A regular expression searched in the key.
        replacement: The ``re.sub`` replacement (``\1`` groups allowed); ``None`` drops the key.
        regex: The compiled pattern.
        matcher: What keys are matched with: ``regex`` for the library's own rules, a
            :class:`~torchgraft.patterns.TimedPattern` for a user's (:meth:`timed`).
    """

    pattern: str
    replacement: str | None
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    matcher: Matcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "regex", re.compile(self.pattern))
            object.__setattr__(self, "matcher", self.regex)
        except (re.error, RecursionError, OverflowError) as exc:
            raise TorchgraftError(f"rule pattern {shown(self.pattern, 80)} is not a regex: {exc}"
                                  ) from None
        if self.replacement is not None:
            try:  # a group reference the pattern lacks (\9) fails here, not mid-graft
                self.regex.sub(self.replacement, "")  # the template is compiled before matching
            except (re.error, IndexError) as exc:
                raise TorchgraftError(f"rule replacement {shown(self.replacement, 80)} does not "
                                      f"fit pattern {shown(self.pattern, 80)}: {exc}") from None

    def __str__(self) -> str:
        return f"({shown(self.pattern, 200)} -> {shown(self.replacement, 200)})"

    def timed(self, *, what: str = "rule pattern",
              path: str | Path | None = None) -> Rule:
        """This rule as a user's: its matches share a time budget of their own.

        Args:
            what: What the pattern is, in a message (``"rule 3's pattern"``).
            path: The rules file it was read from, named in a message.

        Returns:
            A copy whose :attr:`matcher` is a :class:`~torchgraft.patterns.TimedPattern`.
        """
        rule = Rule(self.pattern, self.replacement)
        object.__setattr__(rule, "matcher", TimedPattern(rule.regex, what=what, path=path))
        return rule


def rename(name: str, rules: Sequence[Rule]) -> tuple[str | None, Rule | None]:
    """Apply rules in order to one key.

    Args:
        name: The key.
        rules: The rules.

    Returns:
        The new key (``None`` if a rule dropped it), and the last rule that changed it.
    """
    changed_by = None
    for rule in rules:
        if rule.replacement is None:
            if rule.matcher.search(name):
                return None, rule
            continue
        new = rule.matcher.sub(rule.replacement, name)
        if new != name:
            name, changed_by = new, rule
    return name, changed_by
