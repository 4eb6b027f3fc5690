"""Sharing results: export the store to Parquet; merge Parquet exports, other stores and folders into it.

An export is one Parquet file with one row per run: the run's columns, plus `answers` and `latencies` as lists of
structs, so a run travels whole. The file's key-value metadata carries `quantbench_schema_version`. DuckDB 2.x
files cannot be read by DuckDB 1.x, so Parquet is what to share.

Merging is idempotent: runs are keyed by their UUIDv7 `run_id`, a run already in the store is skipped, and a new
run comes in with all its answers and latencies in one transaction per source. Sources from an older schema merge
(missing columns take their defaults: a version-1 run becomes role 'candidate'); newer ones are refused. A run
keeps its identity (host, GPU, versions): nothing is rewritten on the way in.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

from quantbench.store import SCHEMA_VERSION, Store, StoreError

VERSION_KEY = "quantbench_schema_version"
TABLES = ("runs", "answers", "latencies")
NESTED_ORDER = {"answers": "record_id, question", "latencies": "seq"}
SOURCE_SUFFIXES = {".parquet": "parquet", ".duckdb": "duckdb", ".db": "duckdb"}


def _q(path: Path | str) -> str:
    """A path as a SQL string literal (table functions in views cannot take parameters)."""
    return "'" + str(path).replace("'", "''") + "'"


def _columns(con: duckdb.DuckDBPyConnection, relation: str) -> list[str]:
    return [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- export --------------------------------------------------------------------------------------------------
def copy_nested(con: duckdb.DuckDBPyConnection, out: Path, version: int, catalog: str = "") -> int:
    """Write every run of `catalog` (the connection's own database by default) to `out`; returns the run count."""
    prefix = f"{catalog}." if catalog else ""
    lists = []
    for table in ("answers", "latencies"):
        cols = [c for c in _columns(con, prefix + table) if c != "run_id"]
        fields = ", ".join(f"{_ident(c)} := {_ident(c)}" for c in cols)
        lists.append(f"LEFT JOIN (SELECT run_id, list(struct_pack({fields}) ORDER BY {NESTED_ORDER[table]}) AS {table} "
                     f"FROM {prefix}{table} GROUP BY run_id) USING (run_id)")
    con.execute(
        f"COPY (SELECT r.*, answers, latencies FROM {prefix}runs r {' '.join(lists)} ORDER BY r.created_at, r.run_id) "
        f"TO {_q(out)} (FORMAT parquet, COMPRESSION zstd, KV_METADATA {{{VERSION_KEY}: '{version}'}})"
    )
    return con.execute(f"SELECT count(*) FROM {prefix}runs").fetchone()[0]


def _export_path(out: str | os.PathLike[str]) -> Path:
    path = Path(out)
    if path.suffix == ".parquet":
        return path
    if path.is_dir() or str(out).endswith(os.sep):
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        return path / f"quantbench-{socket.gethostname()}-{stamp}.parquet"
    raise StoreError(f"--out {out}: give a .parquet file (e.g. results.parquet) or an existing folder")


def export(store: Store, out: str | os.PathLike[str]) -> list[Path]:
    """Export every run (with its answers and latencies) to one Parquet file; returns the files written."""
    if not store.path.exists():
        raise StoreError(f"no results store at {store.path}; nothing to export (run `quantbench demo` first)")
    path = _export_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    with store.connect(write=True) as con:
        con.execute("CHECKPOINT")  # recent rows sit in the .wal until then
        copy_nested(con, tmp, Store.version_of(con))
    tmp.replace(path)  # a reader never sees half a file
    return [path]


# -- merge ---------------------------------------------------------------------------------------------------
@dataclass
class SourceSummary:
    path: str
    kind: str  # parquet | duckdb
    schema_version: int
    runs_in_source: int = 0
    runs_added: int = 0
    runs_present: int = 0  # already in the store: skipped
    answers_added: int = 0
    latencies_added: int = 0


@dataclass
class MergeSummary:
    sources: list[SourceSummary] = field(default_factory=list)
    added: pd.DataFrame = field(default_factory=pd.DataFrame)  # the new runs: who, where, what
    skipped: list[str] = field(default_factory=list)  # files left out, with the reason

    @property
    def runs_added(self) -> int:
        return sum(s.runs_added for s in self.sources)

    @property
    def runs_present(self) -> int:
        return sum(s.runs_present for s in self.sources)


class PartialMergeError(StoreError):
    """A source failed after the ones before it were merged (each source commits on its own): `summary` says what
    was added, so the caller can show it beside the error."""

    def __init__(self, message: str, summary: MergeSummary) -> None:
        super().__init__(message)
        self.summary = summary


def expand_sources(store: Store, sources: list[str | os.PathLike[str]]) -> tuple[list[Path], list[str]]:
    """Files to merge, in order: folders expand to their .parquet and .duckdb files (recursively)."""
    files, skipped = [], []
    own = store.path.resolve()
    for src in sources:
        p = Path(src)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in SOURCE_SUFFIXES)
            if not found:
                raise StoreError(f"{p}: no .parquet or .duckdb files in this folder")
            for f in found:
                if f.resolve() == own:
                    skipped.append(f"{f} (the store itself)")
                else:
                    files.append(f)
        elif p.is_file():
            if p.suffix not in SOURCE_SUFFIXES:
                raise StoreError(f"{p}: unknown kind of file; merge .parquet exports, .duckdb stores or folders of them")
            if p.resolve() == own:
                raise StoreError(f"{p} is the store being merged into; give another store or an export")
            files.append(p)
        else:
            raise StoreError(f"{p}: no such file or folder")
    return files, skipped


def _stage_parquet(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    """Views _src_runs / _src_answers / _src_latencies over an export; returns its schema version."""
    cols = _columns(con, f"read_parquet({_q(path)})")
    missing = {"run_id", "status", "answers", "latencies"} - set(cols)
    if missing:
        raise StoreError(f"{path}: not a quantbench export (no column(s) {sorted(missing)}); make one with "
                         "`quantbench export --out FILE.parquet`")
    row = con.execute("SELECT value FROM parquet_kv_metadata(?) WHERE key = ?", [str(path), VERSION_KEY]).fetchone()
    if row is None:
        raise StoreError(f"{path}: no {VERSION_KEY} in the Parquet metadata; it was not written by `quantbench export`")
    src = f"read_parquet({_q(path)})"
    con.execute(f"CREATE OR REPLACE TEMP VIEW _src_runs AS SELECT * EXCLUDE (answers, latencies) FROM {src}")
    for table in ("answers", "latencies"):
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_{table} AS "
                    f"SELECT run_id, x.* FROM (SELECT run_id, unnest({table}) AS x FROM {src})")
    return int(row[0])


def _stage_duckdb(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    try:
        con.execute(f"ATTACH {_q(path)} AS _src (READ_ONLY)")
    except duckdb.Error as e:
        raise StoreError(f"{path}: cannot open it as a DuckDB store ({e}); if another process holds it, wait or "
                         "`quantbench export` there and merge the Parquet file") from e
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = '_src' AND table_name = "
                      "'schema_version'").fetchone()[0]
    if not has:
        raise StoreError(f"{path}: not a quantbench store (no schema_version table)")
    for table in TABLES:
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_{table} AS SELECT * FROM _src.{table}")
    return int(con.execute("SELECT max(version) FROM _src.schema_version").fetchone()[0] or 0)


def _merge_staged(con: duckdb.DuckDBPyConnection, summary: SourceSummary) -> pd.DataFrame:
    for table in TABLES:
        unknown = set(_columns(con, f"_src_{table}")) - set(_columns(con, table))
        if unknown:
            raise StoreError(f"{summary.path}: {table} has column(s) {sorted(unknown)} this quantbench does not know; "
                             "upgrade quantbench")
    con.execute("BEGIN")
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _new AS SELECT DISTINCT run_id FROM _src_runs "
                    "WHERE run_id NOT IN (SELECT run_id FROM runs)")
        summary.runs_in_source = con.execute("SELECT count(DISTINCT run_id) FROM _src_runs").fetchone()[0]
        summary.runs_added = con.execute("SELECT count(*) FROM _new").fetchone()[0]
        summary.runs_present = summary.runs_in_source - summary.runs_added
        counts = {}
        for table in TABLES:
            src_cols = set(_columns(con, f"_src_{table}"))
            cols = ", ".join(_ident(c) for c in _columns(con, table) if c in src_cols)  # absent: the default
            counts[table] = con.execute(
                f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _src_{table} WHERE run_id IN (SELECT run_id FROM _new)"
            ).fetchone()[0]
        summary.answers_added, summary.latencies_added = counts["answers"], counts["latencies"]
        added = con.execute(
            "SELECT CAST(run_id AS VARCHAR) AS run_id, created_at, status, backend, variant, role, model_id, weights, "
            "device, gpu_name, gpu_family, host FROM runs WHERE run_id IN (SELECT run_id FROM _new) ORDER BY created_at"
        ).fetchdf()
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    added.insert(0, "source", summary.path)
    return added


def merge(store: Store, sources: list[str | os.PathLike[str]]) -> MergeSummary:
    """Merge exports / stores / folders into `store`; running it twice adds nothing the second time."""
    files, skipped = expand_sources(store, sources)
    result = MergeSummary(skipped=skipped)
    frames = []
    with store.connect(write=True) as con:
        for i, path in enumerate(files):
            kind = SOURCE_SUFFIXES[path.suffix]
            try:
                try:
                    version = _stage_parquet(con, path) if kind == "parquet" else _stage_duckdb(con, path)
                    if version > SCHEMA_VERSION:
                        raise StoreError(f"{path} has schema version {version}, newer than this quantbench "
                                         f"({SCHEMA_VERSION}); upgrade quantbench to merge it")
                    summary = SourceSummary(str(path), kind, version)
                    frames.append(_merge_staged(con, summary))
                    result.sources.append(summary)
                except duckdb.Error as e:
                    raise StoreError(f"{path}: merge failed ({e}); nothing from this file was added") from e
                finally:
                    if kind == "duckdb":
                        con.execute("DETACH DATABASE IF EXISTS _src")
            except StoreError as e:
                if not result.sources:
                    raise
                # The sources before this one are committed: say so, and what they added.
                result.added = pd.concat(frames, ignore_index=True)
                rest = len(files) - i - 1
                raise PartialMergeError(
                    f"{e}. Merged before it: {result.runs_added} new run(s) from {len(result.sources)} source(s) "
                    f"(listed above); not merged: {path}" + (f" and the {rest} source(s) after it" if rest else "")
                    + ". Fix it and merge again: runs already merged are skipped.", result) from e
    result.added = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return result


def exported_counts(path: Path) -> tuple[int, int]:
    """(runs, answers) in one export file."""
    con = duckdb.connect()
    try:
        runs, answers = con.execute(
            f"SELECT count(*), coalesce(sum(len(answers)), 0) FROM read_parquet({_q(path)})").fetchone()
    finally:
        con.close()
    return runs, answers
