"""What the library tells its user beyond its return values: log records, and warnings.

The library logs through ``logging.getLogger("torchgraft")``; only the command line prints. A
record whose message the graft report holds too (outputs that could not be compared) carries
:data:`IN_REPORT`: the command line, which prints the report, leaves such records out
(:func:`in_report`), so nothing is said twice.

What a script must not miss (a graft that is not ok, arguments understood in the other order)
is a :class:`~torchgraft.errors.TorchgraftWarning` through :func:`warnings.warn` (:func:`warn`),
shown by Python's own machinery without any logging set up, once per line of the caller's
code by default; the command line ignores it, since it prints the report.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Mapping
from types import MappingProxyType

from .errors import TorchgraftWarning

__all__ = ["IN_REPORT", "in_report", "warn"]

_MARK = "torchgraft_in_report"

#: ``extra=`` of a log record whose message the report holds too.
IN_REPORT: Mapping[str, object] = MappingProxyType({_MARK: True})


def in_report(record: logging.LogRecord) -> bool:
    """Whether a log record's message is one the graft report holds too."""
    return bool(getattr(record, _MARK, False))


#: Modules whose frames stand between the caller and :func:`warn`: torchgraft's own, and
#: ``contextlib``'s (a context manager used as a decorator wraps ``tg.graft``).
_OWN = frozenset({"torchgraft", "contextlib"})


def warn(message: str) -> None:
    """Emit ``message`` as a :class:`~torchgraft.errors.TorchgraftWarning`, at the caller's line.

    The warning is attributed to the first frame outside torchgraft (the user's
    ``tg.graft(...)``), so Python's default filter shows it once per such line, and
    ``warnings.filterwarnings(..., module=...)`` filters by the user's module.
    """
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is the frame that called warn()
    while frame.f_back is not None and _own(frame.f_globals.get("__name__")):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, TorchgraftWarning, stacklevel=level)


def _own(module: object) -> bool:
    """Whether a frame's module is one of :data:`_OWN` or inside one."""
    return isinstance(module, str) and module.partition(".")[0] in _OWN
