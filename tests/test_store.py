"""The store: versioned migrations, one transaction per run, writers that wait for readers."""

import datetime as dt
import subprocess
import sys
import time

import duckdb
import pytest
from pydantic import ValidationError

from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store, StoreError
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
    with pytest.raises(ValidationError, match="not_a_column"):  # refused as the run's rows are made
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


# -- a store that cannot take a run: refused before it starts; a run it cannot take at the end is kept aside -----
@pytest.fixture
def small_disk(tmp_path):
    """A real small filesystem (tmpfs) to fill up; needs root, as CI has. Yields a factory: size in MiB -> folder."""
    mounted = []

    def mount(mib: int):
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): needs root")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _cli_run(tmp_path, db, backend="tests.tiny:TinyBackend", env=None):
    """`quantbench run` in a real process (the run's child needs the tests importable), one record."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    suite = tmp_path / "one.jsonl"
    suite.write_text('{"id": "r0", "benchmark": "mini", "request": {"state": {"observation": "wall"}, '
                     '"questions": {"q": {"type": "boolean"}}}}\n')
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "quantbench", "run", "--backend", backend, "--suite", str(suite),
                           "--gpu", "cpu", "--warmup", "0", "--latency-min-decisions", "1", "--latency-min-seconds",
                           "0", "--db", str(db)], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root), **(env or {})})
    return done, time.monotonic() - t0


@pytest.mark.parametrize("case", ["full disk", "not a store", "no folder"])
def test_a_store_that_cannot_take_a_run_is_refused_before_it_starts(tmp_path, small_disk, case):
    if case == "full disk":
        db = small_disk(2) / "r.duckdb"  # 2 MiB: less than a run needs
        words = f"--db {db}: only 2.0 MiB free on its disk; quantbench wants 16 MiB free before a run"
    elif case == "not a store":
        db = tmp_path / "r.duckdb"
        db.write_text("not a DuckDB file\n" * 100)
        words = "not a DuckDB store (the store chosen by --db"
    else:
        db = tmp_path / "missing" / "r.duckdb"
        words = f"--db {db}: the folder {db.parent} does not exist; create it or give another --db"
    done, seconds = _cli_run(tmp_path, db, "bf16")  # an installed backend: tests.tiny imports torch for its model
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and words in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""  # no child ran: no progress, no runs table
    assert seconds < 10  # the CLI's imports only, no torch or pandas (tests/test_cli_startup.py): median 5.8-6.8 s, at most 9.0 s at load 8-14 on 2 cores, main 33-36 s (docs/BENCHMARKS.md); a child would also train, quantize or answer


def test_a_run_the_full_disk_cannot_take_is_kept_whole_for_merge(tmp_path, small_disk, monkeypatch):
    disk = small_disk(24)  # passes the check (16 MiB); the run then fills it
    db = disk / "r.duckdb"
    cache = tmp_path / "cache"
    done, _ = _cli_run(tmp_path, db, "tests.tiny:DiskFillingBackend",
                       env={"QUANTBENCH_TEST_FILL": str(disk / "filler"), "QUANTBENCH_CACHE": str(cache)})
    assert done.returncode == 2, done.stderr
    kept = list((cache / "unsaved").glob("quantbench-unsaved-*.parquet"))
    assert len(kept) == 1  # its own folder is full: kept in the cache
    message = " ".join(done.stderr.split())
    assert f"the run is kept whole in {kept[0]} (not in {disk}: " in message  # where it went, and where not
    assert f"once the store can be written, `quantbench merge {kept[0]} --db {db}` adds it" in message
    assert "No space left on device" in message
    (disk / "filler").unlink()
    from quantbench.store.transfer import merge

    assert merge(Store(db), [kept[0]]).runs_added == 1
    stored = Store(db).read("SELECT r.status, r.variant, count(a.question) AS answers FROM runs r "
                            "JOIN answers a USING (run_id) GROUP BY ALL")
    assert stored.values.tolist() == [["ok", "tiny", 1]]
