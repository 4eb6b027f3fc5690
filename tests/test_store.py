"""The store: versioned migrations, one transaction per run, writers that wait for readers."""

import datetime as dt
import subprocess
import sys
import time

import duckdb
import pytest

from quantbench.store import RunResult, Store, StoreError, uuid7
from quantbench.store.schema import SCHEMA_VERSION


def run_row(**kw):
    return {"run_id": str(uuid7()), "status": "ok", "created_at": dt.datetime.now(dt.UTC), "backend": "bf16", **kw}


ANSWER = {"record_id": "r1", "benchmark": "nli", "question": "q", "options": ["a", "b"], "probs": [0.25, 0.75],
          "top": "b", "gold": "b", "method": "label_logit", "truncated": False}
LATENCY = {"seq": 0, "phase": "suite", "record_id": "r1", "model_ms": 2.0, "prep_ms": 0.5, "tokens": 12, "batch": 1}


def test_uuid7_is_version_7_and_time_ordered():
    a, b = uuid7(), uuid7()
    assert a.version == 7 and b.version == 7
    assert (a.int >> 80) <= (b.int >> 80)
    assert a != b


def test_a_run_is_written_with_its_rows_and_summarised(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(RunResult(run=run_row(role="reference"), answers=[ANSWER], latencies=[LATENCY]))
    summary = store.read("SELECT * FROM run_summary")
    assert summary.run_id.tolist() == [rid]
    assert summary.accuracy.iloc[0] == 1.0 and summary.p50_ms.iloc[0] == 2.0
    assert store.read("SELECT probs FROM answers").probs.iloc[0].tolist() == [0.25, 0.75]


def test_a_failing_insert_leaves_no_half_written_run(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.write_run(RunResult(run=run_row()))
    bad = dict(ANSWER, not_a_column=1)
    with pytest.raises(StoreError, match="not_a_column"):
        store.write_run(RunResult(run=run_row(), answers=[bad]))
    assert len(store.read("SELECT * FROM runs")) == 1
    assert len(store.read("SELECT * FROM answers")) == 0
    # A duplicate primary key in the answers also rolls the whole run back.
    with pytest.raises(duckdb.Error):
        store.write_run(RunResult(run=run_row(), answers=[ANSWER, ANSWER]))
    assert len(store.read("SELECT * FROM runs")) == 1


def test_an_old_store_is_migrated_in_order_and_keeps_its_rows(tmp_path):
    path = tmp_path / "old.duckdb"
    assert Store(path).migrate(target=1) == 1
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO runs (run_id, status, created_at, backend) VALUES (?, 'ok', now(), 'bf16')", [str(uuid7())])
    con.close()
    store = Store(path)
    assert store.schema_version() == 1
    store.write_run(RunResult(run=run_row(role="noise_floor", model_tensor_bytes=123)))
    assert store.schema_version() == SCHEMA_VERSION
    runs = store.read("SELECT role, model_tensor_bytes FROM runs ORDER BY created_at")
    assert runs.role.tolist() == ["candidate", "noise_floor"]  # the old row gets the new column's default
    assert store.read("SELECT version FROM schema_version ORDER BY version").version.tolist() == list(range(1, SCHEMA_VERSION + 1))


def test_a_store_newer_than_this_quantbench_is_refused(tmp_path):
    path = tmp_path / "new.duckdb"
    Store(path).migrate()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, now())", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(StoreError, match="newer than this quantbench"):
        Store(path).write_run(RunResult(run=run_row()))


def test_reading_a_missing_store_says_how_to_make_one(tmp_path):
    with pytest.raises(StoreError, match="quantbench demo"):
        Store(tmp_path / "nothing.duckdb").read("SELECT 1")


def test_writer_waits_for_a_reader_in_another_process(tmp_path):
    path = tmp_path / "r.duckdb"
    store = Store(path)
    store.write_run(RunResult(run=run_row()))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, time, sys; c = duckdb.connect(sys.argv[1], read_only=True); print('open', flush=True); "
        "time.sleep(1.5); c.close()"), str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "open"
    t0 = time.monotonic()
    store.write_run(RunResult(run=run_row()))  # blocked by the reader's lock until it closes, then succeeds
    waited = time.monotonic() - t0
    holder.wait()
    assert len(store.read("SELECT * FROM runs")) == 2
    assert waited > 0.3
