"""Sweeps: the file is validated with messages naming file, key and fix; the matrix is planned as written;
finished runs are skipped; the local executor runs one process per GPU in parallel and stores every result."""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from quantbench.errors import ConfigError
from quantbench.run.machine import detect
from quantbench.run.record import RunResult, uuid7
from quantbench.run.runner import spec_hash
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from quantbench.sweep import LocalExecutor, Slot, load_sweep, plan, run_sweep, split_finished
from tests.tiny import TinyBackend, save_tiny

ROOT = Path(__file__).resolve().parent.parent
FAST = 'warmup = 1\nlatency_min_decisions = 2\nlatency_min_seconds = 0.0\nlimit = 3\n'


class EnvBackend(TinyBackend):
    """A tiny run that records which GPU it was given (CUDA_VISIBLE_DEVICES) on its row."""

    def load(self, spec, machine):
        loaded = super().load(spec, machine)
        loaded.info.extra = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        return loaded


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    # The child imports test backends by path (tests.tiny:..., tests.test_sweep:...): make the repo importable.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "mini.jsonl"
    records = [{"id": f"r{i}", "benchmark": "mini", "gold": {"q": "yes" if i % 2 else "no"},
                "request": {"state": {"observation": f"wall {i}"}, "questions": {"q": {"type": "boolean"}}}}
               for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-bf16")


def write(tmp_path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- validation ---------------------------------------------------------------------------------------------------
GOOD = '[[variants]]\nbackend = "bf16"\n'


@pytest.mark.parametrize("text, expected", [
    ('colour = "blue"\n' + GOOD, r"top level: unknown key 'colour'.*allowed keys"),
    ('[[variants]]\nbackend = "bf16"\nlimt = 3\n', r"variants\[0\]: unknown key 'limt'; did you mean 'limit'\?"),
    ('[[variants]]\nbackend = "int5"\n', r"variants\[0\]\.backend: 'int5' is not an installed backend; did you mean 'int4'\?.*installed: .*bf16"),
    ('[[variants]]\nbackend = "bf16"\nlimit = "ten"\n', r"variants\[0\]\.limit: expected an integer, got 'ten' \(a string\)"),
    ('[defaults]\ntruncate = 1\n' + GOOD, r"defaults\.truncate: expected true or false, got 1 \(an integer\)"),
    ('repeats = 2.5\n' + GOOD, r"repeats: expected an integer, got 2\.5 \(a number\)"),
    ('suites = ["builtin"]\n', r"variants: no variants; add at least one \[\[variants\]\] table"),
    ('variants = []\n', r"variants: no variants"),
    ('gpus = ["hoper"]\n' + GOOD, r"gpus\[0\]: unknown GPU family 'hoper'; did you mean 'hopper'\?.*\{name = \"hoper\"\}"),
    ('[[models]]\nname = "m"\npath = "no/such/dir"\n' + GOOD, r"models\[0\]\.path: .*no/such/dir does not exist.*give the BF16 checkpoint directory"),
    ('[[variants]]\nbackend = "bf16"\nlimit = 3\nlimit = 4\n', r"not valid TOML: .*\(at line 4, column \d+\); fix the file at that line"),
    ('[[variants]]\nbackend = bf16\n', r"not valid TOML: .*at line 2"),
    ('[[variants]]\nbackend = "bf16"\nrole = "judge"\n', r"variants\[0\]\.role: 'judge' is not one of candidate, reference, noise_floor"),
    ('[[variants]]\nbackend = "bf16"\nlimit = 0\n', r"variants\[0\]\.limit: must be positive, got 0"),
    ('[[variants]]\nbackend = "bf16"\nconcurrency = 100000\n', r"variants\[0\]\.concurrency: must be 1024 or fewer, got 100000"),
    ('[[variants]]\nbackend = "http"\n', r"variants\[0\]: backend \"http\" needs endpoint"),
    ('[[variants]]\nbackend = "http"\nendpoint = "http://x"\napi_key = "s3cret"\n', r"variants\[0\]\.api_key: secrets do not belong.*QUANTBENCH_API_KEY"),
    ('[[variants]]\nbackend = "bf16"\nmodel = "/x"\n', r"variants\[0\]: unknown key 'model'"),
    ('[[models]]\nname = "m"\nfixture = true\nshape = "qwen3-30b-a3b"\n' + GOOD, r"models\[0\]: model 'm' needs exactly one of"),
    ('[[models]]\nname = "m"\nshape = "qwen9"\n' + GOOD, r"models\[0\]\.shape: unknown shape 'qwen9'; use one of qwen3-30b-a3b"),
    ('[[variants]]\nbackend = "bf16"\nmodels = ["other"]\n', r"variants\[0\]\.models: no model named 'other'"),
    ('[[variants]]\nbackend = "tests.tiny:Nope"\n', r"variants\[0\]\.backend: .*cannot import it"),
    ('[quantize]\ngroup_size = 100\n' + GOOD, r"quantize: --group-size 100: use 32, 64, 128, 256 or -1"),
    ('[quantize]\nbits = 3\n' + GOOD, r"quantize: unknown key 'bits'"),
])
def test_each_mistake_in_a_sweep_file_names_the_file_the_key_and_the_fix(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    message = str(e.value)
    assert message.startswith(f"{path.resolve()}: ") or message.startswith(f"{path}: "), message
    assert re.search(expected, message), message


def test_a_quantized_variant_of_a_checkpoint_needs_a_ready_one_or_quantize_missing(tmp_path, checkpoint):
    body = f'[[models]]\nname = "tiny"\npath = "{checkpoint}"\n[[variants]]\nbackend = "int4"\n'
    with pytest.raises(ConfigError, match=r"models\[0\]: variant 'int4' needs a int4 checkpoint of 'tiny'; "
                                          r"give int4 = \"DIR\" in that model, or set quantize_missing = true"):
        load_sweep(write(tmp_path, body))
    assert load_sweep(write(tmp_path, "quantize_missing = true\n" + body)).quantize_missing
    ready = load_sweep(write(tmp_path, body.replace('[[variants]]', f'int4 = "{checkpoint}"\n[[variants]]')))
    assert plan(ready)[0].spec.model == str(checkpoint) and plan(ready)[0].make is None


def test_two_variants_that_are_the_same_run_are_refused(tmp_path):
    path = write(tmp_path, GOOD + '[[variants]]\nname = "again"\nbackend = "bf16"\nnotes = "x"\n')
    with pytest.raises(ConfigError, match=r"'again' and 'bf16' are the same run on model 'fixture'; remove one"):
        plan(load_sweep(path))


def test_the_documented_examples_are_valid_sweep_files(tmp_path, checkpoint):
    fixture_sweep = load_sweep(ROOT / "examples" / "sweep-fixture.toml")
    assert len(plan(fixture_sweep)) == 6
    text = (ROOT / "examples" / "sweep.toml").read_text().replace("/models/Qwen3-30B-A3B", str(checkpoint))
    sweep = load_sweep(write(tmp_path, text))
    runs = plan(sweep)
    # 3 models × 6 variants × 1 suite × 2 GPU requirements
    assert len(runs) == 36
    assert sweep.gpus == ["hopper", "RTX PRO 6000"] and sweep.defaults["limit"] == 200


# -- planning -----------------------------------------------------------------------------------------------------
def test_the_matrix_is_models_by_variants_by_suites_by_gpus_by_repeats(tmp_path, checkpoint, suite):
    path = write(tmp_path, f'''
repeats = 2
quantize_missing = true
variants_dir = "made"
suites = ["builtin", "{suite}"]
gpus = ["cpu", "auto"]
[defaults]
limit = 7
warmup = 2
[[models]]
name = "fx"
fixture = true
[[models]]
name = "tiny"
path = "{checkpoint}"
[[variants]]
backend = "bf16"
role = "reference"
[[variants]]
backend = "int4"
warmup = 0
[[variants]]
name = "server"
backend = "http"
endpoint = "http://127.0.0.1:9"
models = ["tiny"]
''')
    runs = plan(load_sweep(path))
    assert len(runs) == (2 * 2 + 1) * 2 * 2 * 2  # (models × local variants + one http) × suites × gpus × repeats
    int4_tiny = [r for r in runs if r.model == "tiny" and r.spec.backend == "int4"]
    made = int4_tiny[0].make.out
    assert made.parent == tmp_path / "made" and made.name.startswith("tiny-int4-")  # + the recipe's hash
    assert {r.spec.model for r in int4_tiny} == {str(made)}
    assert {r.make for r in int4_tiny} == {int4_tiny[0].make} and int4_tiny[0].make.source == checkpoint
    assert all(r.spec.limit == 7 for r in runs)  # defaults reach every run
    assert {r.spec.warmup for r in int4_tiny} == {0}  # a variant's own value wins
    assert {r.spec.model for r in runs if r.model == "fx"} == {None}  # the embedded model
    assert {r.spec.suite for r in runs} == {None, str(suite)}
    assert {r.spec.gpu for r in runs} == {"cpu", "auto"} and {r.repeat for r in runs} == {0, 1}
    assert {r.model for r in runs if r.spec.backend == "http"} == {"tiny"}


# -- skipping finished runs ---------------------------------------------------------------------------------------
def _stored(store: Store, spec: RunSpec, machine, status: str = "ok", **fields) -> None:
    """A row as a run of `spec` on `machine` would leave it (`fields`: more of its columns)."""
    row = {**machine.as_row(), "run_id": str(uuid7()), "created_at": "2026-11-29 10:00:00+00", "status": status,
           "backend": spec.backend, "spec_hash": spec_hash(spec, machine), **fields}
    store.write_run(RunResult(run=row))


def test_finished_runs_are_skipped_per_repeat_and_only_when_ok_on_a_matching_machine(tmp_path, suite):
    sweep = load_sweep(write(tmp_path, f'repeats = 3\nsuites = ["{suite}"]\n[[variants]]\nbackend = "bf16"\n'
                                       '[[variants]]\nbackend = "tests.tiny:TinyBackend"\n'))
    runs = plan(sweep)
    bf16, tiny = runs[0].spec, runs[3].spec
    here = LocalExecutor([Slot("cpu", detect(), {}, cpu=True)])
    store = Store(tmp_path / "r.duckdb")
    assert split_finished(runs, store, here.accepts) == (runs, [])  # no store yet: everything runs
    elsewhere = dataclasses.replace(detect(), host="another-host")
    _stored(store, bf16, detect())
    _stored(store, bf16, detect())
    _stored(store, bf16, detect(), status="failed")  # failed runs do not count
    _stored(store, tiny, elsewhere)  # another machine's run does not count here
    todo, skipped = split_finished(runs, store, here.accepts)
    assert [(r.variant, r.repeat) for r in skipped] == [("bf16", 0), ("bf16", 1)]
    assert [(r.variant, r.repeat) for r in todo] == [("bf16", 2), ("TinyBackend", 0), ("TinyBackend", 1),
                                                     ("TinyBackend", 2)]
    assert split_finished(runs, store, here.accepts, rerun=True) == (runs, [])


# -- the local executor -------------------------------------------------------------------------------------------
def _fake_gpu(index: int) -> Slot:
    # A GPU slot as NVML would describe it, but running on this CPU (device "cpu"): what differs is the env.
    machine = dataclasses.replace(detect(), gpu_name="Fake H200", gpu_family="hopper", gpu_cc="9.0", device="cpu")
    return Slot(f"gpu {index}", machine, {"CUDA_VISIBLE_DEVICES": str(index)})


def test_a_local_sweep_runs_each_gpu_queue_in_parallel_with_its_own_cuda_visible_devices(tmp_path, suite):
    path = write(tmp_path, f'repeats = 2\nsuites = ["{suite}"]\ngpus = ["hopper", "cpu", "blackwell"]\n'
                           f'[defaults]\n{FAST}[[variants]]\nbackend = "tests.test_sweep:EnvBackend"\n')
    cpu = Slot("cpu", dataclasses.replace(detect(), gpu_name=None, gpu_family="cpu"), {"CUDA_VISIBLE_DEVICES": ""},
               cpu=True)
    store = Store(tmp_path / "r.duckdb")
    outcome = run_sweep(load_sweep(path), LocalExecutor([_fake_gpu(0), _fake_gpu(1), cpu]), store)
    assert outcome.planned == 6 and outcome.ok == 4 and outcome.failed == 0
    assert [r.spec.gpu for r, _ in outcome.unplaceable] == ["blackwell", "blackwell"]
    assert "needs gpu 'blackwell'; this host has gpu 0: Fake H200, gpu 1: Fake H200" in outcome.unplaceable[0][1]
    rows = store.read("SELECT gpu_requested, extra, created_at, finished_at FROM runs")
    given = sorted((r.gpu_requested, json.loads(r.extra)["cuda_visible_devices"]) for r in rows.itertuples())
    assert given == [("cpu", ""), ("cpu", ""), ("hopper", "0"), ("hopper", "1")]
    gpu_runs = rows[rows.gpu_requested == "hopper"]
    assert gpu_runs.created_at.max() < gpu_runs.finished_at.min()  # the two GPU runs overlapped in time
    cpu_runs = rows[rows.gpu_requested == "cpu"].sort_values("created_at")
    assert cpu_runs.finished_at.iloc[0] <= cpu_runs.created_at.iloc[1]  # the CPU runs went one at a time


def test_a_local_sweep_stores_failures_and_a_second_sweep_runs_only_what_is_not_finished(tmp_path, suite):
    path = write(tmp_path, f'suites = ["{suite}"]\n[defaults]\n{FAST}'
                           '[[variants]]\nbackend = "tests.tiny:TinyBackend"\n'
                           '[[variants]]\nbackend = "tests.tiny:CrashBackend"\n')
    store = Store(tmp_path / "r.duckdb")
    first = run_sweep(load_sweep(path), LocalExecutor(), store)
    assert (first.ok, first.failed, first.skipped) == (1, 1, 0)
    runs = store.read("SELECT status, failure, error, backend FROM runs ORDER BY backend")
    assert runs.status.tolist() == ["failed", "ok"] and runs.failure.iloc[0] == "crashed"
    assert "signal 6" in runs.error.iloc[0]
    assert store.read("SELECT count(*) AS n FROM answers").n.iloc[0] == 3
    second = run_sweep(load_sweep(path), LocalExecutor(), store)
    assert (second.skipped, second.ok, second.failed) == (1, 0, 1)  # the finished run is skipped; the crash reruns
    assert store.read("SELECT count(*) AS n FROM runs").n.iloc[0] == 3


@pytest.mark.slow
def test_a_missing_int4_variant_is_made_once_before_the_runs_that_need_it_and_then_reused(tmp_path, checkpoint,
                                                                                          suite):
    path = write(tmp_path, f'''quantize_missing = true
suites = ["{suite}"]
[quantize]
nsamples = 2
seqlen = 32
group_size = 32
[defaults]
{FAST}[[models]]
name = "tiny"
path = "{checkpoint}"
[[variants]]
backend = "int4"
[[variants]]
name = "int4 cold"
backend = "int4"
warmup = 0
''')
    store = Store(tmp_path / "r.duckdb")
    console = Console(record=True, width=200)
    first = run_sweep(load_sweep(path), LocalExecutor(), store, console=console)
    log = console.export_text()
    assert log.count("ready: the int4 variant of tiny") == 1, log  # made once for both variants
    assert (first.ok, first.failed) == (2, 0), log
    # Not a terminal (the bar is not drawn): each run says when it starts, before the line that it finished.
    starts = [line for line in log.splitlines() if line.startswith("▶ ") and " started (" in line]
    assert len(starts) == 2, log
    for line in starts:
        label = line[2:line.index(" started (")]
        assert log.index(line) < log.index(f"✓ {label} ("), log
    made = next((tmp_path / "variants").glob("tiny-int4-*"))
    assert (made / "quantbench_provenance.json").is_file() and (made / "config.json").is_file()
    rows = store.read("SELECT spec, weight_format FROM runs")
    assert {json.loads(s)["model"] for s in rows.spec} == {str(made)}
    assert all("int4" in w for w in rows.weight_format)
    again = Console(record=True, width=200)
    second = run_sweep(load_sweep(path), LocalExecutor(), store, console=again)
    assert second.skipped == 2 and second.run_ids == [] and "ready:" not in again.export_text()
