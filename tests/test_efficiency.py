"""Energy and cost per decision in the views: the report (markdown, csv, json), `quantbench compare`, and a store
from before the energy columns (schema 4) that reads, migrates and keeps its rows."""

import datetime as dt
import json

import duckdb
import pytest
from typer.testing import CliRunner

from quantbench import report
from quantbench.analysis import efficiency
from quantbench.cli import app
from quantbench.errors import ConfigError
from quantbench.run.record import RunResult, uuid7
from quantbench.store import SCHEMA_VERSION, Store
from tests.stored import stored_run
from tests.test_report import GPU, MB, Lab

# 6 s phase of 300 decisions at 400 W, idle 100 W: 8 J per decision, 6 above idle
ENERGY = dict(energy_j_per_decision=8.0, energy_mean_w=400.0, energy_phase_s=6.0, energy_decisions=300,
              energy_idle_w=100.0)


@pytest.fixture
def gpu_lab(tmp_path):
    """BF16 and INT4 on the H200 with energy, FP8 there without (its phase was too short), and a BF16 CPU run."""
    lab = Lab(tmp_path / "r.duckdb", n=40)
    ids = {
        "bf16": lab.run(ms=20, **GPU, mem_weights_bytes=60 * MB, **ENERGY),
        "int4": lab.run(lab.answers(noise=0.02, seed=3), ms=10, backend="int4", variant="int4", native="native",
                        **GPU, mem_weights_bytes=20 * MB, **{**ENERGY, "energy_j_per_decision": 3.5}),
        "fp8": lab.run(lab.answers(noise=0.02, seed=4), ms=12, backend="fp8", variant="fp8", native="native", **GPU,
                       mem_weights_bytes=30 * MB, energy_phase_s=1.2, energy_decisions=80,
                       extra={"energy": {"note": "not measured: the timed phase took 1.20 s, under the 2 s"}}),
        "cpu": lab.run(ms=30),
    }
    return lab, ids


def _row(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def _column(text: str, name: str, start: str) -> str:
    header = _row(text, "| Variant")
    return _row(text, start)[header.index(name)]


def test_the_report_shows_joules_per_decision_beside_latency_and_na_where_not_measured(gpu_lab):
    lab, _ = gpu_lab
    reps = report.build_report(lab.store)
    gpu_md = report.render([r for r in reps if not r.cpu], "markdown")
    header = _row(gpu_md, "| Variant")
    assert header[header.index("Latency p50 / p90 (per decision)") + 1] == "Energy per decision"
    assert "Cost per 1M decisions" not in header  # no price given: no cost column
    assert _column(gpu_md, "Energy per decision", "| bf16 ") == "8.0 J (6.0 above idle)"
    assert _column(gpu_md, "Energy per decision", "| int4 ") == "3.5 J (1.5 above idle)"
    assert _column(gpu_md, "Energy per decision", "| fp8 ") == "n/a"
    assert "NVML's total-energy counter" in gpu_md
    cpu_md = report.render([r for r in reps if r.cpu], "markdown")
    assert _column(cpu_md, "Energy per decision", "| bf16 ") == "n/a"
    assert "Energy per decision is n/a on a CPU" in cpu_md


def test_a_price_per_gpu_hour_adds_cost_per_million_decisions_on_gpu_rows_only(gpu_lab):
    lab, _ = gpu_lab
    reps = report.build_report(lab.store, price_per_gpu_hour=3.6)
    gpu_md = report.render([r for r in reps if not r.cpu], "markdown")
    # $3.60 per hour is $0.001 per second; bf16's mean model time is 20.45 ms: $20.45 per million decisions
    assert _column(gpu_md, "Cost per 1M decisions", "| bf16 ") == "$20.45"
    assert _column(gpu_md, "Cost per 1M decisions", "| int4 ") == "$10.45"
    assert _column(gpu_md, "Cost per 1M decisions", "| fp8 ") == "$12.45"  # cost needs time, not energy
    assert "Cost per 1M decisions at $3.6 per GPU hour: from the mean model time per decision at batch 1" in gpu_md
    cpu_md = report.render([r for r in reps if r.cpu], "markdown")
    assert _column(cpu_md, "Cost per 1M decisions", "| bf16 ") == "n/a"
    rows = {r["variant"]: r for r in json.loads(report.render(reps, "json"))["reports"][0]["rows"]}
    assert rows["bf16"]["cost_per_million_decisions"] == pytest.approx(20.45)
    assert rows["bf16"]["j_above_idle_per_decision"] == pytest.approx(6.0)
    assert rows["fp8"]["j_per_decision"] is None and "under the 2 s" in rows["fp8"]["energy_note"]
    csv = report.render(reps, "csv")
    assert "j_per_decision" in csv.splitlines()[0] and "cost_per_million_decisions" in csv.splitlines()[0]


def test_a_batched_run_carries_its_own_energy_and_cost_from_its_throughput(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=20)
    kw = dict(weights="synthetic", model_id="synthetic-qwen3-30b-a3b", **GPU, mem_weights_bytes=60 * MB)
    lab.run(ms=10, **kw, **ENERGY)
    lab.run(ms=40, batch=8, **kw, **{**ENERGY, "energy_j_per_decision": 2.5, "energy_decisions": 1200})
    [rep] = report.build_report(lab.store, price_per_gpu_hour=3.6)
    [t] = rep.throughput
    # 197.8 decisions/s (test_report's batched figure) at $0.001 per second: $5.06 per million
    assert t["efficiency"].cost_per_million == pytest.approx(1e6 * 0.001 / t["decisions_per_s"])
    md = report.render([rep], "markdown")
    assert "| Energy per decision | Cost per 1M decisions | Run |" in md
    assert "| bf16 | 8 | 197.8 | 40.5 | 2.5 J (2.0 above idle) | $5.06 |" in md
    data = json.loads(report.render([rep], "json"))["reports"][0]
    assert data["throughput"][0]["j_per_decision"] == 2.5 and "batch 8" in data["throughput"][0]["time_basis"]
    assert "2.5 J per decision, $5.06 per 1M decisions" in data["notes"][0]


@pytest.mark.parametrize("price", [0.0, -1.0, float("nan"), float("inf")])
def test_a_price_that_is_not_a_positive_number_is_refused_naming_the_flag(gpu_lab, price):
    lab, _ = gpu_lab
    with pytest.raises(ConfigError, match=r"--price-per-gpu-hour .*a positive number"):
        report.build_report(lab.store, price_per_gpu_hour=price)


def test_cli_report_and_compare_take_the_price(gpu_lab):
    lab, ids = gpu_lab
    db = ["--db", str(lab.store.path)]
    done = CliRunner().invoke(app, ["report", "--gpu", "hopper", "--price-per-gpu-hour", "3.6", *db])
    assert done.exit_code == 0, done.output
    assert "| Cost per 1M decisions |" in done.stdout and "$20.45" in done.stdout
    done = CliRunner().invoke(app, ["compare", ids["int4"], "--price-per-gpu-hour", "3.6", *db],
                              terminal_width=250)
    assert done.exit_code == 0, done.output
    out = " ".join(done.stdout.split())
    assert "Speed, energy and cost per decision" in out
    assert "3.5 J (1.5 above idle)" in out and "8.0 J (6.0 above idle)" in out and "$10.45" in out
    assert "400 W" in out and "100 W" in out
    done = CliRunner().invoke(app, ["compare", ids["fp8"], "--format", "json", *db])
    data = json.loads(done.stdout)
    assert data["efficiency"]["candidate"]["j_per_decision"] is None
    assert "under the 2 s" in data["efficiency"]["candidate"]["energy_note"]
    assert data["efficiency"]["reference"]["j_per_decision"] == 8.0
    assert data["efficiency"]["candidate"]["cost_per_million_decisions"] is None  # no price given
    bad = CliRunner().invoke(app, ["report", "--price-per-gpu-hour", "0", *db])
    assert bad.exit_code == 2 and "--price-per-gpu-hour 0.0: give the GPU's price per hour" in bad.stderr


def test_a_gpu_run_from_before_energy_was_measured_says_so():
    e = efficiency.of_run(stored_run(run_id="x", device="cuda:0", gpu_name="NVIDIA H200", mean_ms=10.0))
    assert e.j_per_decision is None and "before quantbench measured energy" in e.energy_note
    assert efficiency.energy_text(e) == "n/a"
    failed = efficiency.of_run(stored_run(run_id="y", status="failed", device="cuda:0", gpu_name="NVIDIA H200"))
    assert failed.energy_note == "not measured: the run failed"


def test_a_schema_4_store_reads_then_migrates_keeping_its_runs_with_null_energy(tmp_path):
    """A store as the quantbench before energy left it (schema 4, its views): the report reads it as it is (energy
    n/a), the next run migrates it to schema 5 and stores its energy beside the old run's NULLs."""
    from quantbench.store.schema import VIEWS

    path = tmp_path / "old.duckdb"
    assert Store(path).migrate(target=4) == 4
    con = duckdb.connect(str(path))
    con.execute(VIEWS)
    old = str(uuid7())
    con.execute("INSERT INTO runs (run_id, status, created_at, backend, variant, model_id, suite_id, suite_hash, "
                "device, gpu_name, gpu_family, host, weights) VALUES (?, 'ok', now(), 'bf16', 'bf16', 'm', 'builtin', "
                "'s1', 'cuda:0', 'NVIDIA H200', 'hopper', 'box', 'synthetic')", [old])
    con.execute("INSERT INTO latencies VALUES (?, 0, 'suite', 'r0', 12.0, 0.1, 9, 1)", [old])
    con.close()
    [rep] = report.build_report(Store(path))  # read only: stays at 4
    assert report.cells(rep.rows[0], rep)["Energy per decision"] == "n/a"
    assert Store(path).schema_version() == 4
    Store(path).write_run(RunResult(run=dict(
        run_id=str(uuid7()), status="ok", created_at=dt.datetime.now(dt.UTC), backend="int4", variant="int4",
        model_id="m", suite_id="builtin", suite_hash="s1", device="cuda:0", gpu_name="NVIDIA H200",
        gpu_family="hopper", host="box", weights="synthetic", **ENERGY)))
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION >= 5
    runs = store.read("SELECT CAST(run_id AS VARCHAR) AS id, energy_j_per_decision, energy_idle_w FROM runs "
                      "ORDER BY created_at")
    assert runs["id"].tolist()[0] == old and runs["energy_j_per_decision"].isna().tolist() == [True, False]
    assert runs["energy_idle_w"].tolist()[1] == 100.0
    [rep] = report.build_report(store)
    assert [report.cells(r, rep)["Energy per decision"] for r in rep.rows] == ["n/a", "8.0 J (6.0 above idle)"]


def test_cost_at_batch_1_is_from_the_mean_model_time_not_the_median(tmp_path):
    """Cost is total GPU time: a slow tail costs money even when the median does not show it."""
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(RunResult(
        run=dict(run_id=str(uuid7()), status="ok", created_at=dt.datetime.now(dt.UTC), backend="bf16", **GPU),
        latencies=[dict(seq=i, phase="suite", record_id="r0", model_ms=ms, prep_ms=0.1, tokens=9, batch=1)
                   for i, ms in enumerate([10, 10, 10, 10, 50])]))
    e = efficiency.of_stored(store, rid, price_per_gpu_hour=3.6)
    assert e.seconds_per_decision == pytest.approx(0.018) and e.cost_per_million == pytest.approx(18.0)
    assert e.time_basis == "mean model time per decision at batch 1"
