"""Sharing results: export the store to Parquet; merge Parquet exports, other stores and folders into it.

An export is one Parquet file with one row per run: the run's columns, plus `answers` and `latencies` as lists of
structs, so a run travels whole. A load run (`quantbench load`, schema 6) is one more row, its run columns NULL and
its own in `load_run`: a struct of the `load_runs` columns with its `steps` as a list. The file's key-value
metadata carries `quantbench_schema_version`. DuckDB 2.x files cannot be read by DuckDB 1.x, so Parquet is what to
share.

Merging is idempotent: runs are keyed by their UUIDv7 `run_id`, load runs by their `load_id`; one already in the
store is skipped, and a new one comes in with all its answers and latencies (its steps) in one transaction per
source. Sources from an older schema merge (missing columns take their defaults: a version-1 run becomes role
'candidate'; a source from before version 6 has no load runs); newer ones are refused. A run keeps its identity
(host, GPU, versions), a load run its server and generator: nothing is rewritten on the way in.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd

from quantbench.store import (
    DATA_ERRORS,
    SCHEMA_VERSION,
    Store,
    StoreError,
    StoreUnavailableError,
    check,
    wal_fix,
)
from quantbench.store.nested import (  # the export's layout: written by copy_nested, read back here
    LOAD_COLUMN,
    LOAD_TABLES,
    TABLES,
    VERSION_KEY,
    copy_nested,
)
from quantbench.store.nested import columns as _columns
from quantbench.store.nested import has_tables as _has_tables
from quantbench.store.nested import ident as _ident
from quantbench.store.nested import quote as _q
from quantbench.store.schema import RUN_STATUSES

SOURCE_SUFFIXES = {".parquet": "parquet", ".duckdb": "duckdb", ".db": "duckdb"}


# -- export --------------------------------------------------------------------------------------------------
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
    tmp = path.with_name(path.name + ".partial")
    # Read only, the file's own tables (the rows in its .wal are read through it): a store on a read-only disk, or
    # the shipped results, exports too; opening it to write refused them, and changed the store being exported.
    with store.connect(write=False, as_stored=True) as con:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            copy_nested(con, tmp, Store.version_of(con))
            tmp.replace(path)  # a reader never sees half a file
        except (duckdb.IOException, OSError) as e:  # a read-only or full disk: was DuckDB's traceback
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StoreError(f"--out {path}: cannot write it ({_first_line(e)}); give a file in a folder this user "
                             "may write, on a disk with free space") from e
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
    load_runs_in_source: int = 0  # quantbench load's runs (schema 6); a source from before has none
    load_runs_added: int = 0
    load_runs_present: int = 0
    load_steps_added: int = 0
    load_added: list[tuple] = field(default_factory=list)  # (runs, server variant, GPU, kernel, generator host)


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

    @property
    def load_runs_added(self) -> int:
        return sum(s.load_runs_added for s in self.sources)


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
            if bundle := _bundle_in(p):  # its per-table Parquet files are no exports: each was "not one"
                raise StoreError(f"{bundle}: a result bundle (its manifest.json), not exports; verify and merge it "
                                 f"with `quantbench pull {bundle}` (--db for another store than yours)")
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


def _bundle_in(folder: Path) -> Path | None:
    """The folder, at or under `folder`, that holds a quantbench result bundle's manifest (quantbench.store.bundle),
    or None."""
    from quantbench.store.bundle import FORMAT, MANIFEST  # lazy: the bundle module reads through this one

    for manifest in sorted(folder.rglob(MANIFEST)):
        try:
            fmt = json.loads(manifest.read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            continue
        if fmt == FORMAT:
            return manifest.parent
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _not_parquet(path: Path, e: duckdb.Error) -> StoreError:
    first = _first_line(e)
    return StoreError(f"{path}: not a whole Parquet file ({first}); if it was cut short in a copy, copy it again, or "
                      "make it again with `quantbench export --out FILE.parquet`")


def _stage_parquet(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[int, bool]:
    """Views _src_runs / _src_answers / _src_latencies (and _src_load_runs / _src_load_steps when the export
    carries load runs) over an export; returns its schema version and whether it carries load runs."""
    try:
        cols = _columns(con, f"read_parquet({_q(path)})")
    except duckdb.Error as e:  # a truncated or foreign file: Parquet's footer is at the end
        raise _not_parquet(path, e) from e
    missing = {"run_id", "status", "answers", "latencies"} - set(cols)
    if missing:
        raise StoreError(f"{path}: not a quantbench export (no column(s) {sorted(missing)}); make one with "
                         "`quantbench export --out FILE.parquet`")
    row = con.execute("SELECT value FROM parquet_kv_metadata(?) WHERE key = ?", [str(path), VERSION_KEY]).fetchone()
    if row is None:
        raise StoreError(f"{path}: no {VERSION_KEY} in the Parquet metadata; it was not written by `quantbench export`")
    src = f"read_parquet({_q(path)})"
    has_load = LOAD_COLUMN in cols
    if not has_load:
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_runs AS SELECT * EXCLUDE (answers, latencies) FROM {src}")
    else:
        try:
            con.execute(f"SELECT {LOAD_COLUMN}.load_id, {LOAD_COLUMN}.steps[1].step FROM {src} LIMIT 0")
        except duckdb.Error as e:
            raise StoreError(f"{path}: its {LOAD_COLUMN} column is not a quantbench load run (no load_id, or no steps "
                             "with a step number); make the file with `quantbench export --out FILE.parquet`") from e
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_runs AS SELECT * EXCLUDE (answers, latencies, {LOAD_COLUMN}) "
                    f"FROM {src} WHERE {LOAD_COLUMN} IS NULL")
        loads = f"(SELECT {LOAD_COLUMN} AS l FROM {src} WHERE {LOAD_COLUMN} IS NOT NULL)"
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_load_runs AS SELECT * EXCLUDE (steps) FROM "
                    f"(SELECT unnest(l) FROM {loads})")
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_load_steps AS SELECT load_id, x.* FROM "
                    f"(SELECT l.load_id AS load_id, unnest(l.steps) AS x FROM {loads})")
    for table in ("answers", "latencies"):
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_{table} AS "
                    f"SELECT run_id, x.* FROM (SELECT run_id, unnest({table}) AS x FROM {src})")
    return int(row[0]), has_load


def _stage_duckdb(con: duckdb.DuckDBPyConnection, path: Path) -> tuple[int, bool]:
    """The same views over another store; returns its schema version and whether it has the load tables."""
    try:
        con.execute(f"ATTACH {_q(path)} AS _src (READ_ONLY)")
    except duckdb.Error as e:
        if "replaying wal" in str(e).lower():
            raise StoreError(f"{path}: {wal_fix(path, _first_line(e))}") from e
        raise StoreError(f"{path}: cannot open it as a DuckDB store ({e}); if another process holds it, wait or "
                         "`quantbench export` there and merge the Parquet file") from e
    has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = '_src' AND table_name = "
                      "'schema_version'").fetchone()[0]
    if not has:
        raise StoreError(f"{path}: not a quantbench store (no schema_version table)")
    version = int(con.execute("SELECT max(version) FROM _src.schema_version").fetchone()[0] or 0)
    load = _has_tables(con, "_src", LOAD_TABLES)
    if len(load) == 1:
        raise StoreError(f"{path}: has {load[0]} but not {({*LOAD_TABLES} - {*load}).pop()}: not a whole quantbench "
                         "store (a load run is stored with its steps); merge an export of it instead")
    why = check.damage(con, "_src", path, min(version, SCHEMA_VERSION))  # a newer one is refused by the caller
    if why:
        raise StoreError(why.replace("give another --db (a new store is made by the next run)",
                                     "merge an export of it made where it was whole"))
    for table in (*TABLES, *load):
        con.execute(f"CREATE OR REPLACE TEMP VIEW _src_{table} AS SELECT * FROM _src.{table}")
    return version, bool(load)


def _merge_staged(con: duckdb.DuckDBPyConnection, summary: SourceSummary, has_load: bool) -> pd.DataFrame:
    for table in (*TABLES, *(LOAD_TABLES if has_load else ())):
        unknown = set(_columns(con, f"_src_{table}")) - set(_columns(con, table))
        if unknown:
            raise StoreError(f"{summary.path}: {table} has column(s) {sorted(unknown)} this quantbench does not know; "
                             "upgrade quantbench")
    con.execute("BEGIN")
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _new AS SELECT DISTINCT run_id FROM _src_runs "
                    "WHERE run_id NOT IN (SELECT run_id FROM runs)")
        _refuse_unknown_status(con, summary)
        _refuse_orphans(con, summary)
        summary.runs_in_source = con.execute("SELECT count(DISTINCT run_id) FROM _src_runs").fetchone()[0]
        summary.runs_added = con.execute("SELECT count(*) FROM _new").fetchone()[0]
        summary.runs_present = summary.runs_in_source - summary.runs_added
        counts = {table: _insert_new(con, table, "run_id", "_new") for table in TABLES}
        summary.answers_added, summary.latencies_added = counts["answers"], counts["latencies"]
        if has_load:
            _merge_load_runs(con, summary)
        added = con.execute(
            "SELECT CAST(run_id AS VARCHAR) AS run_id, created_at, status, backend, variant, role, model_id, weights, "
            "device, gpu_name, gpu_family, host, machine_id, gpu_uuid, cpu_model, cpu_cores FROM runs "
            "WHERE run_id IN (SELECT run_id FROM _new) ORDER BY created_at"
        ).fetchdf()
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):  # a store its failure invalidated refuses ROLLBACK: keep the cause
            con.execute("ROLLBACK")
        raise
    added.insert(0, "source", summary.path)
    return added


def _refuse_unknown_status(con: duckdb.DuckDBPyConnection, summary: SourceSummary) -> None:
    """quantbench stores a run whole, as ok or failed; a new run of the source with any other status (NULL, "running":
    a store another tool or a crashed writer left) is no result to share: the source is refused, nothing merged."""
    odd = con.execute(f"SELECT CAST(run_id AS VARCHAR), CAST(status AS VARCHAR) FROM _src_runs WHERE run_id IN "
                      f"(SELECT run_id FROM _new) AND (status IS NULL OR status NOT IN {RUN_STATUSES!r}) "
                      "ORDER BY 1 LIMIT 4").fetchall()
    if odd:
        shown = ", ".join(f"{run_id} ({status or 'no status'})" for run_id, status in odd)
        raise StoreError(f"{summary.path}: run(s) {shown} are neither ok nor failed: not runs quantbench finished; "
                         "merge an export made by `quantbench export` where they were measured, or leave them out")


def _refuse_orphans(con: duckdb.DuckDBPyConnection, summary: SourceSummary) -> None:
    """Answers or latencies of a run the source has no row of (a store another tool edited, or a run row deleted by
    hand) are a partial source: refused, nothing merged. Only the rows of the source's runs were inserted, so such
    rows were dropped while the merge reported success."""
    orphans = con.execute("SELECT DISTINCT CAST(run_id AS VARCHAR) FROM (SELECT run_id FROM _src_answers UNION ALL "
                          "SELECT run_id FROM _src_latencies) WHERE run_id NOT IN (SELECT run_id FROM _src_runs) "
                          "ORDER BY 1").fetchall()
    if orphans:
        shown = ", ".join(r[0] for r in orphans[:4]) + (f" and {len(orphans) - 4} more" if len(orphans) > 4 else "")
        raise StoreError(f"{summary.path}: answers or latencies of run(s) {shown} that it holds no run row of: a "
                         f"partial source; `quantbench export --db {summary.path} --out FILE.parquet` exports its "
                         "whole runs only: merge that file")


def _insert_new(con: duckdb.DuckDBPyConnection, table: str, key: str, new: str) -> int:
    """Insert the source's rows of `table` whose `key` is in the temp table `new`; the columns the source lacks
    take their defaults. Returns the rows inserted."""
    src_cols = set(_columns(con, f"_src_{table}"))
    cols = ", ".join(_ident(c) for c in _columns(con, table) if c in src_cols)  # absent: the default
    return con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _src_{table} "
                       f"WHERE {key} IN (SELECT {key} FROM {new})").fetchone()[0]


def _merge_load_runs(con: duckdb.DuckDBPyConnection, summary: SourceSummary) -> None:
    """The source's new load runs with their steps, in the caller's transaction. A load run without steps is a
    partial source (quantbench stores one whole or not at all): refused."""
    con.execute("CREATE OR REPLACE TEMP TABLE _new_load AS SELECT DISTINCT load_id FROM _src_load_runs "
                "WHERE load_id NOT IN (SELECT load_id FROM load_runs)")
    stepless = con.execute("SELECT CAST(load_id AS VARCHAR) FROM _new_load WHERE load_id NOT IN "
                           "(SELECT load_id FROM _src_load_steps) ORDER BY 1").fetchall()
    if stepless:
        raise StoreError(f"{summary.path}: load run(s) {', '.join(r[0] for r in stepless)} have no steps: a partial "
                         "source; export the store they were measured into again and merge that file")
    summary.load_runs_in_source = con.execute("SELECT count(DISTINCT load_id) FROM _src_load_runs").fetchone()[0]
    summary.load_runs_added = con.execute("SELECT count(*) FROM _new_load").fetchone()[0]
    summary.load_runs_present = summary.load_runs_in_source - summary.load_runs_added
    _insert_new(con, "load_runs", "load_id", "_new_load")
    summary.load_steps_added = _insert_new(con, "load_steps", "load_id", "_new_load")
    summary.load_added = con.execute(
        "SELECT count(*), server_variant, server_gpu, server_kernel_path, host FROM load_runs WHERE load_id IN "
        "(SELECT load_id FROM _new_load) GROUP BY ALL ORDER BY min(created_at)").fetchall()


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
                    stage = _stage_parquet if kind == "parquet" else _stage_duckdb
                    version, has_load = stage(con, path)
                    if version > SCHEMA_VERSION:
                        raise StoreError(f"{path} has schema version {version}, newer than this quantbench "
                                         f"({SCHEMA_VERSION}); upgrade quantbench to merge it")
                    summary = SourceSummary(str(path), kind, version)
                    frames.append(_merge_staged(con, summary, has_load))
                    result.sources.append(summary)
                except duckdb.Error as e:
                    raise _merge_error(store, path, kind, e) from e
                finally:
                    if kind == "duckdb":
                        with contextlib.suppress(duckdb.Error):  # refused by a store its failure invalidated
                            con.execute("DETACH DATABASE IF EXISTS _src")
            except StoreError as e:
                if not result.sources:
                    raise
                # The sources before this one are committed: say so, and what they added.
                result.added = pd.concat(frames, ignore_index=True)
                rest = len(files) - i - 1
                loads = f" and {result.load_runs_added} new load run(s)" if result.load_runs_added else ""
                raise PartialMergeError(
                    f"{e}. Merged before it: {result.runs_added} new run(s){loads} from {len(result.sources)} source(s) "
                    f"(listed above); not merged: {path}" + (f" and the {rest} source(s) after it" if rest else "")
                    + ". Fix it and merge again: runs already merged are skipped.", result) from e
    result.added = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return result


def _merge_error(store: Store, path: Path, kind: str, e: duckdb.Error) -> StoreError:
    """DuckDB's error while merging the source `path`, naming the file that failed. Every statement of a merge reads
    the source and reads or writes the store at once, so which one failed is told apart here: the source when it
    holds rows the store refuses, or when it cannot be read whole on its own; else the store merged into (its disk
    full, its file not writable, or damaged in a block the open-time check does not read). Naming the source then
    sent the user to fix a file that was whole."""
    if isinstance(e, DATA_ERRORS) or _unreadable(path, kind) is not None:
        return StoreError(f"{path}: merge failed ({e}); nothing from this file was added")
    first = _first_line(e)
    if "corrupt" in first.lower() or "checksum" in first.lower():
        return StoreUnavailableError(f"{store.path} is damaged, the store being merged into ({first}); nothing "
                                     f"from {path} was added (it reads whole); {check.FIX}")
    return StoreUnavailableError(f"cannot merge into {store.path}: {first}; nothing from {path} was added (it reads "
                                 f"whole: the store merged into failed); free space on the disk of {store.path} or "
                                 "fix its permissions and merge again, or give another --db")


def _unreadable(path: Path, kind: str) -> str | None:
    """Why the source cannot be read whole (every column of every row of its tables), or None. Read on a connection
    of its own: a failure of the store merged into (which may leave its connection unusable) is not the source's."""
    con = duckdb.connect()
    try:
        if kind == "parquet":
            con.execute(f"SELECT bit_xor(hash(t)) FROM read_parquet({_q(path)}) AS t").fetchall()
            return None
        con.execute(f"ATTACH {_q(path)} AS _src (READ_ONLY)")
        for table in _has_tables(con, "_src", (*TABLES, *LOAD_TABLES)):
            con.execute(f"SELECT bit_xor(hash(t)) FROM _src.{table} AS t").fetchall()
        return None
    except duckdb.Error as e:
        return _first_line(e)
    finally:
        con.close()


def exported_counts(path: Path) -> tuple[int, int]:
    """(runs, answers) in one export file (a load run's row has no run_id)."""
    con = duckdb.connect()
    try:
        runs, answers = con.execute(
            f"SELECT count(run_id), coalesce(sum(len(answers)), 0) FROM read_parquet({_q(path)})").fetchone()
    finally:
        con.close()
    return runs, answers


def exported_load_counts(path: Path) -> tuple[int, int]:
    """(load runs, their steps) in one export file; (0, 0) for an export without load runs."""
    con = duckdb.connect()
    try:
        if LOAD_COLUMN not in _columns(con, f"read_parquet({_q(path)})"):
            return 0, 0
        return con.execute(f"SELECT count({LOAD_COLUMN}), coalesce(sum(len({LOAD_COLUMN}.steps)), 0) "
                           f"FROM read_parquet({_q(path)})").fetchone()
    finally:
        con.close()
