"""What every command module shares: the two consoles, the --db option and the one-line error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantbench.term import console

# Tables are meant to be read whole: when stdout is a file or a pipe, don't squeeze them into 80 columns.
out = console()
err = console(stderr=True)

DbOpt = Annotated[Path, typer.Option("--db", help="Results store (DuckDB). Default: $QUANTBENCH_DB, else your own "
                                                 "store $QUANTBENCH_HOME/results.duckdb (~/.local/share/quantbench)")]
SharedOpt = Annotated[bool | None, typer.Option(
    "--shared/--mine", help="--shared: read the shared results (pulled bundles, the results shipped with quantbench) "
    "beside --db; --mine: your store alone. Default: your store with the shared results beside it, or --db alone")]


def _db(db: Path | None) -> Path:
    """The store written to: --db, $QUANTBENCH_DB, or your own store (its folder made on first use)."""
    from quantbench.store import home  # lazy: a fast --help

    if db:
        return Path(db)
    path = home.own_db()
    if home.named_db() is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _reading(db: Path | None, shared: bool | None = None):
    """The store a reader reads: --db (or $QUANTBENCH_DB) alone, or your store with the shared results beside it
    (quantbench.store.home.reading); --shared / --mine change that."""
    from quantbench.store import Store, home  # lazy: a fast --help

    first, beside = home.reading(db, shared)
    return Store(first.path, beside=beside, kind=first.kind)


def _fail(e: Exception) -> None:
    err.print(f"[bold red]error:[/] {e}", soft_wrap=True)  # one line: the terminal wraps it, a pipe or log keeps it whole
    raise typer.Exit(2)
