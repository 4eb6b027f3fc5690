"""Issue #33, items 6, 7 and 9's last: a failing writer never deletes another's store, the side-file fallback goes
on to the next folder when one is read-only and always says where the run went, and a stop signal during the
final write says what happened. Real processes, real DuckDB, real small filesystems (tmpfs; skipped where
mounting is not allowed)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store, StoreError, keep_unsaved
from tests.test_store import ANSWER, small_disk  # noqa: F401 - small_disk is a fixture

ROOT = Path(__file__).resolve().parent.parent

# A writer of one run of `n` answers to `db`, in its own process. With a gate file, its first DuckDB connection
# waits until the gate exists: the test decides when it goes on (a neutral point, before it has written a byte).
WRITER = """
import datetime as dt, os, sys, time
import duckdb
from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store

db, n, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if gate != "-":
    connect = duckdb.connect
    def waiting(*a, **k):
        print("waiting", flush=True)
        while not os.path.exists(gate):
            time.sleep(0.01)
        return connect(*a, **k)
    duckdb.connect = waiting
run = {"run_id": str(uuid7()), "status": "ok", "created_at": dt.datetime.now(dt.UTC), "backend": "bf16"}
answers = [{"record_id": f"r{i}", "benchmark": "nli", "question": "q", "options": ["a", "b"], "probs": [0.25, 0.75],
            "top": "b", "gold": "b", "method": "label_logit", "truncated": False} for i in range(n)]
try:
    print("OK", Store(db).write_run(RunResult(run=run, answers=answers)), flush=True)
except Exception as e:
    print("ERR", e, flush=True)
"""


def writer(db: Path, n: int, gate: Path | None, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QUANTBENCH_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(n), str(gate or "-")], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_writer_failing_on_a_full_disk_never_deletes_the_store_another_writer_committed(tmp_path, small_disk):  # noqa: F811
    """Two runs write to a new --db on a nearly full disk: A commits; B, which began before the store existed,
    fails with ENOSPC. A's run stays; B's is kept whole in a side file elsewhere, and B says where."""
    disk, cache = small_disk(8), tmp_path / "cache"
    db, gate = disk / "r.duckdb", tmp_path / "gate"
    b = writer(db, 20_000, gate, cache)  # begins first, and waits at its first connection
    assert b.stdout.readline().strip() == "waiting"
    assert not db.exists()
    a = writer(db, 20_000, None, cache)
    a_out = a.communicate(timeout=120)[0]
    assert a.returncode == 0 and a_out.startswith("OK"), a_out
    a_run = a_out.split()[1]
    with open(disk / "filler", "wb") as fh:  # the disk fills up before B goes on
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError:
            pass
    gate.touch()
    b_out = b.communicate(timeout=120)[0].replace("waiting\n", "")
    assert b_out.startswith("ERR") and "No space left on device" in b_out, b_out
    kept = list((cache / "unsaved").glob("quantbench-unsaved-*.parquet"))
    assert len(kept) == 1 and f"the run is kept whole in {kept[0]}" in b_out
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "r.duckdb"]  # B left nothing of its own behind
    (disk / "filler").unlink()
    assert Store(db).read("SELECT run_id FROM runs").run_id.tolist() == [a_run]


def test_two_writers_of_a_new_store_both_land_in_it(tmp_path):
    """The new store is linked into place by whichever writer finishes first; the other joins it."""
    db, cache = tmp_path / "r.duckdb", tmp_path / "cache"
    writers = [writer(db, 2_000, None, cache) for _ in range(3)]
    outs = [w.communicate(timeout=120)[0] for w in writers]
    assert all(o.startswith("OK") for o in outs), outs
    assert sorted(Store(db).read("SELECT run_id FROM runs").run_id) == sorted(o.split()[1] for o in outs)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.duckdb")] == []  # no private file left


@pytest.fixture
def read_only(tmp_path):
    """A read-only filesystem (tmpfs mounted ro: root ignores a folder's mode bits): a factory of folders."""
    made = []

    def mount() -> Path:
        folder = tmp_path / f"ro{len(made)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here ({done.stderr.strip()}): needs root")
        made.append(folder)
        return folder

    yield mount
    for folder in made:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def result() -> RunResult:
    run = {"run_id": str(uuid7()), "status": "ok", "created_at": dt.datetime.now(dt.UTC), "backend": "bf16"}
    return RunResult(run=run, answers=[ANSWER])


def test_the_side_file_goes_to_the_next_folder_when_one_is_read_only_and_says_where(tmp_path, read_only, monkeypatch):
    store_folder, cache = read_only(), read_only()  # the store's folder and the cache: both read-only
    monkeypatch.setenv("QUANTBENCH_CACHE", str(cache))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run = result()
    with pytest.raises(StoreError) as info:
        Store(store_folder / "r.duckdb").write_run(run)
    message = str(info.value)
    kept = tmp_path / "tmp" / f"quantbench-unsaved-{run.run_id}.parquet"
    assert kept.exists() and f"the run is kept whole in {kept}" in message
    assert f"not in {store_folder}: " in message and f"{cache / 'unsaved'}: " in message  # where it could not go
    assert message.count("Read-only file system") >= 2
    from quantbench.store.transfer import merge

    assert merge(Store(tmp_path / "elsewhere.duckdb"), [kept]).runs_added == 1


def test_a_run_nothing_can_hold_says_it_is_lost_and_why(read_only, monkeypatch):
    only = read_only()
    monkeypatch.setattr("quantbench.store.unsaved_folders", lambda: [only / "cache"])
    kept, tried = keep_unsaved(result(), [only])
    assert kept is None and len(tried) == 2 and all("Read-only file system" in t for t in tried)
    with pytest.raises(StoreError, match="nor keep it in a side file anywhere .*: the run is lost"):
        Store(only / "r.duckdb").write_run(result())


# What `quantbench run` does once its run has finished (quantbench.cli.run._execute_and_store: the stop signals
# handled, the final write), with the run itself already done (execute returns a finished run at once) and the
# store write slowed inside its transaction (announcing itself), so that a signal can be sent during it.
SLOW_WRITE = """
import datetime as dt, os, sys, time
from pathlib import Path
import typer
import quantbench.run.runner as runner
import quantbench.store as store
from quantbench.cli.run import _execute_and_store
from quantbench.run.record import RunResult, uuid7

def finished(spec, repeat=None):
    return RunResult(run={"run_id": str(uuid7()), "status": "ok", "created_at": dt.datetime.now(dt.UTC),
                          "backend": "bf16"})
runner.execute = finished
real = store.Store._insert
def slow(con, table, rows, record=None):
    if table == "runs":  # inside the run's transaction
        Path(os.environ["QB_TEST_WRITING"]).touch()
        time.sleep(1.5)
    return real(con, table, rows, record)
store.Store._insert = staticmethod(slow)
try:
    _execute_and_store(None, Path(sys.argv[1]))
except typer.Exit as e:
    sys.exit(e.exit_code)
"""


@pytest.mark.parametrize("signals", [1, 2])
def test_a_stop_signal_during_the_final_write_says_what_happened(tmp_path, signals):
    db, writing = tmp_path / "r.duckdb", tmp_path / "writing"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QB_TEST_WRITING": str(writing),
           "QUANTBENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WRITE, str(db)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not writing.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    for _ in range(signals):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    _, err = proc.communicate(timeout=60)
    err = " ".join(err.split())
    assert proc.returncode == 143, err
    if signals == 1:  # the write finishes, and the message says the run is stored whole
        runs = Store(db).read("SELECT run_id, status FROM runs")
        assert runs.status.tolist() == ["ok"]
        assert (f"stopped by SIGTERM: run {runs.run_id.iloc[0]} stored in {db} whole (ok): the signal came as it "
                "was being written, after the run had finished") in err
    else:  # a second signal interrupts it: the run is kept aside, and the message names the signal
        kept = list((tmp_path / "cache" / "unsaved").glob("*.parquet")) + list(tmp_path.glob("quantbench-unsaved-*"))
        assert len(kept) == 1 and "stopped by SIGTERM while writing" in err and str(kept[0]) in err, err
        assert "(143)" not in err


def test_a_file_that_is_not_duckdb_given_as_the_store_is_named_with_the_fix(tmp_path):
    """Was `cannot open X: IO Error: The file "X" exists, but it is not a valid DuckDB database file!`: it named
    neither the setting that chose the file nor what to do."""
    from quantbench.store import Store, StoreUnavailableError

    junk = tmp_path / "notes.duckdb"
    junk.write_bytes(b"these are notes, not a database\n" * 200)
    with pytest.raises(StoreUnavailableError, match=r"not a DuckDB store \(the store chosen by --db.*give another file"):
        with Store(junk).connect(write=True):
            pass
    assert junk.read_bytes().startswith(b"these are notes")  # left as it was


def test_a_store_on_a_read_only_disk_names_the_setting_and_the_fix(tmp_path, monkeypatch):
    import duckdb

    from quantbench.store import Store, StoreUnavailableError

    def refused(*_a, **_k):
        raise duckdb.IOException('IO Error: Cannot open file "/mnt/ro/r.duckdb": Read-only file system')

    monkeypatch.setattr(duckdb, "connect", refused)
    with pytest.raises(StoreUnavailableError, match=r"for writing \(the store chosen by --db.*Read-only file "
                                                    r"system; give a file on a disk"):
        with Store(tmp_path / "r.duckdb").connect(write=True):
            pass
