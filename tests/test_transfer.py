"""Export to Parquet and merge from Parquet / other stores / folders: idempotent, schema-version aware."""

import datetime as dt

import duckdb
import pandas as pd
import pytest

from quantbench.run.record import RunResult, uuid7
from quantbench.store import SCHEMA_VERSION, Store, StoreError, transfer

T0 = dt.datetime(2026, 11, 29, 9, tzinfo=dt.UTC)


def write_runs(store, host, n=2, gpu=None, **machine):
    """n runs from one machine (`machine`: more of what it is, e.g. machine_id), each with two answers and three
    latencies; returns their ids."""
    ids = []
    for i in range(n):
        run = dict(run_id=str(uuid7()), status="ok", created_at=T0 + dt.timedelta(hours=i), backend="bf16",
                   variant="bf16", model_id="tiny-moe", suite_hash="s1", host=host, role="reference",
                   device="cuda:0" if gpu else "cpu", gpu_name=gpu, gpu_family="hopper" if gpu else "cpu",
                   torch_version="2.13.0", spec={"backend": "bf16", "experts_impl": "eager"}, gpu_requested="auto",
                   **machine)
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


def came_in(stdout: str) -> dict[str, int]:
    """The "What came in" table of `quantbench merge`: runs per machine."""
    lines = [ln for ln in stdout.split("What came in", 1)[1].splitlines() if ln.startswith("│")]
    out: dict[str, int] = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("│").split("│")]
        out[cells[0]] = out.get(cells[0], 0) + int(cells[-1])
    return out


def test_cli_merge_shows_two_machines_of_one_host_name_as_two_lines(tmp_path):
    """Two machines both called localhost (two containers of one name, two fresh VMs) were one line of "What came
    in", their runs added together: the machine's id (its GPU's UUID, its CPU) tells them apart in the label."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    src = Store(tmp_path / "lab.duckdb")
    write_runs(src, "localhost", n=2, gpu="NVIDIA H200", machine_id="3d1219c7aa55bb66", gpu_uuid="GPU-1111aaaa-0")
    write_runs(src, "localhost", n=3, gpu="NVIDIA H200", machine_id="9f00e1d2bb77cc88", gpu_uuid="GPU-2222bbbb-0")
    # no machine id (an older run, a container without /etc/machine-id): the GPU's UUID, then the CPU, tell
    write_runs(src, "box", n=1, gpu="NVIDIA H200", gpu_uuid="GPU-3333cccc-0")
    write_runs(src, "box", n=1, gpu="NVIDIA H200", gpu_uuid="GPU-4444dddd-0")
    write_runs(src, "vm", n=1, cpu_model="AMD EPYC 7B13", cpu_cores=2)
    write_runs(src, "vm", n=2, cpu_model="Intel Xeon 8480", cpu_cores=2)
    write_runs(src, "lab-h200", n=2, gpu="NVIDIA H200", machine_id="0123456789abcdef")  # alone: its short label
    merged = CliRunner().invoke(app, ["merge", str(src.path), "--db", str(tmp_path / "local.duckdb")],
                                env={"COLUMNS": "200"})
    assert merged.exit_code == 0, merged.output
    assert came_in(merged.stdout) == {
        "NVIDIA H200 (localhost, machine 3d1219c7)": 2, "NVIDIA H200 (localhost, machine 9f00e1d2)": 3,
        "NVIDIA H200 (box, GPU-3333cccc)": 1, "NVIDIA H200 (box, GPU-4444dddd)": 1,
        "CPU (vm, AMD EPYC 7B13)": 1, "CPU (vm, Intel Xeon 8480)": 2, "NVIDIA H200 (lab-h200)": 2}


def test_cli_merge_shows_a_failed_run_without_model_variant_or_host_as_dashes(tmp_path):
    """A run that failed before its model loaded (no model id, no variant) from a machine that did not say its host
    name: "What came in" read "CPU (None)", "nan", "nan"; its empty cells now read "—" as the report's do."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    src = Store(tmp_path / "a.duckdb")
    src.write_run(RunResult(run={"run_id": str(uuid7()), "status": "failed", "failure": "load_error", "error": "x",
                                 "created_at": dt.datetime.now(dt.UTC), "backend": "int4", "device": "cpu"}))
    merged = CliRunner().invoke(app, ["merge", str(src.path), "--db", str(tmp_path / "local.duckdb")],
                                env={"COLUMNS": "200"})
    assert merged.exit_code == 0, merged.output
    came_in = merged.stdout.split("What came in", 1)[1]
    assert "CPU (—)" in came_in and "│ —" in came_in and "failed" in came_in
    assert not any(w in came_in for w in ("nan", "None", "<NA>")), came_in


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


# -- load runs (`quantbench load`, schema 6) travel with the runs ------------------------------------------------
def write_load_runs(store, host, n=1, steps=3):
    """n load runs measured from `host`, each with `steps` steps (one refused with 503s); returns their ids."""
    from quantbench.store.load import LoadRunRecord, LoadStepRecord, write_load

    ids = []
    for i in range(n):
        at = T0 + dt.timedelta(hours=10 + i)
        run = LoadRunRecord(created_at=at, finished_at=at + dt.timedelta(minutes=2), endpoint="http://10.0.0.7:8000",
                            mode="closed", requests_from="quantbench-default-v1", n_distinct_requests=364,
                            server_model="synthetic-qwen3-30b-a3b", server_variant="int4",
                            server_kernel_path="quantbench grouped-moe gluon-wgmma-int4 +cuda-graph",
                            server_gpu="NVIDIA H200", server_health={"status": "ok", "kernel": {"ran": "gluon"}},
                            saturation=32.0, peak_decisions_per_s=95.1, host=host, quantbench_version="0.1.0",
                            settings={"concurrency": [1, 8, 32], "requests": 400, "seed": i})
        ids.append(write_load(store, run, [
            LoadStepRecord(step=k, concurrency=c, sent=400, ok=400 - 38 * (c == 32), duration_s=4.0 + k,
                           offered_per_s=100.0 / (k + 1), decisions_per_s=95.1 - k, p50_ms=17.6 * c, p99_ms=20.1 * c,
                           errors={"503": 38} if c == 32 else {}, mean_batch=float(c) / 2, queue_p50_ms=0.1 * k)
            for k, c in enumerate([1, 8, 32][:steps])]))
    return ids


def load_table(store, name):
    order = {"load_runs": "load_id", "load_steps": "load_id, step"}[name]
    return store.read(f"SELECT * FROM {name} ORDER BY {order}").astype(str)


def load_counts(store):
    return [len(store.read(f"SELECT * FROM {t}")) for t in ("load_runs", "load_steps")]


def test_load_runs_travel_whole_with_the_runs_and_merge_once(tmp_path):
    src = Store(tmp_path / "h200.duckdb")
    write_runs(src, "gpu-box", n=2, gpu="NVIDIA H200")
    write_load_runs(src, "client-box", n=2)
    [out] = transfer.export(src, tmp_path / "results.parquet")
    assert transfer.exported_counts(out) == (2, 4) and transfer.exported_load_counts(out) == (2, 6)

    for source in (out, src.path):  # the export, and the store itself
        dst = Store(tmp_path / f"local-{source.suffix[1:]}.duckdb")
        summary = transfer.merge(dst, [source])
        s = summary.sources[0]
        assert (s.runs_added, s.load_runs_in_source, s.load_runs_added, s.load_steps_added) == (2, 2, 2, 6)
        for name in ("runs", "answers", "latencies"):
            pd.testing.assert_frame_equal(table(dst, name), table(src, name))
        for name in ("load_runs", "load_steps"):  # every column as measured: server, generator, JSON, times
            pd.testing.assert_frame_equal(load_table(dst, name), load_table(src, name))
        again = transfer.merge(dst, [out, src.path])
        assert again.load_runs_added == 0 and [x.load_runs_present for x in again.sources] == [2, 2]
        assert load_counts(dst) == [2, 6] and counts(dst) == [2, 4, 6]


def test_a_store_with_only_load_runs_exports_and_merges(tmp_path):
    src = Store(tmp_path / "client.duckdb")
    [load_id] = write_load_runs(src, "client-box")
    [out] = transfer.export(src, tmp_path / "load.parquet")
    assert transfer.exported_counts(out) == (0, 0)
    dst = Store(tmp_path / "local.duckdb")
    write_load_runs(dst, "here")  # one of its own: kept beside the new one
    summary = transfer.merge(dst, [out])
    assert summary.runs_added == 0 and summary.load_runs_added == 1 and counts(dst) == [0, 0, 0]
    assert load_id in set(dst.read("SELECT CAST(load_id AS VARCHAR) AS id FROM load_runs").id)
    assert load_counts(dst) == [2, 6]


def test_an_export_from_before_load_runs_has_no_load_column_and_merges_into_a_store_that_has_them(tmp_path):
    con, _ = make_v1_store(tmp_path / "old.duckdb")
    transfer.copy_nested(con, tmp_path / "old.parquet", version=1)
    con.close()
    assert "load_run" not in duckdb.connect().execute(
        f"SELECT * FROM read_parquet('{tmp_path / 'old.parquet'}')").fetchdf().columns
    assert transfer.exported_load_counts(tmp_path / "old.parquet") == (0, 0)
    dst = Store(tmp_path / "local.duckdb")
    write_load_runs(dst, "here")
    summary = transfer.merge(dst, [tmp_path / "old.parquet", tmp_path / "old.duckdb"])
    assert summary.runs_added == 1 and [s.load_runs_in_source for s in summary.sources] == [0, 0]
    assert load_counts(dst) == [1, 3]  # its own load run untouched


def test_a_partial_or_foreign_source_is_refused_and_adds_nothing(tmp_path):
    src = Store(tmp_path / "a.duckdb")
    write_runs(src, "a", n=1)
    write_load_runs(src, "a")
    [out] = transfer.export(src, tmp_path / "a.parquet")
    data = out.read_bytes()
    cut = tmp_path / "cut.parquet"  # a copy that stopped part way
    cut.write_bytes(data[: len(data) // 2])
    con = duckdb.connect()
    stepless, foreign = tmp_path / "stepless.parquet", tmp_path / "foreign.parquet"
    con.execute(f"COPY (SELECT * REPLACE (CASE WHEN load_run IS NULL THEN NULL ELSE struct_update(load_run, steps := "
                f"load_run.steps[1:0]) END AS load_run) FROM read_parquet('{out}')) TO '{stepless}' "
                f"(FORMAT parquet, KV_METADATA {{quantbench_schema_version: '{SCHEMA_VERSION}'}})")
    con.execute(f"COPY (SELECT * REPLACE ('x' AS load_run) FROM read_parquet('{out}')) TO '{foreign}' "
                f"(FORMAT parquet, KV_METADATA {{quantbench_schema_version: '{SCHEMA_VERSION}'}})")
    con.close()
    half = tmp_path / "half.duckdb"  # a store with load_runs and no load_steps
    con = duckdb.connect(str(half))
    con.execute(f"ATTACH '{src.path}' AS a (READ_ONLY)")
    con.execute("CREATE TABLE schema_version AS SELECT * FROM a.schema_version")
    for name in ("runs", "answers", "latencies", "load_runs"):
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM a.{name}")
    con.close()
    dst = Store(tmp_path / "local.duckdb")
    for source, words in [(cut, "cut.parquet: not a whole Parquet file .* copy it again"),
                          (stepless, "stepless.parquet: load run\\(s\\) .* have no steps: a partial source"),
                          (foreign, "foreign.parquet: its load_run column is not a quantbench load run"),
                          (half, "half.duckdb: has load_runs but not load_steps: not a whole quantbench store")]:
        with pytest.raises(StoreError, match=words):
            transfer.merge(dst, [source])
        assert counts(dst) == [0, 0, 0] and load_counts(dst) == [0, 0], source  # the runs of the file too


def test_cli_export_and_merge_say_how_many_load_runs(tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    src = Store(tmp_path / "a.duckdb")
    write_runs(src, "lab-h200", n=1, gpu="NVIDIA H200")
    write_load_runs(src, "client-box", n=2)
    out = tmp_path / "a.parquet"
    exported = CliRunner().invoke(app, ["export", "--out", str(out), "--db", str(src.path)])
    assert exported.exit_code == 0, exported.output
    said = " ".join(exported.stdout.split())
    assert "exported 1 runs (2 answers)" in said and "and 2 load runs (6 steps)" in said
    merge = ["merge", str(out), "--db", str(tmp_path / "local.duckdb")]
    merged = CliRunner().invoke(app, merge)
    said = " ".join(merged.stdout.split())
    assert merged.exit_code == 0 and "load runs: 2 new (6 steps), 0 already here" in said
    assert "int4 on NVIDIA H200 (quantbench grouped-moe gluon-wgmma-int4 +cuda-graph), measured from client-box" in said
    again = " ".join(CliRunner().invoke(app, merge).stdout.split())
    assert "load runs: 0 new (0 steps), 2 already here" in again


def test_a_source_holding_a_run_neither_ok_nor_failed_is_refused_and_adds_nothing(tmp_path):
    """A store another tool or a crashed writer left may hold a run marked "running" (or no status): not a result
    to share. Before, merge took it in and the report counted it among the failed."""
    src = Store(tmp_path / "a.duckdb")
    odd, fine = write_runs(src, "a", n=2)
    con = duckdb.connect(str(src.path))
    con.execute("UPDATE runs SET status = 'running' WHERE CAST(run_id AS VARCHAR) = ?", [odd])
    con.close()
    dst = Store(tmp_path / "local.duckdb")
    with pytest.raises(StoreError, match=rf"{odd} \(running\) are neither ok nor failed"):
        transfer.merge(dst, [src.path])
    assert counts(dst) == [0, 0, 0]
    con = duckdb.connect(str(src.path))
    con.execute("UPDATE runs SET status = 'ok'")
    con.close()
    transfer.merge(dst, [src.path])
    assert counts(dst) == [2, 4, 6] and fine


# -- an error of the store merged into names that store, not the source ------------------------------------------
def spoil_block(path, table, column):
    """Spoil the block that holds the first data of `table.column` (its checksum no longer matches): damage the
    open-time check (quantbench.store.check: the file's length, its tables and columns) does not see, met only
    when a query reads that block."""
    con = duckdb.connect(str(path))
    con.execute("CHECKPOINT")
    block = con.execute(f"SELECT min(block_id) FROM pragma_storage_info('{table}') WHERE column_name = ? AND "
                        "block_id >= 0", [column]).fetchone()[0]
    block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek(3 * 4096 + block * block_size + 100)  # past the file's three headers, inside the block
        f.write(b"\xff" * 64)


def test_a_merge_into_a_store_damaged_past_the_open_check_names_that_store_and_the_fix(tmp_path):
    """The store merged into held a spoilt block: merge said "SOURCE: merge failed (Corrupt database file ...);
    nothing from this file was added", sending the user to fix a source that was whole."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    src, dst = Store(tmp_path / "from-lab.duckdb"), Store(tmp_path / "target.duckdb")
    write_runs(src, "lab", n=2)
    write_runs(dst, "here", n=2)
    spoil_block(dst.path, "runs", "run_id")
    with pytest.raises(StoreError) as raised:
        transfer.merge(dst, [src.path])
    said = str(raised.value)
    assert said.startswith(f"{dst.path} is damaged, the store being merged into (Corrupt database file")
    assert f"nothing from {src.path} was added (it reads whole)" in said and "restore it from a backup" in said
    assert f"{src.path}: merge failed" not in said
    done = CliRunner().invoke(app, ["merge", str(src.path), "--db", str(dst.path)])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert f"{dst.path} is damaged" in " ".join(done.stderr.split())


def test_a_write_that_fails_on_the_store_merged_into_names_that_store_not_the_source(tmp_path, monkeypatch):
    """A full disk or a folder that refuses the write-ahead log fails the INSERT or the COMMIT into the store
    (DuckDB's error need not name a file): the source reads whole, so the error is the store's, with the fix."""
    src, dst = Store(tmp_path / "from-lab.duckdb"), Store(tmp_path / "target.duckdb")
    write_runs(src, "lab", n=2)
    write_runs(dst, "here", n=1)

    def disk_full(con, table, key, new):
        raise duckdb.IOException("IO Error: Could not write to file: No space left on device")

    monkeypatch.setattr(transfer, "_insert_new", disk_full)
    with pytest.raises(StoreError) as raised:
        transfer.merge(dst, [src.path])
    said = str(raised.value)
    assert said.startswith(f"cannot merge into {dst.path}: IO Error: Could not write to file: No space left on device")
    assert f"free space on the disk of {dst.path} or fix its permissions" in said
    assert f"{src.path}: merge failed" not in said
    monkeypatch.undo()
    assert counts(dst) == [1, 2, 3]  # nothing of the source came in


def test_a_damaged_source_is_still_named_as_the_file_that_failed(tmp_path):
    src, dst = Store(tmp_path / "from-lab.duckdb"), Store(tmp_path / "target.duckdb")
    write_runs(src, "lab", n=2)
    write_runs(dst, "here", n=1)
    spoil_block(src.path, "answers", "record_id")
    with pytest.raises(StoreError, match=rf"^{src.path}: merge failed \(Corrupt database file.*nothing from this "
                                         "file was added"):
        transfer.merge(dst, [src.path])
    assert counts(dst) == [1, 2, 3]
