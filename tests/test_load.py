"""`quantbench load` against real servers on loopback: a closed-loop sweep and open-loop arrivals are measured and
stored whole (load_runs / load_steps, schema 6), a server that answers 503 has them counted by status with how fast
they came, a server without /healthz is measured all the same, and an endpoint where nothing answers is refused in
one line with nothing written. The saturation point, and the migration of a schema-5 store."""

from __future__ import annotations

import json
import time

import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from quantbench.analysis.load import saturation
from quantbench.cli import app as cli_app
from quantbench.engine.scoring import TransformersEngine
from quantbench.load import LoadSettings, run_load
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.server import create_app
from quantbench.store import SCHEMA_VERSION, Store
from quantbench.store.load import load_runs, load_steps, write_load
from tests.test_http_backend import ThreadServer
from tests.test_server import free_port
from tests.tiny import tiny_model, tiny_tokenizer


def tiny_loaded(forward_s: float = 0.0) -> LoadedVariant:
    model = tiny_model()
    engine = TransformersEngine(model, tiny_tokenizer())
    if forward_s:
        inner = engine.forward_many

        def slow(batch):
            time.sleep(forward_s)  # a slow model: concurrent requests queue up behind it
            return inner(batch)

        engine.forward_many = slow
    info = VariantInfo(variant="tiny", weight_format="float32", kernel_path="transformers experts=grouped_mm",
                       compute_dtype="float32", model_id="tiny-test", weights="synthetic")
    return LoadedVariant(engine, info, model)


@pytest.fixture(scope="module")
def served():
    loaded = tiny_loaded()
    with ThreadServer(create_app(lambda: loaded, max_batch=8)) as server:
        yield server


def test_a_closed_loop_sweep_is_measured_and_stored_whole(served, tmp_path):
    db = tmp_path / "r.duckdb"
    result = CliRunner().invoke(cli_app, ["load", "--endpoint", served.url, "--concurrency", "1,4", "--requests", "12",
                                          "--seconds", "30", "--warmup", "2", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "decisions/s" in result.output and "stored in" in result.output
    store = Store(db)
    assert store.schema_version() == SCHEMA_VERSION
    run = load_runs(store).iloc[0]
    assert (run["mode"], run.server_model, run.server_variant, run.requests_from) == (
        "closed", "tiny-test", "tiny", "quantbench-default-v1")
    assert run.server_kernel_path == "transformers experts=grouped_mm" and run.server_gpu == "cpu"
    steps = load_steps(store)
    assert list(steps.concurrency) == [1, 4] and list(steps.sent) == [12, 12] and list(steps.ok) == [12, 12]
    assert (steps.decisions_per_s > 0).all() and (steps.p99_ms >= steps.p50_ms).all()
    assert ((steps.client_cpu > 0) & (steps.client_cpu < 4)).all()  # the generator's own CPU share, per step
    # quantbench's server reports queue time and batch: both are read
    assert steps.queue_p50_ms.notna().all() and steps.model_p50_ms.notna().all()
    assert steps.mean_batch.iloc[0] == 1.0 and steps.mean_batch.iloc[1] >= 1.0
    assert [json.loads(e) for e in steps.errors] == [{}, {}]
    health = json.loads(store.read("SELECT server_health FROM load_runs").server_health.iloc[0])
    assert health["kernel"]["forwards"] >= 1 and health["max_batch"] == 8


def test_open_loop_arrivals_at_a_rate_are_bounded_by_requests(served):
    result = run_load(LoadSettings(endpoint=served.url, rate=[20.0], requests=10, seconds=30, warmup=0))
    (step,) = result.steps
    assert step.rate == 20.0 and step.concurrency is None and step.sent == 10 and step.ok == 10
    assert result.run.mode == "open"


def test_a_server_that_answers_503_has_them_counted_by_status(tmp_path):
    loaded = tiny_loaded(forward_s=0.3)
    with ThreadServer(create_app(lambda: loaded, max_batch=2, max_queue=2)) as server:
        result = run_load(LoadSettings(endpoint=server.url, concurrency=[8], requests=24, seconds=30, warmup=0))
    (step,) = result.steps
    assert step.sent == 24 and step.ok + step.errors["503"] == 24 and step.errors["503"] >= 8, step
    assert step.error_p50_ms is not None and step.error_p50_ms < step.p50_ms  # a 503 comes before an answer
    write_load(Store(tmp_path / "r.duckdb"), result.run, result.steps)
    stored = load_steps(Store(tmp_path / "r.duckdb"))
    assert json.loads(stored.errors.iloc[0])["503"] == step.errors["503"]


def test_a_systemone_server_without_healthz_or_headers_is_measured_all_the_same():
    other = FastAPI()

    @other.post("/v1/systemone")
    async def answer() -> dict:
        return {"model": "other", "answers": {"action": {"top": "left", "probabilities": {"left": 1.0}}}}

    with ThreadServer(other) as server:
        result = run_load(LoadSettings(endpoint=server.url, concurrency=[2], requests=6, card_example=True,
                                       warmup=0))
    (step,) = result.steps
    assert step.ok == 6 and step.queue_p50_ms is None and step.mean_batch is None and step.model_p50_ms is None
    assert result.run.server_health is None and result.run.requests_from == "card-example"


def test_an_endpoint_where_nothing_answers_is_refused_and_nothing_is_written(tmp_path):
    db = tmp_path / "r.duckdb"
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli_app, ["load", "--endpoint", url, "--requests", "4", "--db", str(db)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"--endpoint {url}: nothing answers there" in text and "nothing was measured or stored" in text
    assert not db.exists()


@pytest.mark.parametrize("args,text", [
    (["--concurrency", "1,8", "--rate", "5"], "--concurrency and --rate: give one"),
    (["--concurrency", "0"], "each step needs 1 or more clients"),
    (["--rate", "x"], "--rate 'x': give comma-separated numbers"),
    (["--endpoint", "localhost:8000"], "must start with http:// or https://"),
    (["--processes", "0"], "--processes 0: use 1 or more generator processes"),
], ids=["both_modes", "zero_clients", "not_numbers", "no_scheme", "no_processes"])
def test_bad_settings_are_refused_naming_the_flag(args, text, tmp_path):
    base = ["load", "--endpoint", "http://127.0.0.1:9", "--db", str(tmp_path / "r.duckdb")]
    result = CliRunner().invoke(cli_app, base + args)
    assert result.exit_code == 2, result.output
    assert text in " ".join(result.output.split())


# -- the saturation point ------------------------------------------------------------------------------------------
def test_saturation_is_the_first_load_within_tolerance_of_the_peak_when_a_larger_load_followed():
    # the INT4 row: throughput peaks at 32 clients and falls to 70% of it at 128
    sat = saturation([1, 8, 32, 128], [56.3, 71.6, 95.1, 66.1])
    assert sat.point == 32 and sat.peak == 95.1 and sat.beyond == 128 and sat.kept == pytest.approx(66.1 / 95.1)
    assert saturation([1, 8, 32, 128], [56.0, 71.0, 95.0, 96.0]).point == 32  # +1% past 32 is not a rise
    assert saturation([1, 8, 32], [10.0, 40.0, 80.0]).point is None  # still rising: not reached
    assert saturation([], []).point is None


# -- the store -----------------------------------------------------------------------------------------------------
def test_a_schema_5_store_migrates_to_the_current_schema_keeping_its_rows(tmp_path):
    path = tmp_path / "old.duckdb"
    Store(path).migrate(5)
    assert Store(path).schema_version() == 5
    assert Store(path).migrate() == SCHEMA_VERSION
    assert load_runs(Store(path)).empty and load_steps(Store(path)).empty

