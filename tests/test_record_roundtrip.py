"""The declared run record: every field of every table goes into the store and comes back as it was written."""

import datetime as dt
import json
import os
import shutil
import typing
from pathlib import Path

import duckdb
import pytest
from pydantic import ValidationError

from quantbench.run.record import AnswerRow, KernelPath, LatencyRow, RunRecord, RunResult, uuid7
from quantbench.store import RecordMismatchError, Store

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 12, 2, 7, 0, tzinfo=dt.UTC)


def _distinct(model: type, skip: tuple[str, ...] = ()) -> dict[str, typing.Any]:
    """A value for every field of `model`, each different from the others and none null."""
    out: dict[str, typing.Any] = {}
    for i, (name, f) in enumerate(model.model_fields.items(), start=1):
        if name in skip:
            continue
        kinds = set(typing.get_args(f.annotation)) or {f.annotation}
        if name == "run_id":
            out[name] = str(uuid7())
        elif f.annotation == list[str]:
            out[name] = [f"{name}-a", f"{name}-b"]
        elif f.annotation == list[float]:
            out[name] = [i / 100, 1 - i / 100]
        elif dt.datetime in kinds:
            out[name] = T0 + dt.timedelta(minutes=i)
        elif bool in kinds:
            out[name] = True
        elif int in kinds:
            out[name] = 1000 + i
        elif float in kinds:
            out[name] = i + 0.25
        elif any(typing.get_origin(k) is dict for k in kinds):
            out[name] = {"field": name, "n": i}
        elif typing.get_origin(f.annotation) is typing.Literal:
            out[name] = typing.get_args(f.annotation)[-1]
        else:
            out[name] = f"{name}-value"
    return out


def _plain(value: typing.Any) -> typing.Any:
    """A value read back by pandas, as Python: lists for arrays, datetimes for timestamps."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "to_pydatetime"):
        return value.to_pydatetime()
    return value


def test_every_column_of_every_table_reads_back_as_written(tmp_path):
    run = _distinct(RunRecord)
    answers = [_distinct(AnswerRow, skip=("run_id",)) | {"record_id": f"r{j}"} for j in range(2)]
    latencies = [_distinct(LatencyRow, skip=("run_id",)) | {"seq": j} for j in range(2)]
    assert all(v is not None for row in (run, *answers, *latencies) for v in row.values())
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(RunResult(run=run, answers=answers, latencies=latencies))
    assert rid == run["run_id"]

    (back,) = store.read("SELECT * FROM runs").to_dict("records")
    assert set(back) == set(RunRecord.model_fields)
    for column, written in run.items():
        got = _plain(back[column])
        if column in ("spec", "extra"):  # JSON columns
            got = json.loads(got)
        assert got == written, column
    for table, rows in (("answers", answers), ("latencies", latencies)):
        stored = store.read(f"SELECT * FROM {table} ORDER BY 2").to_dict("records")
        assert len(stored) == len(rows)
        for got, written in zip(stored, rows, strict=True):
            assert {k: _plain(v) for k, v in got.items()} == {**written, "run_id": rid}, table


def test_an_answer_missing_a_field_is_refused_not_stored_as_null():
    # Found in review (issue #23): an answer written without its gold stored NULL and only a dashboard test saw it.
    answer = _distinct(AnswerRow, skip=("run_id", "gold"))
    with pytest.raises(ValidationError, match="gold"):
        RunResult(run=_distinct(RunRecord), answers=[answer])


def test_a_column_no_record_field_fills_is_an_error_at_write(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.write_run(RunResult(run=_distinct(RunRecord)))
    con = duckdb.connect(str(store.path))
    con.execute("ALTER TABLE answers ADD COLUMN confidence DOUBLE")
    con.close()
    answer = _distinct(AnswerRow, skip=("run_id",))
    with pytest.raises(RecordMismatchError, match=r"answers: .*column\(s\) with no field \['confidence'\]"):
        store.write_run(RunResult(run=_distinct(RunRecord), answers=[answer]))
    assert len(store.read("SELECT * FROM runs")) == 1  # nothing of the refused run was kept


@pytest.mark.parametrize("text", [
    "transformers experts=grouped_mm",
    "quantbench grouped-moe cpu-vectorised",
    "quantbench grouped-moe cpu-vectorised, float32 compute",
])
def test_a_planned_kernel_path_prints_as_the_backend_wrote_it(text):
    assert str(KernelPath.planned(text, "cpu-vectorised")) == text
    assert str(KernelPath.planned(text, "")) == text


def test_the_kernel_path_from_parts_prints_every_stored_kernel_path(tmp_path):
    copy = tmp_path / "results.duckdb"  # a copy: the committed store is never opened, even to read
    shutil.copyfile(ROOT / "results.duckdb", copy)
    texts = Store(copy).read("SELECT DISTINCT kernel_path FROM runs WHERE kernel_path IS NOT NULL ORDER BY 1")
    texts = texts.kernel_path.tolist()
    assert "quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope+qkv +cuda-graph" in texts
    for text in texts:
        base, _, rest = text.partition(" +")
        fused = graphs = None
        for suffix in filter(None, ("+" + rest).split(" +")) if rest else ():
            suffix = suffix.removeprefix("+")
            if suffix.startswith("fused "):
                fused = suffix.removeprefix("fused ")
            else:
                graphs = "partly" if suffix == "cuda-graph (partly eager)" else "all"
        head, _, experts = base.rpartition(" ")
        path = (KernelPath(base=head, experts=experts, fused=fused, graphs=graphs)
                if head == "quantbench grouped-moe" else KernelPath(base=base, fused=fused, graphs=graphs))
        assert str(path) == text


def test_the_child_builds_the_kernel_path_it_ran_from_parts():
    planned = KernelPath.planned("quantbench grouped-moe triton-fused-int4", "triton-fused-int4")
    ran = planned.model_copy(update={"experts": "dequant+grouped_mm+triton-fused-int4", "fused": "rmsnorm+rope",
                                     "graphs": "partly"})
    assert str(ran) == ("quantbench grouped-moe dequant+grouped_mm+triton-fused-int4 +fused rmsnorm+rope "
                        "+cuda-graph (partly eager)")


def test_a_tiny_run_end_to_end_stores_the_answers_the_model_gives(tmp_path, monkeypatch):
    from quantbench.run.runner import execute
    from quantbench.run.spec import RunSpec
    from tests.tiny import answers_in_process

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    suite = tmp_path / "mini.jsonl"
    suite.write_text("".join(json.dumps({
        "id": f"r{i}", "benchmark": "mini", "gold": {"q": "left"},
        "request": {"state": {"observation": f"wall {i}"},
                    "questions": {"q": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}}},
    }) + "\n" for i in range(3)))
    result = execute(RunSpec(backend="tests.tiny:TinyBackend", suite=str(suite), gpu="cpu", warmup=0,
                             latency_min_decisions=3, latency_min_seconds=0.0), echo=False)
    assert result.run.status == "ok", result.run.error
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(result)
    expected = answers_in_process(str(suite))
    stored = store.read("SELECT * FROM answers WHERE run_id = ? ORDER BY record_id", [rid]).to_dict("records")
    assert [(a["record_id"], a["question"]) for a in stored] == sorted(expected)
    for a in stored:
        want = expected[(a["record_id"], a["question"])]
        assert {k: _plain(a[k]) for k in ("benchmark", "options", "top", "gold", "method", "truncated")} == {
            k: want[k] for k in ("benchmark", "options", "top", "gold", "method", "truncated")}
        assert _plain(a["probs"]) == pytest.approx(want["probs"], abs=1e-6)
    (run,) = store.read("SELECT * FROM runs WHERE run_id = ?", [rid]).to_dict("records")
    assert {k: run[k] for k in ("status", "backend", "variant", "model_id", "kernel_path", "n_records")} == {
        "status": "ok", "backend": "tests.tiny:TinyBackend", "variant": "tiny", "model_id": "tiny-test",
        "kernel_path": "transformers grouped_mm", "n_records": 3}
    # A CPU run measures no energy: every energy column NULL (NaN through pandas), never 0, and extra says why
    for col in ("energy_j_per_decision", "energy_mean_w", "energy_phase_s", "energy_decisions", "energy_idle_w"):
        assert run[col] is None or run[col] != run[col], col
    assert json.loads(run["extra"])["energy"] == {"note": "not measured: a CPU run (NVML measures GPUs)"}
