"""Progress for long commands, on a terminal and in a log.

`progress_bar(console)` is a rich progress bar (description, bar, done of total, elapsed) on
a terminal. On a console that is not one (output to a file, a CI log) rich draws nothing
until the end, so a run of half an hour would say nothing while it runs; there the bar is
off and each task instead prints a plain line when it advances, at most one per `every_s`
seconds, and always its last:

    [12:05:41] chat-sysprompt-01 rpdc 17/160 (3m 12s)       (description, done/total, elapsed)
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

EVERY_S = 10.0


class LoggedProgress(Progress):
    """A rich `Progress` that, on a console that is not a terminal, prints plain lines
    instead of drawing (see the module)."""

    def __init__(
        self, *columns: str | ProgressColumn, console: Console, every_s: float = EVERY_S,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        self.plain = not console.is_terminal
        super().__init__(*columns, console=console, disable=self.plain, **kwargs)
        self.every_s = every_s
        self._logged: dict[TaskID, float] = {}

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        if self.plain:
            self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.plain:
            self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        task = next(t for t in self.tasks if t.id == task_id)
        now = time.monotonic()
        last = self._logged.get(task_id)
        if last is not None and now - last < self.every_s and not task.finished:
            return
        self._logged[task_id] = now
        done = f"{task.completed:g}" + (f"/{task.total:g}" if task.total is not None else "")
        elapsed = int(task.elapsed or 0)
        line = f"{task.description} {done} ({elapsed // 60}m {elapsed % 60:02d}s)"
        self.console.print(f"[{time.strftime('%H:%M:%S')}] {line}", markup=False, highlight=False)


def progress_bar(console: Console, *columns: str | ProgressColumn) -> LoggedProgress:
    """Description, bar, done of total, elapsed (and `columns` after them) on a terminal;
    plain lines in a log."""
    return LoggedProgress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *columns,
        TimeElapsedColumn(), console=console,
    )  # fmt: skip
