"""QA of long sweeps that must not lose work: a store that fails mid-sweep, a sweep told to stop, Ray not started."""

import os
from pathlib import Path

import pytest
from rich.console import Console

from quantbench.errors import ConfigError
from quantbench.run.machine import detect
from quantbench.store import Store
from quantbench.sweep import Event, LocalExecutor, Slot, failed_result, load_sweep, print_summary, run_sweep

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text('gpus = ["cpu"]\n[defaults]\nlimit = 2\n'
                    '[[variants]]\nname = "a"\nbackend = "tests.tiny:TinyBackend"\n'
                    '[[variants]]\nname = "b"\nbackend = "tests.tiny:TinyBackend"\nseed = 7\n')
    return path


class BreakingExecutor:
    """Finishes each run at once (a failed row, no child); before the first, the store's file is replaced by a
    folder, as when the disk holding it goes away mid-sweep."""

    name = "stub"

    def __init__(self, store: Store):
        self.store = store

    def where(self) -> str:
        return "stub"

    def placeable(self, run):
        return None

    def accepts(self, run, row):
        return False

    def run(self, runs):
        self.store.path.mkdir()
        for run in runs:
            yield Event("started", run, where="stub")
            yield Event("finished", run, failed_result(run.spec, "crashed", "on purpose"), "stub")

    def close(self) -> None:
        pass


def test_a_store_that_fails_mid_sweep_keeps_each_run_aside_and_the_sweep_goes_on(tmp_path, sweep_file):
    # Before: the first write's StoreError left run_sweep, ending the sweep with runs in flight and the rest unrun.
    store = Store(tmp_path / "r.duckdb")
    console = Console(record=True, width=300)
    outcome = run_sweep(load_sweep(sweep_file), BreakingExecutor(store), store, console=console)
    assert (outcome.failed, outcome.not_started, outcome.run_ids) == (2, 0, [])
    assert len(outcome.unsaved) == 2 and all("quantbench merge" in why for why in outcome.unsaved)
    assert len(list(tmp_path.glob("quantbench-unsaved-*.parquet"))) == 2
    out = Console(record=True, width=300)
    print_summary(store, outcome, out)
    text = out.export_text()
    assert "2 run(s) could not be stored" in text and "Nothing ran" not in text, text


def test_a_stopped_sweep_counts_the_runs_it_never_started(tmp_path, sweep_file, monkeypatch):
    # Before: "Nothing ran: 0 of 2 runs were already finished", as if the matrix were done; rerunning resumes it.
    import quantbench.run.runner as runner

    monkeypatch.setattr(runner, "stopping", lambda: True)  # told to stop before the first run starts
    store = Store(tmp_path / "r.duckdb")
    ex = LocalExecutor([Slot("cpu", detect(), {}, cpu=True)])
    outcome = run_sweep(load_sweep(sweep_file), ex, store, console=Console(record=True))
    assert (outcome.ok, outcome.failed, outcome.not_started, outcome.interrupted) == (0, 0, 2, 0)
    out = Console(record=True, width=300)
    print_summary(store, outcome, out)
    assert "2 not started (the sweep was stopped): run the same sweep again" in out.export_text()


def a_ray_cluster_runs_here() -> bool:
    """Whether `--address auto` would find a cluster on this machine (another test file's, under pytest-xdist)."""
    from ray._private.services import find_gcs_addresses

    return bool(find_gcs_addresses())


def test_ray_with_no_cluster_at_the_address_is_one_line_naming_the_flag_and_the_fix(monkeypatch):
    # Before: Ray's ConnectionError traceback.
    ray = pytest.importorskip("ray")
    if ray.is_initialized() or a_ray_cluster_runs_here():
        pytest.skip("a Ray cluster runs on this machine: --address auto would find it")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "qa-sweep-no-ray"))
    from quantbench.sweep.ray import RayExecutor

    with pytest.raises(ConfigError, match=r"--address auto: no running Ray cluster .*ray start --head"):
        RayExecutor(address="auto")


def sleepy_task(spec, parquet_dir=None):
    """A Ray task that never finishes on its own (a run that takes hours)."""
    import time

    time.sleep(600)


def test_a_stop_signal_during_a_ray_sweep_stores_the_tasks_in_flight_as_interrupted(sweep_file, monkeypatch):
    # Before: ray.init replaced the stop handler with its own (SIGTERM dumped a C stack and aborted, rc 134), and
    # with it kept, the signal left ray.wait by SystemExit: either way no row for any run in flight, no message.
    import signal
    import threading

    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("Ray already runs in this process")
    from quantbench.run.runner import stop_on_signals, stop_requested
    from quantbench.sweep import plan
    from quantbench.sweep.ray import RayExecutor

    # Ray's workers import this module's task from the repo root (as tests/test_sweep_ray.py's cluster does)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    runs = plan(load_sweep(sweep_file))
    with stop_on_signals():
        ours = signal.getsignal(signal.SIGTERM)
        ex = RayExecutor(num_cpus=1, task=sleepy_task)
        stop = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        try:
            assert signal.getsignal(signal.SIGTERM) is ours  # still quantbench's, not Ray's
            events = ex.run(runs)
            started = [next(events), next(events)]
            stop.start()
            finished = list(events)
        finally:
            # the signal must never come after the handler is gone: it would end the test process (a worker that
            # could not import the task ended the events early, and the late SIGTERM killed a pytest-xdist worker)
            stop.cancel()
            ex.close()
        assert stop_requested() == signal.SIGTERM
    assert [e.kind for e in started] == ["started", "started"]
    assert [(e.kind, e.result.run.failure) for e in finished] == [("finished", "interrupted")] * 2
    assert "told to stop (SIGTERM)" in finished[0].result.run.error


@pytest.mark.parametrize("interrupted, says", [(0, "no run was in flight"), (2, "2 run(s) in flight stored as interrupted")])
def test_a_stopped_sweep_says_whether_a_run_was_in_flight(tmp_path, monkeypatch, interrupted, says):
    # Ctrl-C while the sweep waited for another sweep's runs said "the runs in flight were stored as interrupted"
    # with none in flight.
    import signal

    from typer.testing import CliRunner

    import quantbench.run.runner as runner
    import quantbench.sweep as sweep_pkg
    from quantbench.cli import app
    from quantbench.sweep.driver import SweepOutcome

    monkeypatch.setattr(sweep_pkg, "cli_sweep", lambda *a, **k: SweepOutcome(interrupted=interrupted, not_started=1))
    monkeypatch.setattr(runner, "stop_requested", lambda: signal.SIGINT)
    done = CliRunner().invoke(app, ["sweep", str(tmp_path / "s.toml"), "--db", str(tmp_path / "r.duckdb")])
    assert done.exit_code == 128 + signal.SIGINT, done.output
    text = " ".join(done.output.split())
    assert says in text and "1 not started" in text, text
