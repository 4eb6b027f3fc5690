"""Several stores read as one: your store with the shared results beside it (quantbench.store.home).

A read opens an in-memory DuckDB, attaches each store read-only and makes views named as the tables (`runs`,
`answers`, `latencies`, `load_runs`, `load_steps`, `bundles`, `bundle_items`) over all of them, then the store's
own views (quantbench.store.schema.VIEWS) over those: every query of quantbench.store.queries runs unchanged. A run
(or load run) held by several stores is taken from the first that holds it, so your own run wins over the same run
pulled back from a bundle. `run_source` says, for every run, which store it came from and, for a pulled one, its
bundle. Nothing is written: the connection lives for one query, as every read's does (a writer is never blocked
for longer than a read).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from quantbench.store import check
from quantbench.store.home import Source
from quantbench.store.schema import MIGRATIONS, SCHEMA_VERSION, VIEWS

# table -> its key (a row of a source is left out when an earlier source holds that key)
KEYED = {"runs": "run_id", "answers": "run_id", "latencies": "run_id", "load_runs": "load_id",
         "load_steps": "load_id", "bundles": "bundle_id"}
OWNER = {"runs": "runs", "answers": "runs", "latencies": "runs", "load_runs": "load_runs", "load_steps": "load_runs",
         "bundles": "bundles"}
UNKEYED = ("bundle_items",)


def _q(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _tables(con: duckdb.DuckDBPyConnection, catalog: str) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ?",
                                      [catalog]).fetchall()}


def _version(con: duckdb.DuckDBPyConnection, catalog: str) -> int:
    if "schema_version" not in _tables(con, catalog):
        return 0
    return int(con.execute(f"SELECT max(version) FROM {catalog}.schema_version").fetchone()[0] or 0)


class SourceVersionError(ValueError):
    """A store read beside another has a newer schema than this quantbench's, or none."""


def connect(sources: Sequence[Source]) -> duckdb.DuckDBPyConnection:
    """An in-memory connection reading `sources` (those whose file exists, in order) as one store; a store of an
    older schema reads as if migrated (nothing is written to it). Raises duckdb.Error from ATTACH (the caller
    retries a lock) and SourceVersionError for a store of a newer schema, or not a quantbench store."""
    con = duckdb.connect(":memory:")
    try:
        _build(con, [s for s in sources if s.path.exists()])
    except BaseException:
        con.close()
        raise
    return con


def _build(con: duckdb.DuckDBPyConnection, sources: list[Source]) -> None:
    # The empty tables of this schema first: every view has every column, even over no source at all.
    con.execute("ATTACH ':memory:' AS _empty")
    con.execute("USE _empty")
    for migration in MIGRATIONS:
        con.execute(migration)
    con.execute("USE memory")
    held: list[tuple[str, set[str]]] = []
    for i, source in enumerate(sources):
        name = f"_s{i}"
        con.execute(f"ATTACH {_q(source.path)} AS {name} (READ_ONLY)")
        version = _version(con, name)
        if version > SCHEMA_VERSION or version == 0:
            fix = "upgrade quantbench to read it" if version else "it is not a quantbench results store"
            raise SourceVersionError(f"{source.path} ({source.label}) has schema version {version}, this quantbench "
                                     f"reads up to {SCHEMA_VERSION}: {fix}")
        why = check.damage(con, name, source.path, version)
        if why:
            raise SourceVersionError(f"{why} ({source.label})")
        held.append((name, _tables(con, name)))
    for table, key in KEYED.items():
        parts = [f"SELECT * FROM _empty.{table}"]
        for i, (name, tables) in enumerate(held):
            if table not in tables:
                continue
            earlier = [f"SELECT {key} FROM {prev}.{OWNER[table]}" for prev, t in held[:i] if OWNER[table] in t]
            where = f" WHERE {key} NOT IN ({' UNION ALL '.join(earlier)})" if earlier else ""
            parts.append(f"SELECT {_as_current(con, name, table)} FROM {name}.{table}{where}")
        con.execute(f"CREATE VIEW {table} AS " + " UNION ALL ".join(parts))
    for table in UNKEYED:
        parts = [f"SELECT * FROM _empty.{table}"] + [f"SELECT {_as_current(con, name, table)} FROM {name}.{table}"
                                                     for name, t in held if table in t]
        con.execute(f"CREATE VIEW {table} AS SELECT DISTINCT * FROM ({' UNION ALL '.join(parts)})")
    con.execute(VIEWS)
    if any("runs" in tables for _, tables in held):
        con.execute(_run_source(sources, held))


def _as_current(con: duckdb.DuckDBPyConnection, catalog: str, table: str) -> str:
    """The select list that reads `catalog.table` with this schema's columns, in order: a column an older store
    lacks takes the default its migration gives it (role 'candidate', modality 'text'), as a migration would."""
    have = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND "
                                      "table_name = ?", [catalog, table]).fetchall()}
    out = []
    for column, default, dtype in con.execute(
            "SELECT column_name, column_default, data_type FROM duckdb_columns() WHERE database_name = '_empty' AND "
            "table_name = ? ORDER BY column_index", [table]).fetchall():
        ident = '"' + column.replace('"', '""') + '"'
        out.append(ident if column in have else f"CAST({default or 'NULL'} AS {dtype}) AS {ident}")
    return ", ".join(out)


def _run_source(sources: list[Source], held: list[tuple[str, set[str]]]) -> str:
    """`run_source` over several stores: the store each run is read from (its kind and label) and, when that store
    pulled it in a bundle, the bundle (schema.RUN_SOURCE says the same of one store)."""
    parts = []
    for i, ((name, tables), source) in enumerate(zip(held, sources, strict=True)):
        if "runs" not in tables:
            continue
        earlier = [f"SELECT run_id FROM {prev}.runs" for prev, t in held[:i] if "runs" in t]
        where = f" WHERE r.run_id NOT IN ({' UNION ALL '.join(earlier)})" if earlier else ""
        if {"bundles", "bundle_items"} <= tables:
            bundle = (f"LEFT JOIN (SELECT i.item_id, b.* FROM {name}.bundle_items i JOIN {name}.bundles b USING "
                      f"(bundle_id) WHERE i.kind = 'run' AND i.added) b ON b.item_id = r.run_id")
            cols = ("b.bundle_id, b.name AS bundle, b.publisher_host AS bundle_host, b.published_at AS "
                    "bundle_published_at, b.pulled_from, b.pulled_at")
        else:
            bundle = ""
            cols = ("NULL::VARCHAR AS bundle_id, NULL::VARCHAR AS bundle, NULL::VARCHAR AS bundle_host, "
                    "NULL::TIMESTAMPTZ AS bundle_published_at, NULL::VARCHAR AS pulled_from, "
                    "NULL::TIMESTAMPTZ AS pulled_at")
        parts.append(f"SELECT r.run_id, {_q(source.label)} AS store, {_q(source.kind)} AS store_kind, {cols} "
                     f"FROM {name}.runs r {bundle}{where}")
    return "CREATE OR REPLACE VIEW run_source AS " + " UNION ALL ".join(parts)
