"""Byte progress of a write: what is on disk so far, sampled while a writer runs.

Writers copy tensors in the kernel, in threads or inside ``torch.save``, and report nothing
until they return; the file they write grows all along. The meter reads its allocated size a
few times a second, so progress moves with the bytes (and gives a rate and a time left).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["ByteMeter", "on_disk"]

#: Seconds between two samples.
INTERVAL = 0.25


def on_disk(path: Path) -> int:
    """Bytes written to a file (allocated and within its size), or to every file of a folder."""
    try:
        if not path.is_dir():
            status = os.stat(path)
            return min(status.st_size, status.st_blocks * 512)
        total = 0
        for folder, _dirs, files in os.walk(path):
            for name in files:
                status = os.stat(os.path.join(folder, name))
                total += min(status.st_size, status.st_blocks * 512)
        return total
    except OSError:  # moved or removed meanwhile: nothing more to count
        return 0


class ByteMeter:
    """Reports the bytes a write has put on disk, out of what it will write.

    Args:
        total: The bytes the whole write holds (tensor data; headers are not counted).
        report: Called with (bytes written, total), from a thread of its own while a file is
            watched, and with (total, total) by :meth:`finish`.
    """

    def __init__(self, total: int, report: Callable[[int, int], None]) -> None:
        self.total = max(total, 0)
        self.report = report
        self.done = 0

    @contextlib.contextmanager
    def watching(self, path: Path) -> Iterator[None]:
        """Sample ``path`` while the block writes it; its bytes then count as done."""
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(INTERVAL):
                self.report(min(self.done + on_disk(path), self.total), self.total)

        thread = threading.Thread(target=sample, name="torchgraft-bytes", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
        self.done = min(self.done + on_disk(path), self.total)
        self.report(self.done, self.total)

    def finish(self) -> None:
        """Report the write whole."""
        self.done = self.total
        self.report(self.total, self.total)
