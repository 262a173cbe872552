"""What the library's log records carry beyond their message.

The library logs through ``logging.getLogger("torchgraft")``; only the command line prints. A
record whose message the graft report holds too (a graft that is not ok, outputs that could
not be compared) carries :data:`IN_REPORT`: the command line, which prints the report, leaves
such records out (:func:`in_report`), so nothing is said twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["IN_REPORT", "in_report"]

_MARK = "torchgraft_in_report"

#: ``extra=`` of a log record whose message the report holds too.
IN_REPORT: Mapping[str, object] = MappingProxyType({_MARK: True})


def in_report(record: logging.LogRecord) -> bool:
    """Whether a log record's message is one the graft report holds too."""
    return bool(getattr(record, _MARK, False))
