"""Consoles for the command line: on a terminal, rich's tables fit its width; to a file or a pipe, nothing is
squeezed, so a table row stays one whole line (`grep`, `tee`, CI logs) instead of cells cut to "sta…" or wrapped
to fit 80 columns."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID
from rich.text import Text

PIPE_WIDTH = 1000  # wider than any table quantbench prints: a table takes its natural width
LINE_EVERY_S = 10.0  # to a file or a pipe, a long step's progress line this often


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def rule(con: Console, title: str) -> None:
    """A heading line: across the terminal, or a short line in a file or pipe (not PIPE_WIDTH dashes)."""
    if con.is_terminal:
        con.rule(title)
    else:
        con.print(f"── {title} ──")


class LineProgress(Progress):
    """rich's Progress. On a terminal it draws its bar as usual; to a file or a pipe, where rich draws nothing
    until the step ends, it prints a plain line when a task starts and then every `every` seconds (the task's
    columns without the bar: "training fixture 45/300 loss 1.234 0:00:32"), so a log shows a long step moving."""

    def __init__(self, *columns: str | ProgressColumn, every: float | None = None, **kwargs: Any) -> None:
        super().__init__(*columns, **kwargs)
        self._plain = not self.console.is_terminal and not self.disable
        self._every = LINE_EVERY_S if every is None else every
        self._printed: dict[TaskID, float] = {}

    def add_task(self, *args: Any, **kwargs: Any) -> TaskID:
        task_id = super().add_task(*args, **kwargs)
        self._line(task_id, force=True)
        return task_id

    def update(self, task_id: TaskID, *args: Any, **kwargs: Any) -> None:
        super().update(task_id, *args, **kwargs)
        self._line(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._line(task_id)

    def _line(self, task_id: TaskID, force: bool = False) -> None:
        if not self._plain:
            return
        now = time.monotonic()
        if not force and now - self._printed.get(task_id, now) < self._every:
            return
        self._printed[task_id] = now
        task = self._tasks[task_id]
        parts = [c(task) for c in self.columns if isinstance(c, ProgressColumn) and not isinstance(c, BarColumn)]
        self.console.print(Text(" ").join(p if isinstance(p, Text) else Text(str(p)) for p in parts))
