"""The results store: the only code that writes DuckDB.

DuckDB allows one read-write process or many read-only ones, so every connection here is short-lived: the
writer opens, writes one run in one transaction, closes (retrying while another process holds the lock); readers
open read-only per query. A dashboard left open therefore never blocks `quantbench run`.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from quantbench.errors import QuantbenchError
from quantbench.store.schema import MIGRATIONS, SCHEMA_VERSION, VIEWS

DEFAULT_DB = "results.duckdb"
LOCK_RETRY_S = 60.0


def default_db() -> str:
    return os.environ.get("QUANTBENCH_DB", DEFAULT_DB)


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits. Sorts by creation time; unique across
    machines, so stores merge without collisions."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | rand & ((1 << 80) - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


class StoreError(QuantbenchError):
    pass


@dataclass
class RunResult:
    """One run's rows, made by the runner (or a remote task) and written here in one transaction."""

    run: dict[str, Any]
    answers: list[dict[str, Any]] = field(default_factory=list)
    latencies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])


def _is_lock_error(e: Exception) -> bool:
    text = str(e).lower()
    return "lock" in text and ("could not set" in text or "conflicting" in text)


class Store:
    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path or default_db())

    # -- connections -----------------------------------------------------------------------------------------
    @contextmanager
    def connect(self, *, write: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; a writer waits (up to LOCK_RETRY_S) while another process holds the file."""
        if not write and not self.path.exists():
            raise StoreError(f"no results store at {self.path}; run `quantbench demo` or `quantbench run` first")
        deadline = time.monotonic() + LOCK_RETRY_S
        delay = 0.05
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=not write)
                break
            except duckdb.Error as e:
                if not _is_lock_error(e) or time.monotonic() > deadline:
                    raise StoreError(f"cannot open {self.path}: {e}") from e
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            if write:
                self._migrate(con)
            yield con
        finally:
            con.close()

    @staticmethod
    def version_of(con: duckdb.DuckDBPyConnection) -> int:
        has = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_version'"
        ).fetchone()[0]
        if not has:
            return 0
        row = con.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _migrate(self, con: duckdb.DuckDBPyConnection, target: int = SCHEMA_VERSION) -> None:
        current = self.version_of(con)
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {current}, newer than this quantbench ({SCHEMA_VERSION}); upgrade quantbench"
            )
        if current < target:
            con.execute("BEGIN")
            con.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMPTZ)")
            for version in range(current + 1, target + 1):
                con.execute(MIGRATIONS[version - 1])
                con.execute("INSERT INTO schema_version VALUES (?, now())", [version])
            con.execute("COMMIT")
        if target == SCHEMA_VERSION:
            con.execute(VIEWS)

    def migrate(self, target: int = SCHEMA_VERSION) -> int:
        """Bring the file to `target` (tests make old stores with a lower target). Returns the version."""
        con = duckdb.connect(str(self.path))
        try:
            self._migrate(con, target)
            return self.version_of(con)
        finally:
            con.close()

    def schema_version(self) -> int:
        if not self.path.exists():
            return 0
        with self.connect(write=False) as con:
            return self.version_of(con)

    # -- writing ---------------------------------------------------------------------------------------------
    def write_run(self, result: RunResult) -> str:
        """Insert one run and its rows in a single transaction: a run is stored whole or not at all."""
        run = dict(result.run)
        run.setdefault("run_id", str(uuid7()))
        for key in ("spec", "extra"):
            if key in run and not isinstance(run[key], str | type(None)):
                run[key] = json.dumps(run[key], default=str)
        with self.connect(write=True) as con:
            con.execute("BEGIN")
            try:
                self._insert(con, "runs", [run])
                rid = run["run_id"]
                self._insert(con, "answers", [{**a, "run_id": rid} for a in result.answers])
                self._insert(con, "latencies", [{**lat, "run_id": rid} for lat in result.latencies])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        return str(run["run_id"])

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        cols = [c[0] for c in con.execute(f"DESCRIBE {table}").fetchall()]
        unknown = set().union(*rows) - set(cols)
        if unknown:
            raise StoreError(f"{table}: unknown column(s) {sorted(unknown)}")
        df = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
        con.register("_incoming", df)
        try:
            con.execute(f"INSERT INTO {table} SELECT * FROM _incoming")
        finally:
            con.unregister("_incoming")

    # -- reading ---------------------------------------------------------------------------------------------
    def read(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        """Run a query on a read-only, short-lived connection. UUIDs come back as strings."""
        with self.connect(write=False) as con:
            df = con.execute(sql, params or []).fetchdf()
        for col in df.columns:
            if len(df) and isinstance(df[col].iloc[0], uuid.UUID):
                df[col] = df[col].astype(str)
        return df

    def runs(self) -> pd.DataFrame:
        return self.read("SELECT * FROM run_summary ORDER BY created_at")
