"""Load runs in the store: the records of `load_runs` and `load_steps` (one field per column, checked on insert as
the runs' are), writing one load run whole in one transaction, and reading them back for the report and the
dashboard. quantbench.load measures; this module only stores."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from typing import Any

import duckdb
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from quantbench.run.record import uuid7
from quantbench.store import Store


class LoadStepRecord(BaseModel):
    """One step of a load run: a concurrency (closed loop) or an arrival rate (open loop)."""

    model_config = ConfigDict(extra="forbid")

    load_id: str | uuid.UUID | None = None  # filled by write_load
    step: int
    concurrency: int | None = None
    rate: float | None = None
    sent: int
    ok: int
    errors: dict[str, int] = Field(default_factory=dict)
    duration_s: float
    offered_per_s: float
    decisions_per_s: float
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    error_p50_ms: float | None = None
    queue_p50_ms: float | None = None
    queue_p99_ms: float | None = None
    model_p50_ms: float | None = None
    overhead_p50_ms: float | None = None
    mean_batch: float | None = None
    client_cpu: float | None = None


class LoadRunRecord(BaseModel):
    """One row of `load_runs`."""

    model_config = ConfigDict(extra="forbid")

    load_id: str | uuid.UUID = Field(default_factory=lambda: str(uuid7()))
    created_at: dt.datetime | str
    finished_at: dt.datetime | str
    endpoint: str
    mode: str
    requests_from: str
    suite_hash: str | None = None
    n_distinct_requests: int
    server_model: str | None = None
    server_variant: str | None = None
    server_kernel_path: str | None = None
    server_gpu: str | None = None
    server_health: dict[str, Any] | None = None
    saturation: float | None = None
    peak_decisions_per_s: float | None = None
    host: str
    cpu_model: str | None = None
    os: str | None = None
    python_version: str | None = None
    quantbench_version: str | None = None
    quantbench_git_rev: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)


JSON_COLUMNS = {"load_runs": ("server_health", "settings"), "load_steps": ("errors",)}


def _row(record: BaseModel, table: str) -> dict[str, Any]:
    row = record.model_dump()
    for key in JSON_COLUMNS[table]:
        if row[key] is not None:
            row[key] = json.dumps(row[key], default=str)
    return row


def write_load(store: Store, run: LoadRunRecord, steps: list[LoadStepRecord]) -> str:
    """Insert a load run and its steps in one transaction: stored whole or not at all. Returns its id."""
    if not steps:
        raise ValueError("a load run without steps is not stored")
    load_id = str(run.load_id)
    rows = [_row(s.model_copy(update={"load_id": load_id}), "load_steps") for s in steps]
    with store.connect(write=True) as con:
        con.execute("BEGIN")
        try:
            Store._insert(con, "load_runs", [_row(run, "load_runs")], LoadRunRecord)
            Store._insert(con, "load_steps", rows, LoadStepRecord)
            con.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):  # an aborted transaction refuses ROLLBACK: keep the cause
                con.execute("ROLLBACK")
            raise
    return load_id


def load_runs(store: Store) -> pd.DataFrame:
    """Every load run, newest first (without the /healthz body; its max_batch, the server's batch bound)."""
    return store.read(
        "SELECT load_id, created_at, endpoint, mode, requests_from, server_model, server_variant, server_kernel_path, "
        "server_gpu, saturation, peak_decisions_per_s, host, quantbench_version, "
        "TRY_CAST(json_extract_string(server_health, '$.max_batch') AS INTEGER) AS server_max_batch FROM load_runs "
        "ORDER BY created_at DESC")


def load_steps(store: Store, load_ids: list[str] | None = None) -> pd.DataFrame:
    """The steps of the given load runs (all when None), in step order, with their run's server and mode."""
    where, params = "", []
    if load_ids is not None:
        if not load_ids:
            return store.read("SELECT * FROM load_steps WHERE false")
        where = f"WHERE s.load_id IN ({', '.join('?' * len(load_ids))})"
        params = list(load_ids)
    return store.read(
        "SELECT s.*, r.mode, r.endpoint, r.server_model, r.server_variant, r.server_kernel_path, r.server_gpu, "
        f"r.created_at FROM load_steps s JOIN load_runs r USING (load_id) {where} ORDER BY r.created_at, s.step",
        params)


def step_records(steps: pd.DataFrame) -> list[LoadStepRecord]:
    """`load_steps` rows (as load_steps() reads them) back as the records they were stored from."""
    fields = LoadStepRecord.model_fields
    records = []
    for row in steps.to_dict("records"):
        row = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items() if k in fields}  # NaN: NULL
        row["errors"] = json.loads(row["errors"]) if isinstance(row["errors"], str) else row["errors"] or {}
        records.append(LoadStepRecord.model_validate({**row, "load_id": str(row["load_id"])}))
    return records


def has_load_tables(store: Store) -> bool:
    """Whether the store has the load tables (an older store, not yet migrated, does not)."""
    df = store.read("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'load_runs'")
    return bool(df["n"].iloc[0])
