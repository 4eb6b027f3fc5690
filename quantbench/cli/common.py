"""What every command module shares: the two consoles, the --db option and the one-line error exit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from quantbench.errors import ConfigError
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
        return _not_a_folder(Path(db), "--db")
    path = home.own_db()
    if home.named_db() is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # $QUANTBENCH_HOME is a file, or under one, or on a read-only disk: one line, no traceback
            why = ("a file or under one, not a folder" if isinstance(e, FileExistsError | NotADirectoryError)
                   else f"cannot make the folder of your store there ({e.strerror or e})")
            _fail(ConfigError(f"${home.HOME_ENV} {path.parent}: {why}; point ${home.HOME_ENV} at a folder you can "
                              "write, or give --db"))
        return _not_a_folder(path, f"${home.HOME_ENV}")
    return _not_a_folder(path, f"${home.DB_ENV}")


def _not_a_folder(path: Path, named: str) -> Path:
    """`path` unless it is a folder: a store is a file, and DuckDB's own "Could not read from file ...: Is a
    directory" named neither the flag nor the fix."""
    if path.is_dir():
        _fail(ConfigError(f"{named} {path}: a folder, not a store file; give a file path such as "
                          f"{path / 'results.duckdb'}"))
    return path


def _reading(db: Path | None, shared: bool | None = None):
    """The store a reader reads: --db (or $QUANTBENCH_DB) alone, or your store with the shared results beside it
    (quantbench.store.home.reading); --shared / --mine change that."""
    from quantbench.store import Store, home  # lazy: a fast --help

    first, beside = home.reading(db, shared)
    _not_a_folder(first.path, "--db" if db else f"${home.DB_ENV}" if home.named_db() else f"${home.HOME_ENV}")
    return Store(first.path, beside=beside, kind=first.kind)


def _fail(e: Exception) -> NoReturn:
    # The message is text, not markup: a path or id with brackets ("[/x]") made rich raise MarkupError (a
    # traceback instead of the one line), and one like "[[variants]]" lost its brackets.
    err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)  # one line: the terminal wraps it, a pipe or log keeps it whole
    raise typer.Exit(2)
