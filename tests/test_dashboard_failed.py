"""The dashboard over stores holding the failed runs quantbench itself writes, one store per failure kind.

Each failed run is made by `runner.execute` (a real child that fails in that way) and stored by `Store.write_run`,
so its row has exactly the columns a real failure leaves: a run that died before loading has no model id, no
suite, no variant.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.analysis.parity import gpu_key
from quantbench.run.machine import detect
from quantbench.run.record import RunResult
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests import dashboard_store as ds
from tests.failing_backends import model_less_load_error
from tests.stored import stored_run

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "dashboard" / "streamlit_app.py")
PAGES = ["page_report.py", "page_latency.py", "page_parity.py", "page_runs.py"]
TITLES = ["Which quant should I use?", "Latency", "Parity detail", "Runs"]
HERE = f"cpu:{detect().host}"  # what a user types: this host's name
# the machine the dashboard chooses for it: host, CPU model, logical CPUs and machine id (quantbench.analysis.parity)
HERE_KEY = "cpu:" + gpu_key(stored_run(**{"device": "cpu", **detect().as_row()}))[1]

# failure kind → (backend, extra spec fields, the failure label stored, words of the stored error)
KINDS: dict[str, tuple[str, dict, str, str]] = {
    "missing model": ("bf16", {"model": "/nonexistent"}, "load_error", "no config.json"),
    "load error": ("tests.tiny:LoadErrorBackend", {}, "load_error", "missing key"),
    "timeout": ("tests.tiny:HangBackend", {"timeout_s": 3}, "timeout", "timeout of 3 s"),
    "killed child": ("tests.failing_backends:KilledBackend", {}, "killed", "SIGKILL"),
    "crashed child": ("tests.tiny:CrashBackend", {}, "crashed", "SIGABRT"),
    "out of memory": ("tests.failing_backends:OutOfMemoryBackend", {}, "oom", "56.9 GiB"),
    "unsupported": ("tests.failing_backends:UnsupportedBackend", {}, "unsupported", "compute capability"),
    "failed after loading": ("tests.tiny:RaiseBackend", {}, "crashed", "kernel exploded on purpose"),
}


@pytest.fixture(scope="module")
def failed_runs(tmp_path_factory) -> dict[str, RunResult]:
    """One real failed run of each kind, made once for the module."""
    suite = tmp_path_factory.mktemp("suite") / "mini.jsonl"
    suite.write_text('{"id": "r0", "benchmark": "mini", "request": {"state": {"observation": "a wall"}, '
                     '"questions": {"q": {"type": "boolean"}}}}\n')
    machine = detect()

    def one(backend: str, extra: dict) -> RunResult:
        if extra.get("model") == "/nonexistent":  # `run` now refuses it in the parent: an older store's row
            return model_less_load_error(RunSpec(backend=backend, suite=str(suite), gpu="cpu", **extra), machine)
        return execute(RunSpec(backend=backend, suite=str(suite), gpu="cpu", warmup=0, latency_min_decisions=1,
                               latency_min_seconds=0.0, **extra), machine=machine, echo=False)

    with pytest.MonkeyPatch.context() as mp:  # the child imports the test backends by path
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        # Side by side: each child spends most of its time importing torch, and the timeout one sleeping.
        with ThreadPoolExecutor(4) as pool:
            futures = {kind: pool.submit(one, backend, extra) for kind, (backend, extra, _, _) in KINDS.items()}
            out = {kind: f.result() for kind, f in futures.items()}
    for kind, result in out.items():
        assert (result.run.status, result.run.failure) == ("failed", KINDS[kind][2]), result.run.error
        assert KINDS[kind][3] in result.run.error, kind
    return out


def app(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    return at.run()


def every_page(at: AppTest) -> AppTest:
    for page, title in zip(PAGES, TITLES, strict=True):
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception[0].message if at.exception else None)
        assert [t.value for t in at.title] == [title], page
    return at


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_store_of_one_failed_run_shows_it_failed_on_every_page(kind, failed_runs, tmp_path, monkeypatch):
    store = Store(tmp_path / "results.duckdb")
    run_id = store.write_run(failed_runs[kind])
    monkeypatch.setenv("QUANTBENCH_DB", str(store.path))
    at = app()
    assert not at.exception, at.exception[0].message
    warnings = " ".join(w.value for w in at.warning)
    assert "failed" in warnings and "nothing to compare" in warnings
    assert at.dataframe[0].value["failure"].tolist() == [KINDS[kind][2]]
    every_page(at)
    runs = at.dataframe[0].value  # the Runs page, drawn last
    assert runs["run_id"].astype(str).tolist() == [run_id]
    assert runs["failure"].tolist() == [KINDS[kind][2]]


@pytest.fixture(scope="module")
def mixed(failed_runs, tmp_path_factory) -> Path:
    """The dashboard's test store (three machines, every variant) plus this host's failed runs of every kind."""
    store = ds.build(tmp_path_factory.mktemp("mixed") / "results.duckdb")
    for result in failed_runs.values():
        store.write_run(result)
    return store.path


@pytest.fixture
def mixed_store(mixed, tmp_path, monkeypatch) -> Path:
    path = tmp_path / "results.duckdb"
    shutil.copy(mixed, path)
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    return path


def test_every_page_renders_beside_failed_runs_on_the_default_view_and_each_machine(mixed_store):
    at = every_page(app())
    for machine in ("NVIDIA H200", "cpu:ci-runner", HERE):
        every_page(app(gpu=machine))
    at = app(gpu=HERE)
    assert at.selectbox(key="gpu").value == HERE_KEY
    # Only one of this host's runs got as far as loading a model: that model is the one to choose.
    assert at.selectbox(key="model").options == ["tiny-test"]
    at.switch_page("page_runs.py").run()
    failures = at.dataframe[0].value.query("status != 'ok'")["failure"].tolist()
    assert sorted(failures) == sorted([k[2] for k in KINDS.values()] + ["oom"])  # + the test store's own oom


def test_a_machine_whose_every_run_failed_before_loading_says_so(failed_runs, tmp_path, monkeypatch):
    """A host with only model-less failed runs, beside a machine with good runs: its view explains, not crashes."""
    store = ds.build(tmp_path / "results.duckdb")
    for kind in ("missing model", "timeout", "killed child"):
        store.write_run(failed_runs[kind])
    monkeypatch.setenv("QUANTBENCH_DB", str(store.path))
    at = app(gpu=HERE)
    assert not at.exception, at.exception[0].message
    assert at.selectbox(key="gpu").value == HERE_KEY
    assert not [s for s in at.selectbox if s.key == "model"]  # no model to choose here
    warnings = " ".join(w.value for w in at.warning)
    assert "Every run on" in warnings and "failed before loading a model" in warnings
    assert sorted(at.dataframe[0].value["failure"].tolist()) == ["killed", "load_error", "timeout"]
    every_page(at)
