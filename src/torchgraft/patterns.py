r"""A user's patterns: Python regular expressions, matched within a time budget.

Rules files and ``rules=`` hold Python regular expressions (``re`` syntax and meaning), and
they are matched against key names read from checkpoints. Python's engine backtracks: a
pattern such as ``^(\w+\.?)*$`` takes time exponential in the length of a key it does not
match, and even ``(.*)\.weight`` is quadratic over a key of a million characters. So every
match of a user's pattern runs within a budget: :data:`BUDGET_SECONDS` to start with, plus
:data:`SECONDS_PER_MATCH` for each match, never more than :data:`BUDGET_SECONDS` saved up. A
pattern that exhausts it is refused with a :class:`~torchgraft.errors.TorchgraftError` naming
the pattern and the key, so all the matching of one pattern costs at most
:data:`BUDGET_SECONDS` plus :data:`SECONDS_PER_MATCH` per key, whatever the keys, and a
real pattern (a few microseconds per key) never comes near it.

Why a time bound and not a linear-time engine (RE2, the ``google-re2`` package): the same
pattern must mean the same thing wherever torchgraft runs, and RE2 differs from Python's
``re`` where users write rules (``\w``, ``\d`` and ``\b`` are ASCII-only in RE2 and
Unicode in ``re``; ``$`` before a final newline; no backreferences or lookarounds). An
optional engine would make a rules file rename differently depending on what is installed,
and keys the other engine cannot handle would fall back to the backtracking one anyway.

How the budget is enforced: Python's engine checks for signals as it runs, so on the main
thread (the command line, scripts, notebooks) a match is interrupted by an interval timer
(``SIGALRM``) when it reaches the budget; an alarm already set by someone else is kept and
re-armed afterwards. Where no timer can be set (another thread, Windows) each match is timed
and the pattern refused after the match that exhausted the budget: the bound then holds for
every match after that one.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .errors import TorchgraftError, shown

__all__ = ["BUDGET_SECONDS", "SECONDS_PER_MATCH", "Matcher", "TimedPattern"]

#: The most time one pattern's matching may take at once (and the budget it starts with).
BUDGET_SECONDS = 1.0
#: What each match adds to the budget: matching a real pattern against a key takes about
#: a microsecond; a quadratic pattern over a 200-character key about a tenth of this.
SECONDS_PER_MATCH = 0.0005

_T = TypeVar("_T")
#: Whether this platform has interval timers (Windows has none).
_CAN_ARM = hasattr(signal, "setitimer") and hasattr(signal, "SIGALRM")


class Matcher(Protocol):
    """What renames and operation rules match keys with: ``re.Pattern`` or :class:`TimedPattern`."""

    def search(self, string: str) -> re.Match[str] | None:
        """The first match in ``string``."""
        ...

    def fullmatch(self, string: str) -> re.Match[str] | None:
        """The match of the whole of ``string``."""
        ...

    def sub(self, repl: str, string: str) -> str:
        """``string`` with every match replaced."""
        ...


class _Alarm(Exception):
    """Raised by the timer's signal handler inside a match (never leaves this module)."""


#: Whether a timed match is running (the handler raises only then: an alarm that arrives
#: just after a match ended is ignored).
_matching = False


def _on_alarm(signum: int, frame: Any) -> None:
    if _matching:
        raise _Alarm


def _arm(seconds: float) -> tuple[Any, float, float, float] | None:
    """Set a timer for ``seconds``, or nothing where none can be set or an earlier one runs.

    Returns:
        What :func:`_disarm` needs to put back the handler and an alarm set by someone else.
    """
    if not _CAN_ARM or threading.current_thread() is not threading.main_thread():
        return None
    delay, interval = signal.getitimer(signal.ITIMER_REAL)
    if delay and delay <= seconds:  # someone else's alarm comes first: theirs decides
        return None
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return previous, delay, interval, time.monotonic()


def _disarm(armed: tuple[Any, float, float, float] | None) -> None:
    if armed is None:
        return
    previous, delay, interval, start = armed
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    if delay:  # someone else's alarm, less the time this match took
        signal.setitimer(signal.ITIMER_REAL, max(delay - (time.monotonic() - start), 1e-3),
                         interval)


class TimedPattern:
    """A user's compiled pattern whose matches share a time budget (see the module's text).

    Args:
        regex: The compiled pattern.
        what: What it is, for the message (``"rule 3's pattern"``).
        path: The file it was read from (a rules file), named in the message.
    """

    def __init__(self, regex: re.Pattern[str], *, what: str = "the pattern",
                 path: str | Path | None = None) -> None:
        self.regex = regex
        self.what = what
        self.path = path
        self._left = BUDGET_SECONDS

    def search(self, string: str) -> re.Match[str] | None:
        """``re.Pattern.search``, within the budget."""
        return self._timed(self.regex.search, string)

    def fullmatch(self, string: str) -> re.Match[str] | None:
        """``re.Pattern.fullmatch``, within the budget."""
        return self._timed(self.regex.fullmatch, string)

    def sub(self, repl: str, string: str) -> str:
        """``re.Pattern.sub``, within the budget."""
        return self._timed(lambda s: self.regex.sub(repl, s), string)

    def _timed(self, call: Callable[[str], _T], string: str) -> _T:
        global _matching
        if self._left <= 0:  # spent: refused from then on
            raise self._exhausted(string)
        self._left = min(self._left + SECONDS_PER_MATCH, BUDGET_SECONDS)
        armed = _arm(self._left)
        start = time.perf_counter()
        try:
            _matching = True
            try:
                result = call(string)
            finally:
                _matching = False
        except _Alarm:
            self._left = 0.0
            raise self._exhausted(string) from None
        finally:
            _disarm(armed)
            self._left -= time.perf_counter() - start
        if self._left < 0:  # no timer here (another thread): refused after the match
            raise self._exhausted(string)
        return result

    def _exhausted(self, string: str) -> TorchgraftError:
        return TorchgraftError(
            f"{self.what} {shown(self.regex.pattern, 80)} took over {BUDGET_SECONDS:g} s "
            f"matching key {shown(string, 80)} ({len(string)} characters): it backtracks "
            r"without bound (a repeat inside a repeat, such as (\w+\.?)*, or alternatives "
            "that overlap); write it so that each character can match one way only",
            path=self.path)
