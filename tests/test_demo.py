"""`quantbench demo` tells the truth: its report covers its own runs, and a variant that failed shows as failed,
with its reason, and makes the exit code non-zero."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

import quantbench.cli as cli
import quantbench.cli.run as cli_run
import quantbench.make.fixture
from quantbench.run.record import RunResult
from quantbench.store import Store
from tests import dashboard_store as ds

HERE = {**ds.CPU, "host": socket.gethostname()}
MODEL = "quantbench-fixture-moe-test"


def ok_run(backend: str, variant: str, role: str, flips: int, minutes: int) -> RunResult:
    ref = ds.reference_answers()
    answers = ref if flips == 0 else ds.candidate_answers(ref, flips, seed=minutes)
    kernel = "grouped_mm float32" if role == "noise_floor" else "grouped_mm"
    run = ds.run_row(HERE, minutes, model_id=MODEL, backend=backend, variant=variant, kernel_path=kernel,
                     weight_format=variant, native="native", role=role, model_tensor_bytes=4 << 20,
                     host_rss_peak_bytes=900 << 20)
    return RunResult(run=run, answers=answers, latencies=ds.latencies(9.0, seed=minutes))


@pytest.fixture
def demo_store(tmp_path, monkeypatch):
    """A store that already holds a successful int4 run from an earlier day, and a demo whose int4 run fails now
    (the runs are written as the runner would, without spawning children)."""
    store = Store(tmp_path / "results.duckdb")
    old_int4 = store.write_run(ok_run("int4", "int4", "candidate", 40, minutes=0))
    made = iter(range(10_000, 20_000, 10))

    def execute_and_store(spec, db):
        minutes = next(made)
        if spec.backend == "int4":  # dies before loading: no model id, as a real load failure
            result = RunResult(run=ds.run_row(HERE, minutes, status="failed", failure="load_error", backend="int4",
                                              model_id=None, variant=None, role="candidate", n_records=None,
                                              error="LoadError: w4g128/model.safetensors: missing key qweight\n\nTrace"))
        elif spec.backend == "bf16":
            result = ok_run("bf16", "bf16", spec.role, 0 if spec.role == "reference" else 1, minutes)
        else:
            result = ok_run(spec.backend, f"{spec.backend}-{spec.options.nvfp4_mode}" if spec.backend == "nvfp4"
                            else spec.backend, "candidate", 3, minutes)
        run_id = Store(db).write_run(result)
        return run_id, result.run.status

    monkeypatch.setattr(cli_run, "_execute_and_store", execute_and_store)
    monkeypatch.setattr(quantbench.make.fixture, "default_model_dir", lambda: tmp_path / "fixture")
    return store, old_int4


def test_a_failed_variant_is_reported_as_failed_and_the_demo_exits_non_zero(demo_store):
    store, old_int4 = demo_store
    done = CliRunner().invoke(cli.app, ["demo", "--db", str(store.path)])
    assert done.exit_code == 1, done.output
    report = done.stdout[done.stdout.index(f"{MODEL} on CPU"):]
    assert old_int4[:13] not in done.stdout  # the older int4 run does not stand in for the failed one
    assert "| int4 |" not in report and "| bf16 |" in report and "| fp8 |" in report
    assert "**1 of 6 variants failed in this demo**" in report
    assert "- int4: failed (load_error): LoadError: w4g128/model.safetensors: missing key qweight" in report
    assert "demo: 1 of 6 variants failed (int4)" in " ".join(done.stderr.split())


def test_a_demo_where_every_variant_succeeds_exits_0_and_reports_only_its_own_runs(demo_store, monkeypatch):
    store, old_int4 = demo_store
    real = cli_run._execute_and_store

    def all_ok(spec, db):
        if spec.backend == "int4":
            run_id = Store(db).write_run(ok_run("int4", "int4", "candidate", 2, minutes=30_000))
            return run_id, "ok"
        return real(spec, db)

    monkeypatch.setattr(cli_run, "_execute_and_store", all_ok)
    done = CliRunner().invoke(cli.app, ["demo", "--db", str(store.path)])
    assert done.exit_code == 0, done.output
    assert "failed" not in done.stdout
    int4 = next(line for line in done.stdout.splitlines() if line.startswith("| int4 |"))
    assert "99.0%" in int4  # 2 flips of 200: this demo's int4 run, not the older one (40 flips, 80.0%)


def test_demo_family_omni_runs_every_variant_on_the_omni_model_and_its_suite(demo_store, monkeypatch, tmp_path):
    """`demo --family omni`: each variant's run gets the omni default model (or its variant for the backend) and the
    built-in media suite, prepared by the parent as `run --family omni` prepares them."""
    import quantbench.make.omni_fixture
    import quantbench.run.resolve

    store, _ = demo_store
    asked: list[tuple[str, str]] = []

    def family_defaults(backend, family, model, suite, shape=None):
        asked.append((backend, family))
        return str(tmp_path / f"omni-{backend}"), str(tmp_path / "quantbench-omni-v1.jsonl")

    specs = []
    faked = cli_run._execute_and_store

    def execute_and_store(spec, db):
        specs.append(spec)
        return faked(spec, db)

    monkeypatch.setattr(quantbench.run.resolve, "family_defaults", family_defaults)
    monkeypatch.setattr(quantbench.make.omni_fixture, "omni_default_model_dir", lambda: tmp_path / "omni")
    monkeypatch.setattr(cli_run, "_execute_and_store", execute_and_store)
    done = CliRunner().invoke(cli.app, ["demo", "--family", "omni", "--db", str(store.path)])
    assert f"embedded default model (omni): {tmp_path / 'omni'}" in " ".join(done.stderr.split())
    assert [s.backend for s in specs] == ["bf16", "bf16", "int4", "nvfp4", "nvfp4", "fp8"]
    assert all(family == "omni" for _, family in asked) and len(asked) == 6
    assert all(s.model == str(tmp_path / f"omni-{s.backend}") for s in specs)
    assert {s.suite for s in specs} == {str(tmp_path / "quantbench-omni-v1.jsonl")}
    assert done.exit_code == 1  # the fake int4 run fails, as in the text demo: reported, not hidden


def test_demo_refuses_an_unknown_family_before_running_anything(demo_store):
    store, _ = demo_store
    done = CliRunner().invoke(cli.app, ["demo", "--family", "vision", "--db", str(store.path)])
    assert done.exit_code != 0 and "--family 'vision'" in " ".join((done.stderr + done.stdout).split())
