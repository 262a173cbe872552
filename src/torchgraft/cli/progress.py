"""Progress on stderr for long steps: bytes with rate and time left, or counts.

The library reports progress through callbacks (tensors done, bytes written); only the command
line draws it. A step shows once it has run for a second, so quick commands print nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ..text import one_line
from ..units import human_bytes

__all__ = ["DELAY", "Steps", "steps"]

#: Seconds a step runs before its progress shows.
DELAY = 1.0


class _Amount(ProgressColumn):
    """``1.2/2.0 GiB  310.5 MiB/s`` for bytes, ``120/240 tensors`` for counts."""

    def __init__(self) -> None:
        super().__init__()
        self._bytes = DownloadColumn(binary_units=True)
        self._count = MofNCompleteColumn()

    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text("")
        if task.fields.get("unit") == "bytes":
            speed = task.finished_speed or task.speed
            rate = "" if speed is None else f"  {human_bytes(int(speed))}/s"
            return Text.assemble(self._bytes.render(task), (rate, "progress.data.speed"))
        return Text.assemble(self._count.render(task), f" {task.fields.get('unit', '')}")


class _Delayed(Progress):
    """A progress display that shows a step only once it has run for :data:`DELAY` seconds."""

    def get_renderables(self) -> Iterator[Table]:
        now = time.monotonic()
        yield self.make_tasks_table([t for t in self.tasks
                                     if now - t.fields.get("since", now) >= DELAY])


class Steps:
    """One line of progress for a command's steps.

    Args:
        bar: The progress display.
    """

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.task: TaskID | None = None

    def step(self, description: str) -> None:
        """Start a step, of unknown length until a callback gives its total.

        Args:
            description: Plain text (a file's name in it is shown as it is, not as markup).
        """
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(escape(one_line(description)), total=None, unit="",
                                      since=time.monotonic())

    def counter(self, unit: str) -> Callable[[int, int], None]:
        """A progress callback for the current step: (done, total) in ``unit`` (``bytes``)."""
        task = self.task
        assert task is not None

        def update(done: int, total: int) -> None:
            self.bar.update(task, completed=done, total=total, unit=unit)

        return update


@contextmanager
def steps(first: str, *, quiet: bool = False) -> Iterator[Steps]:
    """A progress line on a terminal's stderr (none with ``quiet``), gone when it ends.

    Args:
        first: The first step's description.
        quiet: Show nothing.

    Yields:
        The steps, to name each and to get its callbacks.
    """
    console = Console(stderr=True)
    bar = _Delayed(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Amount(),
                   TimeRemainingColumn(), console=console, transient=True,
                   disable=quiet or not console.is_interactive, refresh_per_second=4)
    with bar:
        shown = Steps(bar)
        shown.step(first)
        yield shown
