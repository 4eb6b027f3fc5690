"""`quantbench recommend` and the dashboard's constraints view: one pick per GPU under a latency target at a
concurrency (load runs first, else batched or batch-1 figures, said which), a VRAM budget, an energy budget and a
quality margin per modality; or plainly which constraint no variant meets. Over the dashboard's test store (made-up
figures, known exactly) plus one INT4 load run on the H200."""

from __future__ import annotations

import datetime as dt

import pytest

from quantbench.analysis.constraints import Constraints, answer
from quantbench.errors import ConfigError
from quantbench.store.load import LoadRunRecord, LoadStepRecord, write_load
from tests import dashboard_store as ds

# (clients, p50 ms, sent, ok): the H200 INT4 server of the test store's model and suite
STEPS = [(1, 18.0, 500, 500), (8, 110.0, 500, 500), (32, 335.0, 500, 500), (128, 1263.0, 500, 262)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = ds.build(tmp_path_factory.mktemp("constraints") / "results.duckdb")
    now = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
    run = LoadRunRecord(created_at=now, finished_at=now, endpoint="http://127.0.0.1:8000", mode="closed",
                        requests_from=ds.SUITE[0], suite_hash=ds.SUITE[1], n_distinct_requests=200,
                        server_model=ds.MODEL, server_variant="int4", server_kernel_path="grouped_int4",
                        server_gpu="NVIDIA H200", host="h200-box")
    steps = [LoadStepRecord(step=i, concurrency=c, sent=sent, ok=ok, duration_s=5.0, offered_per_s=sent / 5,
                            decisions_per_s=ok / 5, p50_ms=p50, p99_ms=p50 * 1.4,
                            errors={"503": sent - ok} if sent > ok else {})
             for i, (c, p50, sent, ok) in enumerate(STEPS)]
    write_load(s, run, steps)
    return s


def by_gpu(answers):
    return {a.report.gpu.split(" (")[0]: a for a in answers if not a.synthetic}


def cand(a, label):
    return next(k for k in a.candidates if k.label == label)


def test_a_latency_target_and_a_vram_budget_give_one_pick_per_gpu_with_its_evidence(store):
    answers = by_gpu(answer(store, Constraints(max_latency_ms=100, max_vram_gib=24)))
    h200, rtx = answers["NVIDIA H200"], answers["NVIDIA RTX PRO 6000 Blackwell"]
    assert h200.pick.label == "int4"
    assert h200.pick.latency.basis == "load" and h200.pick.latency.value == 18.0  # the load run, not batch-1 62 ms
    assert "load run" in h200.verdict and "at 1 client" in h200.verdict and "peak VRAM 20.00 GiB" in h200.verdict
    assert cand(h200, "fp8").failed == {"memory": "peak 33.40 GiB > 24 GiB"}
    assert cand(h200, "fp8").latency.basis == "batch-1"  # no load run of fp8: the batch-1 figure, said so
    assert "agreement 91.0% < 95.0%" in cand(h200, "nvfp4-packed").failed["quality"]
    # on the Blackwell card int4 loses too much agreement; nvfp4 is native there and fits
    assert rtx.pick.label == "nvfp4-packed" and "agreement 93.5%" in cand(rtx, "int4").failed["quality"]


def test_at_32_clients_the_load_run_decides_and_nothing_on_the_h200_meets_all_at_once(store):
    answers = by_gpu(answer(store, Constraints(max_latency_ms=100, concurrency=32, max_vram_gib=24)))
    h200 = answers["NVIDIA H200"]
    int4, fp8 = cand(h200, "int4"), cand(h200, "fp8")
    assert int4.failed["latency"] == "335.0 ms > 100 ms" and "load run" in int4.latency.text
    assert fp8.latency.basis == "batch-1" and "a lower bound only" in fp8.latency.text  # said which
    assert h200.pick is None and h200.unmet == []  # each constraint alone is met by someone
    assert h200.verdict.startswith("nothing qualifies: each constraint is met by some variant, but none meets them all")


def test_a_concurrency_between_steps_takes_the_next_higher_and_refusals_fail_it(store):
    at_20 = cand(by_gpu(answer(store, Constraints(max_latency_ms=500, concurrency=20)))["NVIDIA H200"], "int4")
    assert at_20.latency.value == 335.0 and "none at 20: the next higher" in at_20.latency.text
    at_100 = cand(by_gpu(answer(store, Constraints(max_latency_ms=5000, concurrency=100)))["NVIDIA H200"], "int4")
    assert at_100.latency.basis == "refused" and "238 of 500 requests refused" in at_100.failed["latency"]


def test_an_impossible_constraint_is_named_with_the_closest_variant(store):
    answers = by_gpu(answer(store, Constraints(max_vram_gib=4)))
    h200 = answers["NVIDIA H200"]
    assert h200.pick is None
    assert h200.unmet == ["peak VRAM ≤ 4 GiB: no variant; the closest, int4: peak 20.00 GiB > 4 GiB"]
    assert h200.verdict == "nothing qualifies: peak VRAM ≤ 4 GiB: no variant; the closest, int4: peak 20.00 GiB > 4 GiB."


def test_energy_budget_per_decision(store):
    h200 = by_gpu(answer(store, Constraints(max_energy_j=30)))["NVIDIA H200"]
    assert h200.pick.label == "int4" and h200.pick.energy.value == pytest.approx(450 * 0.062 * 1.05, rel=0.1)
    assert cand(h200, "nvfp4-packed").failed.get("energy", "").startswith("energy not measured")
    tight = by_gpu(answer(store, Constraints(max_energy_j=5)))
    assert tight["NVIDIA H200"].pick is None and tight["NVIDIA H200"].unmet[0].startswith("≤ 5 J per decision: no "
                                                                                          "variant; the closest, int4")
    assert tight["CPU"].pick is None and "energy not measured (a CPU run)" in tight["CPU"].unmet[0]


def test_the_quality_margin_per_modality_is_the_parity_verdict(store):
    # nvfp4-packed flips 18 of 200 answers where the H200's noise floor flips 5: beyond a 2-point margin, within 20
    tight = cand(by_gpu(answer(store, Constraints(margin=0.02, min_agreement=0.5)))["NVIDIA H200"], "nvfp4-packed")
    assert tight.failed["quality"] == "worse than the noise floor by more than the margin"
    assert "text worse (200 questions)" in tight.quality
    wide = cand(by_gpu(answer(store, Constraints(margin=0.2, min_agreement=0.5)))["NVIDIA H200"], "nvfp4-packed")
    assert "quality" not in wide.failed and "text different, within margin" in wide.quality


@pytest.mark.parametrize("kw, flag", [(dict(max_latency_ms=0), "--max-latency-ms"), (dict(concurrency=0), "--concurrency"),
                                      (dict(percentile=95), "--percentile"), (dict(margin=2), "--margin"),
                                      (dict(objective="speed"), "--objective"), (dict(max_vram_gib=-1), "--max-vram-gib")])
def test_bad_constraints_are_refused_naming_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        Constraints(**kw)


def test_the_cli_names_a_pick_per_gpu_and_says_plainly_when_nothing_qualifies(store):
    from typer.testing import CliRunner

    from quantbench.cli import app

    db = ["--db", str(store.path), "--gpu", "all"]
    ok = CliRunner().invoke(app, ["recommend", "--max-latency-ms", "100", "--max-vram-gib", "24", *db],
                            env={"COLUMNS": "300"})
    assert ok.exit_code == 0, ok.output
    blocks = {b.split("\n", 1)[0]: b for b in ok.stdout.split("## ")[1:]}
    h200 = next(b for head, b in blocks.items() if head.startswith("NVIDIA H200"))
    assert "Pick: int4: p50 18.0 ms end to end (load run" in h200 and "⭐ int4" in h200
    assert "fails memory: peak 33.40 GiB > 24 GiB" in h200
    none = CliRunner().invoke(app, ["recommend", "--max-vram-gib", "0.01", *db], env={"COLUMNS": "300"})
    assert none.exit_code == 1 and "Nothing qualifies on any GPU under these constraints." in none.stdout
    assert "nothing qualifies: peak VRAM ≤ 0.01 GiB: no variant" in none.stdout
    bad = CliRunner().invoke(app, ["recommend", "--percentile", "95", *db])
    assert bad.exit_code == 2 and "--percentile 95: use one of 50, 90, 99" in bad.output


def test_synthetic_tables_never_have_a_pick(store):
    synthetic = [a for a in answer(store, Constraints()) if a.synthetic]
    assert synthetic and all(a.pick is None for a in synthetic)
    assert all("no quality evidence" in k.failed.get("quality", "") for a in synthetic for k in a.candidates if k.row.ok)


def test_a_table_of_batched_runs_alone_has_no_candidate_and_says_why(tmp_path):
    """Its throughput judges no quality: no pick, an empty candidate list, and the report's note as the verdict."""
    from quantbench.report.constraints_text import answers_text

    store = ds.build(tmp_path / "results.duckdb")
    ds.add_batched_only(store)
    answers = answer(store, Constraints(max_latency_ms=500, concurrency=16), gpu="NVIDIA H200")
    alone = [a for a in answers if a.report.batched_only]
    assert {(a.report.model_id, a.report.suite_id) for a in alone} == {(ds.MODEL, ds.BATCHED_SUITE[0]),
                                                                      (ds.BATCHED_MODEL, ds.SUITE[0])}
    assert all(a.pick is None and a.candidates == [] and not a.synthetic for a in alone)
    assert all(a.verdict == f"nothing to pick from: {a.report.no_table_note}" for a in alone)
    text = answers_text(answers)
    assert f"· suite {ds.BATCHED_SUITE[0]}\nnothing to pick from: only batched runs (16 and 32 decisions a pass)" in text
    # the batch-1 table of the same model still picks, its latency at 16 clients from its own suite's runs only
    [table] = [a for a in answers if a.report.model_id == ds.MODEL and a.report.suite_id == ds.SUITE[0]]
    assert table.pick is not None and table.pick.latency.basis != "batched"


def test_two_tables_of_one_suite_id_on_one_gpu_are_told_apart_by_the_suite_hash(tmp_path):
    """A suite edited between runs keeps its id and gets a new hash: two tables whose headings would be the same."""
    from quantbench.report.constraints_text import answers_text
    from quantbench.run.record import RunResult

    store = ds.build(tmp_path / "results.duckdb")
    edited = ds.run_row(ds.H200, 500, suite_hash="suitehash0002", backend="int4", variant="int4",
                        kernel_path="grouped_int4", weight_format="int4-g128", native="native", role="candidate")
    store.write_run(RunResult(run=edited, answers=ds.reference_answers(), latencies=ds.latencies(60.0, seed=7)))
    text = answers_text(answer(store, Constraints(), gpu="NVIDIA H200"))
    heads = [line for line in text.splitlines() if line.startswith(f"## NVIDIA H200 (hopper) · {ds.MODEL}")]
    assert heads == [f"## NVIDIA H200 (hopper) · {ds.MODEL} · suite {ds.SUITE[0]} (hash {h})"
                     for h in (ds.SUITE[1], "suitehash0002")]
