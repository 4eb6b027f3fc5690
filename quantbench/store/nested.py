"""The export's layout, one Parquet file with one row per run: the run's columns, plus `answers` and `latencies` as
lists of structs (a load run: its own columns in `load_run`, its steps nested), the schema version in the file's
key-value metadata. Written by `copy_nested`, for `quantbench export` (quantbench.store.transfer) and for a run the
store could not take (quantbench.store.keep_unsaved); read back by transfer's merge. Apart from both so that the
store's own module imports it without importing transfer, which imports the store.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

VERSION_KEY = "quantbench_schema_version"
TABLES = ("runs", "answers", "latencies")
LOAD_TABLES = ("load_runs", "load_steps")
LOAD_COLUMN = "load_run"  # in an export: a load run's row, with its steps nested
NESTED_ORDER = {"answers": "record_id, question", "latencies": "seq"}


def quote(path: Path | str) -> str:
    """A path as a SQL string literal (table functions in views cannot take parameters)."""
    return "'" + str(path).replace("'", "''") + "'"


def columns(con: duckdb.DuckDBPyConnection, relation: str) -> list[str]:
    return [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()]


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def has_tables(con: duckdb.DuckDBPyConnection, catalog: str, tables: tuple[str, ...]) -> list[str]:
    """Which of `tables` the database `catalog` (the connection's own when "") holds."""
    where = "database_name = ?" if catalog else "database_name = current_database()"
    found = {row[0] for row in con.execute(
        f"SELECT table_name FROM duckdb_tables() WHERE {where} AND schema_name = 'main'",
        [catalog] if catalog else []).fetchall()}
    return [t for t in tables if t in found]


def fields(con: duckdb.DuckDBPyConnection, relation: str, drop: str) -> str:
    """`name := name, ...` of a relation's columns but `drop`: the inside of a struct_pack."""
    return ", ".join(f"{ident(c)} := {ident(c)}" for c in columns(con, relation) if c != drop)



def copy_nested(con: duckdb.DuckDBPyConnection, out: Path, version: int, catalog: str = "") -> int:
    """Write every run and load run of `catalog` (the connection's own database by default) to `out`; returns the
    run count. A database from before schema 6 has no load tables: its export has no `load_run` column."""
    prefix = f"{catalog}." if catalog else ""
    lists = []
    for table in ("answers", "latencies"):
        lists.append(f"LEFT JOIN (SELECT run_id, list(struct_pack({fields(con, prefix + table, 'run_id')}) "
                     f"ORDER BY {NESTED_ORDER[table]}) AS {table} FROM {prefix}{table} GROUP BY run_id) USING (run_id)")
    rows = f"SELECT r.*, answers, latencies FROM {prefix}runs r {' '.join(lists)}"
    order = "r.created_at, r.run_id"
    if has_tables(con, catalog, LOAD_TABLES) == list(LOAD_TABLES):
        runs_fields = fields(con, prefix + "load_runs", "")
        rows = (f"SELECT * FROM ({rows} UNION ALL BY NAME "
                f"SELECT struct_pack({runs_fields}, steps := steps) AS {LOAD_COLUMN} FROM {prefix}load_runs "
                f"LEFT JOIN (SELECT load_id, list(struct_pack({fields(con, prefix + 'load_steps', 'load_id')}) "
                f"ORDER BY step) AS steps FROM {prefix}load_steps GROUP BY load_id) USING (load_id)) r")
        order = (f"r.{LOAD_COLUMN} IS NOT NULL, coalesce(r.created_at, r.{LOAD_COLUMN}.created_at), r.run_id, "
                 f"r.{LOAD_COLUMN}.load_id")  # the runs first, as before load runs were exported
    con.execute(
        f"COPY ({rows} ORDER BY {order}) "
        f"TO {quote(out)} (FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{VERSION_KEY}: '{version}'}})"
    )
    return con.execute(f"SELECT count(*) FROM {prefix}runs").fetchone()[0]
