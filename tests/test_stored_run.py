"""The typed stored-run record reads give (quantbench.store.records.StoredRun): one field per column of `runs`, read
typed, and the figures the store derives from a run's other rows; what a run did not measure is None, never 0."""

from __future__ import annotations

import datetime as dt

import pytest

from quantbench.run.record import RunRecord
from quantbench.store import queries
from quantbench.store.records import FIELD_NAMES, SUMMARY_FIELDS, StoredRun, frame
from tests.test_report import T0, Lab


def test_a_stored_run_reads_every_column_typed_with_its_latency_accuracy_and_source(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=8)
    ok = lab.run(ms=10.0, batch=1, spec={"suite": "mine.jsonl", "max_options": 6},
                 extra={"energy": {"note": "not measured: a phase under 2 s"}}, cpu_cores=2)
    failed = lab.run(status="failed", failure="oom", error="CUDA out of memory")
    columns = set(lab.store.read("SELECT * FROM runs LIMIT 0").columns)
    assert columns <= FIELD_NAMES and set(RunRecord.model_fields) <= FIELD_NAMES

    good, bad = queries.stored_runs(lab.store)
    assert (good.run_id, bad.run_id) == (ok, failed) and isinstance(good.run_id, str)
    assert good.created_at == T0 + dt.timedelta(minutes=1) and good.created_at.tzinfo is not None
    assert good.spec == {"suite": "mine.jsonl", "max_options": 6}  # JSON columns parsed
    assert good.energy_note == "not measured: a phase under 2 s"
    assert good.cpu_cores == 2 and good.energy_j_per_decision is None
    # latency: ten decisions of 10.0, 10.1, ... 10.9 ms at batch 1
    assert good.n_timed == 10 and good.batch == 1 and good.forward_batch == 1
    assert good.p50_ms == pytest.approx(10.45) and good.mean_ms == pytest.approx(10.45)
    assert good.p90_ms == pytest.approx(10.81) and good.prep_mean_ms == pytest.approx(0.5)
    assert good.decisions_per_s == pytest.approx(10 / (sum(10 + 0.1 * i for i in range(10)) / 1000))
    # accuracy: the mean over benchmarks of each one's accuracy on its gold questions (Lab: 2/3, 1 and 1 of 8)
    assert (good.n_answers, good.n_gold) == (8, 8) and good.accuracy == pytest.approx((2 / 3 + 1 + 1) / 3)
    # a store read alone: no store label on the read (quantbench.analysis.provenance fills in its own)
    assert good.source == "this store" and good.bundle_id is None
    # what a failed run never measured is None, not 0
    assert (bad.n_timed, bad.p50_ms, bad.batch, bad.decisions_per_s) == (None, None, None, None)
    assert (bad.n_answers, bad.accuracy, bad.error) == (None, None, "CUDA out of memory")
    assert bad.forward_batch == 1 and bad.peak_memory == (900 * 1_000_000, "host_rss")

    # the same figures as the store's own views (schema.VIEWS), whose expressions STORED_RUNS repeats, and
    # `runs --format json` lists the columns of run_summary
    views = lab.store.read("SELECT * FROM run_latency JOIN run_accuracy USING (run_id)").iloc[0]
    assert {k: getattr(good, k) for k in views.index if k != "run_id"} == pytest.approx(views.drop("run_id").to_dict())
    assert list(lab.store.read("SELECT * FROM run_summary LIMIT 0").columns) == list(SUMMARY_FIELDS)

    table = frame([good, bad])
    assert table["n_timed"].isna().tolist() == [False, True] and table["n_timed"][0] == 10
    assert str(table["n_timed"].dtype) == "Int64" and str(table["energy_decisions"].dtype) == "Int64"


def test_reads_by_id_by_prefix_and_by_repeat_group_give_the_same_record(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=4)
    first = lab.run(repeat_id="rep-1", repeat_index=1, repeat_count=2)
    second = lab.run(repeat_id="rep-1", repeat_index=2, repeat_count=2, ms=20.0)
    lab.run()
    [by_id] = queries.stored_runs_by_id(lab.store, [second])
    [by_prefix] = queries.runs_by_id_prefix(lab.store, second[:30])
    assert by_id == by_prefix and by_id.p50_ms == pytest.approx(20.45)
    assert [r.run_id for r in queries.repeat_runs(lab.store, "rep-1")] == [first, second]


def test_a_column_without_a_field_is_refused_with_the_file_to_change():
    row = {"run_id": "r", "status": "ok", "created_at": T0, "backend": "bf16", "gpu_watts_limit": 700}
    with pytest.raises(ValueError, match=r"\['gpu_watts_limit'\] have no field in StoredRun.*store/records.py"):
        StoredRun.from_row(row)


def test_cpu_and_gpu_memory_come_from_where_each_is_measured():
    from tests.stored import stored_run

    cpu = stored_run(device="cpu", model_tensor_bytes=5, mem_weights_bytes=7, host_rss_peak_bytes=9)
    assert cpu.is_cpu and cpu.weights_memory_bytes == 5 and cpu.peak_memory == (None, None)  # ru_maxrss: its launcher's
    own = stored_run(device="cpu", host_rss_peak_bytes=9, host_rss_peak_source="sampled")
    assert own.peak_memory == (9, "host_rss")
    gpu = stored_run(device="cuda:0", gpu_name="NVIDIA H200", mem_weights_bytes=7, mem_peak_reserved_bytes=11)
    assert not gpu.is_cpu and gpu.weights_memory_bytes == 7 and gpu.peak_memory == (11, "torch_reserved")
    nvml = stored_run(device="cuda:0", gpu_name="NVIDIA H200", mem_nvml_peak_bytes=13, mem_peak_reserved_bytes=11)
    assert nvml.peak_memory == (13, "nvml")
