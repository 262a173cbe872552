"""Ctrl-C stops a command within a second, whatever it is copying, and leaves nothing behind.

Python raises ``KeyboardInterrupt`` only when the main thread runs Python again: not inside
``torch.save`` writing a 2 GiB tensor, nor while it waits for the threads that copy tensors
file to file, which finish their copies first (tens of seconds on a slow disk). So on Ctrl-C a
watchdog thread, woken by the signal itself, gives the ordinary interrupt a moment to unwind
(it removes temporaries and keeps the old checkpoint); if the command is still running then,
it removes what the writes under way have put on disk (:func:`torchgraft.atomic.abandon`) and
ends the process with exit code 130, as a shell does for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["EXIT_INTERRUPTED", "GRACE", "end_now", "interrupted", "interruptible"]

EXIT_INTERRUPTED = 130
#: Seconds the ordinary interrupt has to unwind before the watchdog ends the process.
GRACE = 0.4
#: Set once Ctrl-C is pressed: an error that follows (a library that turned the interrupt into
#: its own failure, as torch.distributed.checkpoint does) is the interrupt.
interrupted = threading.Event()


def end_now(code: int) -> None:
    """End the process at once: output flushed, no teardown (torch's takes about a second)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _watch(reader: int, over: threading.Event) -> None:
    """Wait for SIGINT's byte on the wakeup pipe; then, after the grace, end the process."""
    while True:
        try:
            data = os.read(reader, 64)
        except OSError:
            return
        if not data:  # the pipe was closed: the command is over
            return
        if signal.SIGINT in data:
            interrupted.set()
            break
    if over.wait(GRACE):  # the ordinary interrupt ended the command in time
        return
    from ..atomic import abandon  # imported here: --help and bad arguments stay torch-free

    abandon()
    os.write(2, b"\ntorchgraft: interrupted; the write under way was removed, existing files "
                b"are left as they were\n")
    os._exit(EXIT_INTERRUPTED)  # no flush: the main thread may hold the streams' locks


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Run the block so that Ctrl-C ends it within a second (main thread only; else as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted.clear()
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    try:
        previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter
        os.close(reader)
        os.close(writer)
        yield
        return
    over = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(reader, over), name="torchgraft-ctrl-c",
                                daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        over.set()
        signal.set_wakeup_fd(previous)
        os.close(writer)  # the watchdog reads the end of the pipe and returns
        watchdog.join()
        os.close(reader)
