"""QA of sweeps, second round: the same sweep started twice on one store runs each run once (and a sweep that died
never blocks one), a sweep's `repeats` are one repeat group as `run --repeat N`'s are, and a noise-floor variant
that names no kernel takes `run --noise-floor`'s kernel of the machine that runs it."""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from quantbench.run.machine import detect
from quantbench.run.spec import noise_floor_kernel
from quantbench.store import Store, queries
from quantbench.sweep import LocalExecutor, Slot, load_sweep, plan, run_sweep, split_finished
from quantbench.sweep.claims import claims_folder
from tests.test_sweep import FAST, _fake_gpu, _stored, importable_tests, write  # noqa: F401 (autouse fixture)
from tests.tiny import TinyBackend

ROOT = Path(__file__).resolve().parent.parent
SLOW_ENV = "QUANTBENCH_TEST_SLOW_LOAD_S"


class SlowBackend(TinyBackend):
    """A tiny run whose load takes $QUANTBENCH_TEST_SLOW_LOAD_S seconds (none where it is unset): the same
    configuration, slow in one sweep's runs and quick in another's."""

    def load(self, spec, machine):
        time.sleep(float(os.environ.get(SLOW_ENV, "0")))
        return super().load(spec, machine)


def slow_sweep(tmp_path: Path) -> Path:
    return write(tmp_path, f'name = "twice"\ngpus = ["cpu"]\n[defaults]\n{FAST}'
                           '[[variants]]\nname = "a"\nbackend = "tests.test_qa_sweep2:SlowBackend"\n'
                           '[[variants]]\nname = "b"\nbackend = "tests.test_qa_sweep2:SlowBackend"\nseed = 7\n')


def start_sweep(path: Path, db: Path, log: Path, slow_s: float) -> subprocess.Popen:
    """`quantbench sweep` in a shell of its own, its output in `log`."""
    env = {**os.environ, SLOW_ENV: str(slow_s),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "quantbench", "sweep", str(path), "--db", str(db)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_until_running(sweep: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    """Until `sweep` says that its first run started."""
    deadline = time.monotonic() + timeout_s
    while " started (" not in log.read_text():
        assert sweep.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def said(text: str) -> str:
    return " ".join(text.split())  # rich wraps a line at 80 columns in a file


def cpu_slot() -> Slot:
    return Slot("cpu", dataclasses.replace(detect(), gpu_name=None, gpu_family="cpu"), {"CUDA_VISIBLE_DEVICES": ""},
                cpu=True)


# -- 1. the same sweep twice at once ------------------------------------------------------------------------------
def test_the_same_sweep_started_twice_at_once_runs_each_run_once_and_the_second_says_it_waits(tmp_path):
    # Before: each sweep ran both runs (four rows), neither knowing of the other.
    path, db = slow_sweep(tmp_path), tmp_path / "r.duckdb"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first, second = start_sweep(path, db, first_log, slow_s=12), None
    try:
        wait_until_running(first, first_log)
        second = start_sweep(path, db, second_log, slow_s=12)
        assert second.wait(timeout=600) == 0, second_log.read_text()
        assert first.wait(timeout=600) == 0, first_log.read_text()
    finally:
        for sweep in filter(None, (first, second)):
            if sweep.poll() is None:
                sweep.kill()
    runs = Store(db).read("SELECT status, spec FROM runs")
    assert runs.status.tolist() == ["ok", "ok"], runs  # each run once
    assert sorted(json.loads(s)["seed"] for s in runs.spec) == [0, 7]
    second_said = said(second_log.read_text())
    assert f"another sweep (pid {first.pid} on {socket.gethostname()}, started " in second_said, second_said
    assert re.search(r"holds [12] of these runs of this store \(its sweep 'twice'\): this one waits for them instead "
                     r"of running them twice", second_said), second_said
    assert re.search(r"Nothing ran: [01] of 2 runs were already finished \(--rerun runs them again\), [12] stored by "
                     r"another sweep of this store while this one waited", second_said), second_said
    assert "another sweep" not in said(first_log.read_text())
    assert list(claims_folder(db).glob("*.json")) == []  # both gave their claims back


def test_a_sweep_that_dies_holding_runs_never_blocks_them_the_waiting_sweep_runs_them(tmp_path, monkeypatch):
    # A sweep SIGKILLed mid-run leaves its claim behind; its runs must not wait for it forever.
    import quantbench.sweep.driver as driver

    path, db = slow_sweep(tmp_path), tmp_path / "r.duckdb"
    log = tmp_path / "dead.log"
    dead = start_sweep(path, db, log, slow_s=600)  # its first run would hold both claims for 10 minutes
    wait_until_running(dead, log)
    wait = driver._wait_for

    def dies_as_this_one_waits(*args):
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        return wait(*args)

    monkeypatch.setattr(driver, "_wait_for", dies_as_this_one_waits)
    console = Console(record=True, width=400)
    try:
        outcome = run_sweep(load_sweep(path), LocalExecutor([cpu_slot()]), Store(db), console=console)
    finally:
        dead.kill()
        dead.wait()
    text = console.export_text()
    assert f"another sweep (pid {dead.pid} on {socket.gethostname()}, started " in text, text
    assert "holds 2 of these runs of this store (its sweep 'twice'): this one waits for them" in text, text
    assert re.search(rf"sweep 'twice' \(pid {dead.pid} on .*\) is no longer running: the runs it had claimed are "
                     r"free again", text), text
    assert (outcome.ok, outcome.failed, outcome.by_others, outcome.not_started) == (2, 0, 0, 0), text
    assert len(Store(db).read("SELECT run_id FROM runs WHERE status = 'ok'")) == 2
    assert sorted(p.name for p in claims_folder(db).iterdir()) == ["registry.lock"]  # the dead one's files too


# -- 2. a sweep's repeats are a repeat group ----------------------------------------------------------------------
def test_a_sweeps_repeats_are_one_repeat_group_that_the_report_shows_as_run_repeat_does(tmp_path):
    # Before: three runs of one configuration with no repeat_id; the report showed the newest one's p50 alone.
    from quantbench.cli import app

    path = write(tmp_path, f'repeats = 3\ngpus = ["cpu"]\n[defaults]\n{FAST}'
                           '[[variants]]\nbackend = "bf16"\nrole = "reference"\n')
    db = tmp_path / "r.duckdb"
    swept = CliRunner().invoke(app, ["sweep", str(path), "--db", str(db)])
    assert swept.exit_code == 0, swept.output
    runs = queries.stored_runs(Store(db))
    assert [r.status for r in runs] == ["ok"] * 3, swept.output
    assert len({r.repeat_id for r in runs}) == 1 and runs[0].repeat_id
    assert sorted(r.repeat_index for r in runs) == [1, 2, 3] and {r.repeat_count for r in runs} == {3}
    shown = CliRunner().invoke(app, ["report", "--db", str(db), "--gpu", "cpu"])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"\| [\d.,]+ ± [\d.,]+ / [\d.,]+ ms \(3 runs, CV [\d.]+%\)( ⚠ busy)? \|", shown.output), shown.output
    assert "± is the half-width of a 95% t interval over the runs of one `quantbench run --repeat N`" in shown.output


def test_a_sweep_run_again_continues_the_repeat_group_its_finished_runs_began(tmp_path):
    runs = plan(load_sweep(write(tmp_path, 'repeats = 3\n[[variants]]\nbackend = "bf16"\n')))
    here = LocalExecutor([Slot("cpu", detect(), {}, cpu=True)])
    store = Store(tmp_path / "r.duckdb")
    for index in (1, 2):  # a sweep stopped after two of its three runs
        _stored(store, runs[0].spec, detect(), repeat_id="stopped", repeat_index=index, repeat_count=3)
    todo, skipped = split_finished(runs, store, here.accepts)
    assert len(skipped) == 2 and [r.repeat_tag for r in todo] == [("stopped", 3, 3)]
    # runs 1 and 3 finished, 2 failed: the run left takes index 2 (it took 3 again: two runs numbered 3)
    gap = Store(tmp_path / "gap.duckdb")
    for index in (1, 3):
        _stored(gap, runs[0].spec, detect(), repeat_id="gap", repeat_index=index, repeat_count=3)
    todo, _ = split_finished(runs, gap, here.accepts)
    assert [r.repeat_tag for r in todo] == [("gap", 2, 3)]
    # one run of `run --repeat 2`'s group is not a group of three: the two left start one of their own
    other = Store(tmp_path / "other.duckdb")
    _stored(other, runs[0].spec, detect(), repeat_id="two", repeat_index=1, repeat_count=2)
    todo, _ = split_finished(runs, other, here.accepts)
    assert [r.repeat_tag[1:] for r in todo] == [(2, 3), (3, 3)]
    assert len({r.repeat_tag[0] for r in todo}) == 1 and todo[0].repeat_tag[0] != "two"
    # --rerun: three new runs, a new group
    todo, _ = split_finished(runs, store, here.accepts, rerun=True)
    assert [r.repeat_tag[1:] for r in todo] == [(1, 3), (2, 3), (3, 3)]
    assert len({r.repeat_tag[0] for r in todo}) == 1 and todo[0].repeat_tag[0] != "stopped"
    once = plan(load_sweep(write(tmp_path, '[[variants]]\nbackend = "bf16"\n', "once.toml")))
    assert split_finished(once, store, here.accepts, rerun=True)[0][0].repeat_tag is None  # one run is no group


# -- 3. the noise floor's kernel, per machine ---------------------------------------------------------------------
FLOORS = '''[[variants]]
backend = "bf16"
role = "noise_floor"
[[variants]]
name = "eager floor"
backend = "bf16"
role = "noise_floor"
experts_impl = "eager"
[[variants]]
name = "float32 floor"
backend = "bf16"
role = "noise_floor"
dtype = "float32"
experts_impl = "eager"
'''


def kernel(spec) -> tuple[str, str]:
    return spec.options.experts_impl, spec.dtype


def test_a_noise_floor_that_names_no_kernel_takes_run_noise_floors_kernel_of_the_machine_and_named_ones_stay(tmp_path):
    # Before: it ran BF16's default kernel (transformers' grouped_mm on a CPU, quantbench's engine on a GPU): the
    # reference's own, a floor of zero noise; the examples named eager, which on a CPU answers as grouped_mm does.
    from quantbench.cli.run import noise_floor_kernel as run_noise_floor

    chosen, eager, fp32 = plan(load_sweep(write(tmp_path, FLOORS)))
    gpu, cpu = _fake_gpu(0).machine, cpu_slot().machine
    assert chosen.floor_kernel_here and chosen.label.startswith("bf16 (noise floor)")
    assert kernel(chosen.spec_on(gpu)) == ("eager", "bfloat16") == noise_floor_kernel("auto", True)
    assert kernel(chosen.spec_on(cpu)) == ("grouped_mm", "float32") == noise_floor_kernel("auto", False)
    assert kernel(chosen.spec_on(detect())) == run_noise_floor("auto")  # what `run --noise-floor` runs here
    assert not eager.floor_kernel_here and kernel(eager.spec_on(cpu)) == ("eager", "bfloat16")
    assert not fp32.floor_kernel_here and kernel(fp32.spec_on(gpu)) == ("eager", "float32")
    in_defaults = '[defaults]\ndtype = "float32"\n[[variants]]\nbackend = "bf16"\nrole = "noise_floor"\n'
    defaults = plan(load_sweep(write(tmp_path, in_defaults, "defaults.toml")))
    assert not defaults[0].floor_kernel_here and kernel(defaults[0].spec_on(gpu)) == ("auto", "float32")
    for example in ("sweep-fixture.toml", "sweep-h200.toml"):
        floors = [r for r in plan(load_sweep(ROOT / "examples" / example)) if r.spec.role == "noise_floor"]
        assert [r.floor_kernel_here for r in floors] == [True], example


def test_each_machine_of_a_sweep_runs_the_noise_floor_under_its_own_second_kernel_and_finds_it_again(tmp_path):
    path = write(tmp_path, f'gpus = ["hopper", "cpu"]\n[defaults]\n{FAST}'
                           '[[variants]]\nbackend = "bf16"\nrole = "noise_floor"\n')
    store = Store(tmp_path / "r.duckdb")
    executor = LocalExecutor([_fake_gpu(0), cpu_slot()])
    outcome = run_sweep(load_sweep(path), executor, store, console=Console(record=True))
    assert (outcome.ok, outcome.failed) == (2, 0)
    rows = store.read("SELECT gpu_requested, spec, compute_dtype, kernel_path FROM runs ORDER BY gpu_requested")
    specs = [json.loads(s) for s in rows.spec]
    assert [(s["experts_impl"], s["dtype"]) for s in specs] == [("grouped_mm", "float32"), ("eager", "bfloat16")]
    assert rows.gpu_requested.tolist() == ["cpu", "hopper"]
    assert rows.compute_dtype.tolist() == ["float32", "bfloat16"] and "eager" in rows.kernel_path.iloc[1]
    # A sweep run again finds each machine's floor under the kernel that machine chose. The fake GPU's child stored
    # this CPU's identity, so its rows are made here as a real GPU's and this CPU's runs store them.
    runs, machines = plan(load_sweep(path)), (_fake_gpu(0).machine, cpu_slot().machine)
    both = Store(tmp_path / "both.duckdb")
    for run, machine in zip(runs, machines, strict=True):
        _stored(both, run.spec_on(machine), machine)
    assert split_finished(runs, both, executor.accepts) == ([], runs)
    planned = Store(tmp_path / "planned.duckdb")  # the planned spec (BF16's default kernel) is not the floor
    for run, machine in zip(runs, machines, strict=True):
        _stored(planned, run.spec, machine)
    assert split_finished(runs, planned, executor.accepts) == (runs, [])


def test_a_ray_task_chooses_the_noise_floors_kernel_on_its_own_node(tmp_path, monkeypatch):
    import quantbench.run.runner as runner
    from quantbench.sweep.ray import _task_extras, run_task

    chosen, eager, _ = plan(load_sweep(write(tmp_path, FLOORS)))
    assert _task_extras(chosen) == {"floor_kernel_here": True} and _task_extras(eager) == {}
    ran = []
    monkeypatch.setattr(runner, "execute", lambda spec, **kw: ran.append((spec, kw)) or "result")
    assert run_task(chosen.spec.to_dict(), floor_kernel_here=True, repeat=("g", 1, 2)) == "result"
    spec, kw = ran[0]
    assert kernel(spec) == noise_floor_kernel("auto", detect().has_gpu) and kw["repeat"] == ("g", 1, 2)
