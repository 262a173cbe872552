"""Pausing Python's cyclic garbage collector while metadata for many tensors is built.

Reading the metadata of tens of thousands of tensors, and planning on it, creates objects
that all live on: each automatic full collection then walks every object of the process
(torch's own are many; one walk takes tenths of a second) and finds nothing to free. The
collector is paused for such a step and restored after it, so the cost stays linear in the
number of tensors; reference counting still frees everything as usual.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause automatic garbage collection inside the block (nested blocks are fine)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
