"""Export to Parquet and merge from Parquet / other stores / folders: idempotent, schema-version aware."""

import datetime as dt

import duckdb
import pandas as pd
import pytest

from quantbench.run.record import RunResult, uuid7
from quantbench.store import SCHEMA_VERSION, Store, StoreError, transfer

T0 = dt.datetime(2026, 11, 29, 9, tzinfo=dt.UTC)


def write_runs(store, host, n=2, gpu=None):
    """n runs from one machine, each with two answers and three latencies; returns their ids."""
    ids = []
    for i in range(n):
        run = dict(run_id=str(uuid7()), status="ok", created_at=T0 + dt.timedelta(hours=i), backend="bf16",
                   variant="bf16", model_id="tiny-moe", suite_hash="s1", host=host, role="reference",
                   device="cuda:0" if gpu else "cpu", gpu_name=gpu, gpu_family="hopper" if gpu else "cpu",
                   torch_version="2.13.0", spec={"backend": "bf16", "experts_impl": "eager"}, gpu_requested="auto")
        answers = [dict(record_id=f"r{j}", benchmark="nli", question="q", options=["a", "b"], probs=[0.2, 0.8],
                        top="b", gold="b" if j else None, method="label_logit", truncated=False) for j in range(2)]
        lats = [dict(seq=k, phase="suite", record_id="r0", model_ms=1.5 + k, prep_ms=0.1, tokens=9, batch=1)
                for k in range(3)]
        ids.append(store.write_run(RunResult(run, answers, lats)))
    return ids


def table(store, name):
    order = {"runs": "run_id", "answers": "run_id, record_id", "latencies": "run_id, seq"}[name]
    df = store.read(f"SELECT * FROM {name} ORDER BY {order}")
    return df.astype(str)  # lists and JSON compare as text


def counts(store):
    return [len(store.read(f"SELECT * FROM {t}")) for t in ("runs", "answers", "latencies")]


def test_export_then_merge_reproduces_every_row_and_keeps_identity(tmp_path):
    src = Store(tmp_path / "h200.duckdb")
    write_runs(src, "gpu-box", gpu="NVIDIA H200")
    [out] = transfer.export(src, tmp_path / "results.parquet")
    assert out == tmp_path / "results.parquet" and out.exists()
    assert not list(tmp_path.glob("*.partial"))
    meta = duckdb.connect().execute("SELECT value FROM parquet_kv_metadata(?)", [str(out)]).fetchall()
    assert meta == [(str(SCHEMA_VERSION).encode(),)]

    dst = Store(tmp_path / "local.duckdb")
    summary = transfer.merge(dst, [out])
    assert (summary.runs_added, summary.sources[0].answers_added, summary.sources[0].latencies_added) == (2, 4, 6)
    for name in ("runs", "answers", "latencies"):
        pd.testing.assert_frame_equal(table(dst, name), table(src, name))
    assert set(summary.added["host"]) == {"gpu-box"} and set(summary.added["gpu_name"]) == {"NVIDIA H200"}


def test_merging_twice_adds_nothing(tmp_path):
    src = Store(tmp_path / "a.duckdb")
    write_runs(src, "a")
    [out] = transfer.export(src, tmp_path / "a.parquet")
    dst = Store(tmp_path / "local.duckdb")
    transfer.merge(dst, [out])
    again = transfer.merge(dst, [out, src.path])
    assert again.runs_added == 0 and again.runs_present == 4
    assert counts(dst) == [2, 4, 6]


def test_a_folder_merges_every_export_and_store_in_it(tmp_path):
    share = tmp_path / "share"
    (share / "bob").mkdir(parents=True)
    alice, bob = Store(share / "alice.duckdb"), Store(tmp_path / "bob.duckdb")
    write_runs(alice, "alice", n=1)
    write_runs(bob, "bob", n=3, gpu="NVIDIA H200")
    transfer.export(bob, share / "bob")  # a folder: the file is named after host and time
    assert len(list((share / "bob").glob("quantbench-*.parquet"))) == 1
    dst = Store(tmp_path / "local.duckdb")
    summary = transfer.merge(dst, [share])
    assert sorted(s.kind for s in summary.sources) == ["duckdb", "parquet"]
    assert summary.runs_added == 4
    assert sorted(dst.read("SELECT host FROM runs").host) == ["alice", "bob", "bob", "bob"]


def test_the_store_itself_is_not_merged_into_itself(tmp_path):
    dst = Store(tmp_path / "local.duckdb")
    write_runs(dst, "here", n=1)
    with pytest.raises(StoreError, match="the store being merged into"):
        transfer.merge(dst, [dst.path])
    summary = transfer.merge(dst, [tmp_path])  # a folder holding the store: skipped, said so
    assert summary.runs_added == 0 and "the store itself" in summary.skipped[0]


def make_v1_store(path):
    """A store at schema version 1 (no role, no gpu_requested), written as an old quantbench would."""
    Store(path).migrate(target=1)
    rid = str(uuid7())
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO runs (run_id, status, created_at, backend, variant, host, model_id, suite_hash) "
                "VALUES (?, 'ok', ?, 'bf16', 'bf16', 'old-box', 'tiny-moe', 's1')", [rid, T0])
    con.execute("INSERT INTO answers VALUES (?, 'r0', 'nli', 'q', ['a', 'b'], [0.4, 0.6], 'b', 'b', 'label_logit', "
                "false)", [rid])
    con.execute("INSERT INTO latencies VALUES (?, 0, 'suite', 'r0', 2.0, 0.1, 9, 1)", [rid])
    return con, rid


def test_a_schema_version_1_store_and_export_merge_with_defaults(tmp_path):
    con, rid = make_v1_store(tmp_path / "old.duckdb")
    transfer.copy_nested(con, tmp_path / "old.parquet", version=1)  # what an old export looks like
    con.close()
    for source in ("old.duckdb", "old.parquet"):
        dst = Store(tmp_path / f"from-{source}.duckdb")
        summary = transfer.merge(dst, [tmp_path / source])
        assert summary.sources[0].schema_version == 1 and summary.runs_added == 1
        run = dst.read("SELECT run_id, role, gpu_requested, host FROM runs").iloc[0]
        assert (run.run_id, run.role, run.host) == (rid, "candidate", "old-box")
        assert run.gpu_requested is None or pd.isna(run.gpu_requested)
        assert counts(dst) == [1, 1, 1]
    assert Store(tmp_path / "old.duckdb").schema_version() == 1  # the source is only read


def test_a_newer_schema_is_refused_and_nothing_is_added(tmp_path):
    src = Store(tmp_path / "a.duckdb")
    write_runs(src, "a", n=1)
    con = duckdb.connect(str(src.path))
    transfer.copy_nested(con, tmp_path / "future.parquet", version=SCHEMA_VERSION + 1)
    con.close()
    dst = Store(tmp_path / "local.duckdb")
    with pytest.raises(StoreError, match="newer than this quantbench"):
        transfer.merge(dst, [tmp_path / "future.parquet"])
    assert counts(dst) == [0, 0, 0]


def test_files_that_are_not_quantbench_results_are_refused_with_the_fix(tmp_path):
    con = duckdb.connect()
    con.execute(f"COPY (SELECT 1 AS x) TO '{tmp_path / 'other.parquet'}' (FORMAT parquet)")
    con.close()
    (tmp_path / "notes.txt").write_text("hi")
    dst = Store(tmp_path / "local.duckdb")
    with pytest.raises(StoreError, match="not a quantbench export.*quantbench export"):
        transfer.merge(dst, [tmp_path / "other.parquet"])
    with pytest.raises(StoreError, match="unknown kind of file"):
        transfer.merge(dst, [tmp_path / "notes.txt"])
    with pytest.raises(StoreError, match="no such file"):
        transfer.merge(dst, [tmp_path / "missing.parquet"])
    with pytest.raises(StoreError, match="give a .parquet file"):
        transfer.export(dst, tmp_path / "results.csv")


def test_cli_merge_says_what_came_in(tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    src = Store(tmp_path / "a.duckdb")
    write_runs(src, "lab-h200", n=2, gpu="NVIDIA H200")
    exported = CliRunner().invoke(app, ["export", "--out", str(tmp_path / "a.parquet"), "--db", str(src.path)])
    assert exported.exit_code == 0 and "exported 2 runs (4 answers)" in exported.stdout
    assert transfer.exported_counts(tmp_path / "a.parquet") == (2, 4)
    merge = ["merge", str(tmp_path / "a.parquet"), "--db", str(tmp_path / "local.duckdb")]
    merged = CliRunner().invoke(app, merge)
    assert merged.exit_code == 0 and "What came in" in merged.stdout and "NVIDIA H200 (lab-h200)" in merged.stdout
    again = CliRunner().invoke(app, merge)
    assert again.exit_code == 0 and "nothing new" in again.stdout


def test_a_merge_that_fails_part_way_says_what_it_added_and_exits_2(tmp_path):
    """Each source commits on its own: when a later one fails, the runs already merged are listed, not hidden."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    src = Store(tmp_path / "a.duckdb")
    ids = write_runs(src, "lab-h200", n=2, gpu="NVIDIA H200")
    transfer.export(src, tmp_path / "a.parquet")
    con = duckdb.connect()
    con.execute(f"COPY (SELECT 1 AS x) TO '{tmp_path / 'other.parquet'}' (FORMAT parquet)")
    con.close()
    local = tmp_path / "local.duckdb"
    done = CliRunner().invoke(app, ["merge", str(tmp_path / "a.parquet"), str(tmp_path / "other.parquet"),
                                    "--db", str(local)])
    assert done.exit_code == 2
    assert "What came in" in done.stdout and "NVIDIA H200 (lab-h200)" in done.stdout
    said = " ".join(done.stderr.split())
    assert "other.parquet: not a quantbench export" in said
    assert "Merged before it: 2 new run(s) from 1 source(s)" in said and "merge again" in said
    assert sorted(Store(local).read("SELECT CAST(run_id AS VARCHAR) AS id FROM runs").id) == sorted(ids)
