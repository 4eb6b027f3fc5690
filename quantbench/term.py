"""Consoles for the command line: on a terminal, rich's tables fit its width; to a file or a pipe, nothing is
squeezed, so a table row stays one whole line (`grep`, `tee`, CI logs) instead of cells cut to "sta…" or wrapped
to fit 80 columns."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID
from rich.text import Text

PIPE_WIDTH = 1000  # wider than any table quantbench prints: a table takes its natural width
LINE_EVERY_S = 10.0  # to a file or a pipe, a long step's progress line this often


_terminal: TextIO | None = None  # inside libraries_to(): the stderr quantbench had before, for its own lines


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


def stderr_console() -> Console:
    """A console on quantbench's own stderr, also inside libraries_to() (where fd 2 goes to the log)."""
    stream = _terminal or sys.stderr
    return Console(file=stream, width=None if stream.isatty() else PIPE_WIDTH)


@contextmanager
def libraries_to(log: Path) -> Iterator[None]:
    """Send everything the libraries write to `log`: Python logging, warnings, print(), tqdm bars and C code's
    output alike, by pointing file descriptors 1 and 2 at the file. quantbench's own lines keep going to the
    terminal (or pipe) through stderr_console()."""
    global _terminal
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    before = _terminal
    _terminal = os.fdopen(os.dup(2), "w", buffering=1)
    try:
        with open(log, "a") as fh:
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        _terminal.close()
        _terminal = before
        for fd in saved:
            os.close(fd)


@contextmanager
def logs_kept(logger_name: str, into: list[str]) -> Iterator[None]:
    """What the library logs on `logger_name` goes into `into` as plain "LEVEL message" lines (no colours) instead
    of the terminal: a filter on the logger itself, so it holds even for handlers the library adds on import."""

    class Keep(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            into.append(f"{record.levelname} {record.getMessage()}")
            return False

    keep = Keep()
    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


# -- how long a long step will take, from this machine's own speed ------------------------------------------------
BUSY_SHARE = 0.75  # a 1-minute load average at or above this share of the cores: other work is running


def load_note() -> str | None:
    """"this machine is busy: load average 6.2 on 2 cores …" when other work competes for the CPU, else None."""
    try:
        load1 = os.getloadavg()[0]
    except OSError:  # not on this platform
        return None
    cores = os.cpu_count() or 1
    if load1 < BUSY_SHARE * cores:
        return None
    return (f"this machine is busy: load average {load1:.1f} on {cores} core{'s' * (cores != 1)}, so other work "
            "competes with this step and it takes longer than on idle cores")


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    hours, m = divmod(minutes, 60)
    return f"{hours} h {m:02d} min"


class Pace:
    """Says once, early, how long a step of `total` units will take on this machine: from the time its first
    units took (after at least `after_s` seconds and `after_n` units), not from a figure measured elsewhere, and
    whether the machine is busy. `update(done)` after each unit; `say` prints one line."""

    def __init__(self, what: str, total: int, unit: str = "step", say: Any = None, after_s: float = 10.0,
                 after_n: int = 3) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.say = say or (lambda line: print(line, file=_terminal or sys.stderr, flush=True))
        self.after_s, self.after_n = after_s, after_n
        self.started = time.monotonic()
        self.said = False

    def update(self, done: int) -> None:
        if self.said or done < self.after_n or done >= self.total:
            return
        elapsed = time.monotonic() - self.started
        if elapsed < self.after_s:
            return
        self.said = True
        per = elapsed / done
        left = per * (self.total - done)
        busy = load_note()
        self.say(f"{self.what}: {per:.2f} s a {self.unit} over the first {done} of {self.total} on this machine: "
                 f"about {fmt_duration(left)} left, {fmt_duration(elapsed + left)} in all"
                 + (f" ({busy})" if busy else ""))
