"""Consoles for the command line: on a terminal, rich's tables fit its width; to a file or a pipe, nothing is
squeezed, so a table row stays one whole line (`grep`, `tee`, CI logs) instead of cells cut to "sta…" or wrapped
to fit 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 1000  # wider than any table quantbench prints: a table takes its natural width


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def rule(con: Console, title: str) -> None:
    """A heading line: across the terminal, or a short line in a file or pipe (not PIPE_WIDTH dashes)."""
    if con.is_terminal:
        con.rule(title)
    else:
        con.print(f"── {title} ──")
