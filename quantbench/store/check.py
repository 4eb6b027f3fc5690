"""Is a store file whole? Checked as it is opened, so a damaged file is refused in one line naming it, the part it
lacks and the fix, instead of failing later inside a query with DuckDB's traceback.

Two kinds of damage a copy, a crash of another tool or a hand edit leave: a file cut short (its header counts more
blocks than the file holds: a copy or download that did not finish), and a file whose tables or columns are not
those its schema version says (a table dropped, a column missing). Both are cheap to see: the block count is one
pragma, the columns one catalog query against the columns the migrations give that version.
"""

from __future__ import annotations

import functools
from pathlib import Path

import duckdb

from quantbench.store.schema import MIGRATIONS

FIX = "restore it from a backup or copy it again, or give another --db (a new store is made by the next run)"


@functools.cache
def expected(version: int) -> dict[str, tuple[str, ...]]:
    """Every table of a store at `version` and its columns, as the migrations make them."""
    con = duckdb.connect(":memory:")
    try:
        for migration in MIGRATIONS[:version]:
            con.execute(migration)
        rows = con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = 'memory' "
                           "ORDER BY table_name, column_index").fetchall()
    finally:
        con.close()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return {t: tuple(c) for t, c in out.items()}


def missing(con: duckdb.DuckDBPyConnection, catalog: str, version: int) -> list[str]:
    """What `catalog` (a store at schema `version`) lacks of its version's tables and columns, as words."""
    have: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ? "
                                     "AND NOT internal", [catalog]).fetchall():
        have.setdefault(table, set()).add(column)
    gaps = []
    for table, columns in expected(version).items():
        if table not in have:
            gaps.append(f"table {table}")
            continue
        gaps += [f"column {table}.{c}" for c in columns if c not in have[table]]
    return gaps


def damage(con: duckdb.DuckDBPyConnection, catalog: str, path: Path, version: int) -> str | None:
    """Why the store `path` (attached as `catalog`, at schema `version`) cannot be read as it is, or None."""
    if version <= 0:
        return None  # not a quantbench store, or a new one: the callers say so themselves
    short = cut_short(con, catalog, path)
    if short:
        return short
    gaps = missing(con, catalog, version)
    if not gaps:
        return None
    shown = ", ".join(gaps[:6]) + (f" and {len(gaps) - 6} more" if len(gaps) > 6 else "")
    return (f"{path} is damaged: its schema version {version} has {shown}, which the file lacks (was it edited by "
            f"another tool?); {FIX}")


def cut_short(con: duckdb.DuckDBPyConnection, catalog: str, path: Path) -> str | None:
    """Whether the file holds fewer bytes than the blocks in use its header counts (free blocks at its end may be
    trimmed, used ones never). Skipped while a write-ahead log is beside it (replaying it may count blocks the file
    does not hold yet). A cut that spares that many bytes is met when a block is read (Store.connect says so)."""
    if Path(f"{path}.wal").exists():
        return None
    row = con.execute("SELECT used_blocks, block_size FROM pragma_database_size() WHERE database_name = ?",
                      [catalog]).fetchone()
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if row is None or row[0] is None or row[1] is None or size >= int(row[0]) * int(row[1]):
        return None
    return (f"{path} is cut short: {size} bytes, fewer than the {int(row[0]) * int(row[1])} its header counts in use "
            f"(a copy or download that did not finish?); {FIX}")
