"""`quantbench pull`: verify a result bundle whole, then merge it in one transaction.

The source is copied into a private folder first (quantbench.store.fetch: size limits, timeouts, hostile archives
refused). Then, before the store is opened for writing, every check that can refuse the bundle runs:
  - manifest.json is a quantbench bundle manifest of a format and schema this quantbench reads (a newer schema is
    refused: upgrade quantbench), and, given `--sha256`, is the very manifest the publisher announced;
  - the folder holds exactly the files the manifest lists, each of the size and sha256 it states (a file cut short
    or changed after publishing is refused, named);
  - each file is whole Parquet with the row count stated, columns this schema knows, unique keys, and runs, answers,
    latencies, load runs and steps that belong together (the run ids and load ids the manifest lists, no orphans).
Only then are the new runs (and load runs) inserted, with the bundle's record, in one transaction: a bundle is
merged whole or not at all. Runs already in the store are skipped (idempotent: pulling the same bundle twice adds
nothing); every row keeps its identity (host, GPU, versions) as measured.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from quantbench.store import SCHEMA_VERSION, Store
from quantbench.store.bundle import (
    FILES,
    FORMAT,
    FORMAT_VERSION,
    LOAD_FILES,
    MANIFEST,
    RUN_FILES,
    BundleError,
    sha256_file,
)
from quantbench.store.fetch import Limits, staged
from quantbench.store.schema import MIGRATIONS

MAX_MANIFEST_BYTES = 16 << 20
PRIMARY = {"runs": ("run_id",), "answers": ("run_id", "record_id", "question"), "latencies": ("run_id", "seq"),
           "load_runs": ("load_id",), "load_steps": ("load_id", "step")}


class BundleRefused(BundleError):
    """The bundle failed a check; nothing from it was merged."""


@dataclass
class Verified:
    manifest: dict[str, Any]
    digest: str  # sha256 of manifest.json as received


@dataclass
class PullSummary:
    source: str
    bundle_id: str
    name: str
    digest: str
    published_at: str | None
    publisher_host: str | None
    quantbench: dict[str, Any]
    runs_in_bundle: int = 0
    runs_added: int = 0
    answers_added: int = 0
    latencies_added: int = 0
    load_runs_in_bundle: int = 0
    load_runs_added: int = 0
    load_steps_added: int = 0
    already_pulled_at: str | None = None  # this bundle was pulled before (then nothing is added)
    added: pd.DataFrame | None = None  # the new runs: who, where, what

    @property
    def runs_present(self) -> int:
        return self.runs_in_bundle - self.runs_added

    @property
    def load_runs_present(self) -> int:
        return self.load_runs_in_bundle - self.load_runs_added


def pull(store: Store, source: str, limits: Limits | None = None, expect_sha256: str | None = None) -> PullSummary:
    """Fetch, verify and merge one bundle into `store` (see the module's docstring)."""
    with staged(source, limits or Limits()) as folder:
        verified = verify(folder, source, expect_sha256)
        return merge(store, folder, verified, source)


def _refuse(source: str, what: str, reason: str) -> BundleRefused:
    return BundleRefused(f"{source}: {what}: {reason}; nothing was merged")


def _uuid(text: Any) -> bool:
    try:
        uuid.UUID(str(text))
        return isinstance(text, str)
    except ValueError:
        return False


def read_manifest(folder: Path, source: str) -> Verified:
    """manifest.json, checked for shape, format and schema version."""
    path = folder / MANIFEST
    if not path.is_file():
        raise _refuse(source, MANIFEST, "missing: not a quantbench bundle (make one with `quantbench publish`)")
    raw = path.read_bytes()
    if len(raw) > MAX_MANIFEST_BYTES:
        raise _refuse(source, MANIFEST, f"{len(raw):,} bytes, more than a manifest takes ({MAX_MANIFEST_BYTES:,})")
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise _refuse(source, MANIFEST, f"not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise _refuse(source, MANIFEST, f"not a quantbench bundle manifest (format is not {FORMAT!r})")
    fv, sv = m.get("format_version"), m.get("schema_version")
    if not isinstance(fv, int) or fv < 1:
        raise _refuse(source, MANIFEST, f"format_version {fv!r} is not a version number")
    if fv > FORMAT_VERSION:
        raise _refuse(source, MANIFEST, f"bundle format version {fv}, newer than this quantbench reads "
                      f"({FORMAT_VERSION}); upgrade quantbench to pull it")
    if not isinstance(sv, int) or sv < 1:
        raise _refuse(source, MANIFEST, f"schema_version {sv!r} is not a version number")
    if sv > SCHEMA_VERSION:
        raise _refuse(source, MANIFEST, f"schema version {sv}, newer than this quantbench's ({SCHEMA_VERSION}); "
                      "upgrade quantbench to pull it")
    if not isinstance(m.get("bundle_id"), str) or not m["bundle_id"]:
        raise _refuse(source, MANIFEST, "no bundle_id")
    for key in ("run_ids", "load_ids"):
        ids = m.get(key)
        if not isinstance(ids, list) or not all(_uuid(i) for i in ids):
            raise _refuse(source, MANIFEST, f"{key} is not a list of run ids (UUIDs)")
        if len(set(ids)) != len(ids):
            raise _refuse(source, MANIFEST, f"{key} names an id twice")
    files = m.get("files")
    if not isinstance(files, list) or not files:
        raise _refuse(source, MANIFEST, "no files listed")
    names = set()
    for f in files:
        if not isinstance(f, dict) or f.get("name") not in FILES or f.get("table") != FILES[f["name"]][0]:
            raise _refuse(source, MANIFEST, f"lists {f!r}, not one of a bundle's files ({', '.join(FILES)})")
        if not (isinstance(f.get("rows"), int) and isinstance(f.get("bytes"), int) and isinstance(f.get("sha256"), str)):
            raise _refuse(source, MANIFEST, f"{f['name']}: rows, bytes and sha256 must be given")
        if f["name"] in names:
            raise _refuse(source, MANIFEST, f"lists {f['name']} twice")
        names.add(f["name"])
    need = {*(RUN_FILES if m["run_ids"] else ()), *(LOAD_FILES if m["load_ids"] else ())}
    if need - names:
        raise _refuse(source, MANIFEST, f"lists no {', '.join(sorted(need - names))} for its "
                      + ("runs" if need & set(RUN_FILES) else "load runs"))
    return Verified(m, hashlib.sha256(raw).hexdigest())


def verify(folder: Path, source: str, expect_sha256: str | None = None) -> Verified:
    """Every check of the module's docstring; raises BundleRefused naming the file and the reason."""
    v = read_manifest(folder, source)
    if expect_sha256 and v.digest != expect_sha256.strip().lower():
        raise _refuse(source, MANIFEST, f"its sha256 is {v.digest}, not the {expect_sha256} you gave (--sha256): not "
                      "the bundle the publisher announced")
    listed = {f["name"]: f for f in v.manifest["files"]}
    present = {p.name for p in folder.iterdir()}
    for extra in sorted(present - set(listed) - {MANIFEST}):
        raise _refuse(source, extra, "not in the manifest (a bundle holds exactly the files its manifest lists)")
    for name, f in listed.items():
        path = folder / name
        if name not in present:
            raise _refuse(source, name, "listed in the manifest but missing")
        size = path.stat().st_size
        if size != f["bytes"]:
            how = "cut short" if size < f["bytes"] else "longer than published"
            raise _refuse(source, name, f"{size:,} bytes, the manifest says {f['bytes']:,}: {how}")
        digest = sha256_file(path)
        if digest != f["sha256"]:
            raise _refuse(source, name, f"sha256 {digest} differs from the manifest's {f['sha256']}: changed or "
                          "corrupted after it was published")
    _check_tables(folder, source, v.manifest)
    return v


def _q(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _check_tables(folder: Path, source: str, m: dict[str, Any]) -> None:
    con = duckdb.connect(":memory:")
    try:
        for migration in MIGRATIONS:  # this schema's empty tables: the columns a file may have
            con.execute(migration)
        for f in m["files"]:
            name, table = f["name"], f["table"]
            src = f"read_parquet({_q(folder / name)})"
            try:
                cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()]
                rows = con.execute(f"SELECT count(*) FROM {src}").fetchone()[0]
            except duckdb.Error as e:
                raise _refuse(source, name, f"not a whole Parquet file ({str(e).splitlines()[0]})") from None
            known = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
            if set(cols) - known:
                raise _refuse(source, name, f"column(s) {sorted(set(cols) - known)} that table {table} does not have")
            if missing := set(PRIMARY[table]) - set(cols):
                raise _refuse(source, name, f"no {', '.join(sorted(missing))} column")
            if rows != f["rows"]:
                raise _refuse(source, name, f"{rows:,} rows, the manifest says {f['rows']:,}")
            key = ", ".join(PRIMARY[table])
            dup = con.execute(f"SELECT count(*) FROM (SELECT {key} FROM {src} GROUP BY ALL HAVING count(*) > 1)"
                              ).fetchone()[0]
            if dup:
                raise _refuse(source, name, f"{dup} {key} value(s) appear more than once")
            con.execute(f"CREATE TEMP VIEW _b_{table} AS SELECT * FROM {src}")
        _check_ids(con, source, "runs.parquet", "_b_runs", "run_id", m["run_ids"])
        _check_ids(con, source, "load_runs.parquet", "_b_load_runs", "load_id", m["load_ids"])
        for fname, view, key, parent in (("answers.parquet", "_b_answers", "run_id", "_b_runs"),
                                         ("latencies.parquet", "_b_latencies", "run_id", "_b_runs"),
                                         ("load_steps.parquet", "_b_load_steps", "load_id", "_b_load_runs")):
            if not _has_view(con, view):
                continue
            orphans = con.execute(f"SELECT count(DISTINCT {key}) FROM {view} WHERE CAST({key} AS VARCHAR) NOT IN "
                                  f"(SELECT CAST({key} AS VARCHAR) FROM {parent})").fetchone()[0]
            if orphans:
                raise _refuse(source, fname, f"rows of {orphans} {key}(s) that are not among the bundle's")
        if _has_view(con, "_b_load_runs"):
            stepless = con.execute("SELECT count(*) FROM _b_load_runs WHERE load_id NOT IN (SELECT load_id FROM "
                                   "_b_load_steps)").fetchone()[0]
            if stepless:
                raise _refuse(source, "load_steps.parquet", f"{stepless} load run(s) without steps")
    finally:
        con.close()


def _has_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [name]).fetchone()[0])


def _check_ids(con, source: str, fname: str, view: str, key: str, listed: list[str]) -> None:
    if not _has_view(con, view):
        return
    held = {str(r[0]) for r in con.execute(f"SELECT CAST({key} AS VARCHAR) FROM {view}").fetchall()}
    if held != {str(i).lower() for i in listed}:
        raise _refuse(source, fname, f"holds {len(held)} {key}s that are not the {len(listed)} the manifest lists")


# -- merging --------------------------------------------------------------------------------------------------
def merge(store: Store, folder: Path, verified: Verified, source: str) -> PullSummary:
    """Insert a verified bundle's new runs and load runs, and its record, in one transaction."""
    m = verified.manifest
    summary = PullSummary(source, m["bundle_id"], str(m.get("name") or m["bundle_id"]), verified.digest,
                          m.get("published_at"), (m.get("publisher") or {}).get("host"), m.get("quantbench") or {},
                          runs_in_bundle=len(m["run_ids"]), load_runs_in_bundle=len(m["load_ids"]))
    with store.connect(write=True) as con:
        before = con.execute("SELECT digest, pulled_at FROM bundles WHERE bundle_id = ?", [m["bundle_id"]]).fetchone()
        if before is not None:
            if before[0] != verified.digest:
                raise _refuse(source, MANIFEST, f"bundle {m['bundle_id']} was pulled before with another manifest "
                              f"(sha256 {before[0]}): the same bundle id with other contents is not merged")
            summary.already_pulled_at = str(before[1])
        con.execute("BEGIN")
        try:
            for f in m["files"]:
                con.execute(f"CREATE OR REPLACE TEMP VIEW _b_{f['table']} AS SELECT * FROM "
                            f"read_parquet({_q(folder / f['name'])})")
            if m["run_ids"]:
                new = _new_ids(con, "runs", "run_id")
                summary.runs_added = _insert(con, "runs", "run_id", new)
                summary.answers_added = _insert(con, "answers", "run_id", new)
                summary.latencies_added = _insert(con, "latencies", "run_id", new)
                _items(con, m["bundle_id"], "run", m["run_ids"], new, before is None)
                summary.added = con.execute(
                    "SELECT CAST(run_id AS VARCHAR) AS run_id, created_at, status, variant, model_id, device, "
                    "gpu_name, gpu_family, host, machine_id, gpu_uuid, cpu_model, cpu_cores FROM runs "
                    "WHERE run_id IN (SELECT run_id FROM _new_runs) ORDER BY created_at"
                ).fetchdf()
            if m["load_ids"]:
                new = _new_ids(con, "load_runs", "load_id")
                summary.load_runs_added = _insert(con, "load_runs", "load_id", new)
                summary.load_steps_added = _insert(con, "load_steps", "load_id", new)
                _items(con, m["bundle_id"], "load_run", m["load_ids"], new, before is None)
            if before is None:
                q = m.get("quantbench") or {}
                con.execute("INSERT INTO bundles VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                    m["bundle_id"], verified.digest, m.get("name"), m.get("published_at"),
                    summary.publisher_host, q.get("version"), q.get("commit"), source,
                    dt.datetime.now(dt.UTC), json.dumps(m)])
            con.execute("COMMIT")
        except duckdb.Error as e:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise _refuse(source, "the merge", f"the store refused a row ({str(e).splitlines()[0]})") from None
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
    return summary


def _new_ids(con: duckdb.DuckDBPyConnection, table: str, key: str) -> str:
    name = f"_new_{table}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT DISTINCT CAST({key} AS UUID) AS {key} FROM _b_{table} "
                f"WHERE CAST({key} AS UUID) NOT IN (SELECT {key} FROM {table})")
    return name


def _insert(con: duckdb.DuckDBPyConnection, table: str, key: str, new: str) -> int:
    """The bundle's rows of `table` whose key is new; columns the bundle lacks (an older schema) take their
    defaults. Returns the rows inserted."""
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM _b_{table}").fetchall()}
    cols = ", ".join(f'"{c}"' for c in (r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()) if c in have)
    return con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _b_{table} "
                       f"WHERE CAST({key} AS UUID) IN (SELECT {key} FROM {new})").fetchone()[0]


def _items(con: duckdb.DuckDBPyConnection, bundle_id: str, kind: str, ids: list[str], new: str, first: bool) -> None:
    """One bundle_items row per id the bundle carries, `added` where this pull inserted it (first pull only)."""
    if not first:
        return
    key = "run_id" if kind == "run" else "load_id"
    con.execute(f"INSERT INTO bundle_items SELECT ?, ?, i, i IN (SELECT {key} FROM {new}) "
                "FROM (SELECT unnest(?::UUID[]) AS i)", [bundle_id, kind, ids])
