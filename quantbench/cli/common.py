"""What every command module shares: the two consoles, the --db option and the one-line error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantbench.term import console

# Tables are meant to be read whole: when stdout is a file or a pipe, don't squeeze them into 80 columns.
out = console()
err = console(stderr=True)

DbOpt = Annotated[Path, typer.Option("--db", help="Results store (DuckDB). Default: $QUANTBENCH_DB or ./results.duckdb")]


def _db(db: Path | None) -> Path:
    from quantbench.store import default_db  # lazy: a fast --help

    return Path(db) if db else Path(default_db())


def _fail(e: Exception) -> None:
    err.print(f"[bold red]error:[/] {e}", soft_wrap=True)  # one line: the terminal wraps it, a pipe or log keeps it whole
    raise typer.Exit(2)
