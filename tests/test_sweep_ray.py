"""The Ray executor on a local Ray cluster with two fake GPUs: every run lands once, a task that crashes (its
child, or its Ray worker) becomes a failed row while the others succeed, finished runs are skipped, --rerun runs
them again, and the local executor gives the same answers for the same matrix."""

import os
from pathlib import Path

import numpy as np
import pytest

from quantbench.store import Store
from quantbench.store.transfer import merge
from quantbench.sweep import LocalExecutor, load_sweep, plan, run_sweep
from quantbench.sweep.ray import RayExecutor, accelerator_type, run_task

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def task_that_can_die(spec, parquet_dir=None):
    """The sweep's own task, except that a run whose notes start with "die" kills its Ray worker first."""
    if spec["notes"].startswith("die"):
        os._exit(1)
    return run_task(spec, parquet_dir)


@pytest.fixture(scope="module")
def cluster():
    from quantbench.make.fixture import default_model_dir

    default_model_dir(progress=False)  # built (or found) once here, not inside a task
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "PYTHONPATH")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # Ray workers and their children import tests.* (task functions, test backends) from the repo root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep")
    (path / "mini.jsonl").write_text("".join(
        f'{{"id": "r{i}", "benchmark": "mini", "gold": {{"q": "yes"}}, "request": {{"state": {{"observation": '
        f'"wall {i}"}}, "questions": {{"q": {{"type": "boolean"}}, "dir": {{"type": "choice", "criteria": '
        f'{{"left": "Turn left", "right": "Turn right"}}}}}}}}}}\n' for i in range(3)))
    return path


HEAD = '''suites = ["mini.jsonl"]
[defaults]
limit = 3
warmup = 1
latency_min_decisions = 2
latency_min_seconds = 0.0
[[models]]
name = "fixture"
fixture = true
'''
TINY = '[[variants]]\nname = "tiny"\nbackend = "tests.tiny:TinyBackend"\n'
BF16 = '[[variants]]\nbackend = "bf16"\nrole = "reference"\n'
MATRIX = HEAD + TINY + BF16 + '''
[[variants]]
name = "tiny fp32"
backend = "tests.tiny:TinyBackend"
dtype = "float32"
[[variants]]
name = "crash"
backend = "tests.tiny:CrashBackend"
[[variants]]
name = "worker dies"
backend = "tests.tiny:TinyBackend"
seed = 1
notes = "die"
'''


def sweep_file(workdir: Path, name: str, text: str) -> Path:
    path = workdir / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def swept(cluster, workdir):
    store = Store(workdir / "ray.duckdb")
    outcome = run_sweep(load_sweep(sweep_file(workdir, "matrix.toml", MATRIX)),
                        RayExecutor(task=task_that_can_die), store)
    return store, outcome


def test_every_run_of_a_ray_sweep_lands_once_and_crashes_become_failed_rows(swept):
    store, outcome = swept
    assert (outcome.planned, outcome.ok, outcome.failed, outcome.skipped) == (5, 3, 2, 0)
    runs = store.read("SELECT run_id, status, failure, error, backend, variant, spec, spec_hash FROM runs")
    assert len(runs) == 5 and runs.run_id.is_unique
    notes = runs.spec.map(lambda s: __import__("json").loads(s)["notes"])
    by = dict(zip(notes.str.rpartition(": ")[2], runs.itertuples(), strict=True))
    assert {k: by[k].status for k in by} == {"tiny": "ok", "bf16": "ok", "tiny fp32": "ok", "crash": "failed",
                                             "worker dies": "failed"}
    assert by["crash"].failure == "crashed" and "signal 6" in by["crash"].error  # the child died, the task lived
    assert by["worker dies"].failure == "crashed" and "Ray worker running this task died" in by["worker dies"].error
    assert by["bf16"].variant == "bf16"  # a real run of the embedded fixture
    answers = store.read("SELECT run_id, count(*) AS n FROM answers GROUP BY run_id")
    assert sorted(answers.n.tolist()) == [6, 6, 6]  # 3 records × 2 questions, for each ok run, once


def test_a_second_ray_sweep_skips_finished_runs_and_rerun_runs_them_again(swept, workdir, tmp_path):
    store, _ = swept
    small = load_sweep(sweep_file(workdir, "small.toml", HEAD + TINY + BF16))
    again = run_sweep(small, RayExecutor(), store)
    assert (again.skipped, again.ok, again.failed) == (2, 0, 0) and again.run_ids == []
    before = len(store.read("SELECT run_id FROM runs"))
    rerun = run_sweep(small, RayExecutor(parquet_dir=str(tmp_path / "parts")), store, rerun=True)
    assert (rerun.skipped, rerun.ok) == (0, 2)
    assert len(store.read("SELECT run_id FROM runs")) == before + 2
    # each task also wrote its run as Parquet; merging them elsewhere gives the same runs, and here adds nothing
    parts = sorted((tmp_path / "parts").glob("*.parquet"))
    assert sorted(p.stem for p in parts) == sorted(rerun.run_ids)
    assert merge(Store(tmp_path / "elsewhere.duckdb"), [tmp_path / "parts"]).runs_added == 2
    assert merge(store, [tmp_path / "parts"]).runs_added == 0


def test_the_local_and_the_ray_executor_give_the_same_answers(swept, workdir):
    ray_store, _ = swept
    local_store = Store(workdir / "local.duckdb")
    outcome = run_sweep(load_sweep(sweep_file(workdir, "small.toml", HEAD + TINY + BF16)), LocalExecutor(),
                        local_store)
    assert outcome.ok == 2
    query = ("SELECT r.spec_hash, a.record_id, a.question, a.top, a.probs FROM answers a JOIN runs r USING (run_id) "
             "WHERE r.run_id IN (SELECT min(run_id) FROM runs WHERE status = 'ok' GROUP BY spec_hash) "
             "ORDER BY 1, 2, 3")
    local = local_store.read(query)
    remote = ray_store.read(query)
    remote = remote[remote.spec_hash.isin(set(local.spec_hash))].reset_index(drop=True)
    assert len(local) == 12 and len(remote) == 12  # tiny and bf16: the same configs (same hash) ran on both
    assert local.top.tolist() == remote.top.tolist()
    np.testing.assert_allclose(np.stack(local.probs), np.stack(remote.probs), atol=1e-6)


def test_a_run_no_node_can_take_is_reported_not_submitted(cluster, workdir):
    store = Store(workdir / "none.duckdb")
    sweep = load_sweep(sweep_file(workdir, "hopper.toml", 'gpus = ["hopper", {name = "NVIDIA H200"}]\n' + HEAD + TINY))
    outcome = run_sweep(sweep, RayExecutor(), store)
    assert outcome.run_ids == [] and len(outcome.unplaceable) == 2
    assert "no node in the Ray cluster has a hopper GPU (ray.io/accelerator-type in H100, H200" in outcome.unplaceable[0][1]
    assert "a GPU named 'NVIDIA H200' (ray.io/accelerator-type = H200)" in outcome.unplaceable[1][1]
    assert not store.path.exists()


def test_gpu_names_become_the_accelerator_types_ray_labels_nodes_with():
    assert accelerator_type("NVIDIA H200") == "H200" and accelerator_type("h200") == "H200"
    assert accelerator_type("NVIDIA H100 80GB HBM3") == "H100"
    assert accelerator_type("rtx pro 6000") == "RTX-PRO-6000"
    assert accelerator_type("NVIDIA GeForce RTX 5090") == "GeForce-RTX-5090"


def test_a_stored_run_counts_on_ray_for_the_same_gpu_model_anywhere_and_for_auto_only_on_the_cluster(cluster,
                                                                                                   workdir):
    import socket

    sweep = load_sweep(sweep_file(workdir, "gpus.toml", 'gpus = ["hopper", {name = "H200"}, "auto", "cpu"]\n'
                                  + HEAD + TINY))
    hopper, h200, auto, cpu = plan(sweep)
    ex = RayExecutor()
    h200_elsewhere = {"gpu_name": "NVIDIA H200", "gpu_family": "hopper", "host": "other-box"}
    cpu_here = {"gpu_name": None, "gpu_family": "cpu", "host": socket.gethostname()}
    assert ex.accepts(hopper, h200_elsewhere) and ex.accepts(h200, h200_elsewhere)
    assert not ex.accepts(auto, h200_elsewhere) and not ex.accepts(cpu, h200_elsewhere)
    assert ex.accepts(auto, cpu_here) and ex.accepts(cpu, cpu_here)
    assert not ex.accepts(hopper, cpu_here) and not ex.accepts(h200, cpu_here)
