"""Every run happens in a fresh child process and ends as a whole row: ok with every answer, or failed with why."""

import json
import os
from pathlib import Path

import pytest

from quantbench.errors import GpuMismatchError
from quantbench.run.record import RunResult
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store

ROOT = Path(__file__).resolve().parent.parent


def _importable_tests(monkeypatch):
    # The child imports test backends by path (tests.tiny:...): make the repo root importable there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    _importable_tests(monkeypatch)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """Read only: one file for the module, so the runs below can be shared."""
    path = tmp_path_factory.mktemp("suite") / "mini.jsonl"
    records = [
        {"id": f"r{i}", "benchmark": "mini", "gold": {"q": "yes" if i % 2 else "no"},
         "request": {"state": {"observation": f"wall {i}"}, "questions": {"q": {"type": "boolean"}}}}
        for i in range(4)
    ] + [{"id": "multi", "benchmark": "mini2", "request": {"state": {"x": "left"}, "questions": {
        "a": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}, "b": {"type": "boolean"}}}}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def spec(backend, suite, **kw):
    return RunSpec(backend=f"tests.tiny:{backend}", suite=suite, gpu="cpu", warmup=1, latency_min_decisions=8,
                   latency_min_seconds=0.0, **kw)


@pytest.fixture(scope="module")
def tiny_runs(suite) -> dict[int, RunResult]:
    """The TinyBackend run of `suite` one record at a time (1) and two at a time (2), each made once for the
    module: three tests read the first and two the second (a child costs seconds, mostly importing torch and
    transformers). A test reads a result and never changes it."""
    with pytest.MonkeyPatch.context() as mp:
        _importable_tests(mp)
        return {1: execute(spec("TinyBackend", suite), echo=False),
                2: execute(spec("TinyBackend", suite, concurrency=2), echo=False)}


def test_a_run_answers_every_question_and_times_every_decision(tmp_path, suite, tiny_runs):
    from tests.tiny import answers_in_process

    result = tiny_runs[1]
    assert result.run.status == "ok", result.run.error
    expected = answers_in_process(suite)  # 4 single-question records + one with two questions
    assert sorted((a.record_id, a.question) for a in result.answers) == sorted(expected)
    phases = [lat.phase for lat in result.latencies]
    assert phases.count("suite") == 5 and phases.count("latency") == 3  # at least 8 timed decisions in all
    assert [lat.record_id for lat in result.latencies] == ["r0", "r1", "r2", "r3", "multi", "r0", "r1", "r2"]
    run = result.run
    assert run.variant == "tiny" and run.n_records == 5 and run.n_questions == 6
    assert run.load_s > 0 and run.cold_ms > 0 and run.host_rss_peak_bytes > 0
    assert run.mem_weights_bytes is None and run.mem_nvml_peak_bytes is None  # CPU: NULL, not 0
    assert run.model_tensor_bytes > 0 and run.torch_version and run.spec_hash

    # Stored and read back, every answer has the values the model gives in this process.
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(result)
    stored = store.read("SELECT * FROM answers WHERE run_id = ? ORDER BY record_id, question", [rid])
    assert len(stored) == len(expected)
    for row in stored.to_dict("records"):
        row["gold"] = row["gold"] if isinstance(row["gold"], str) else None  # NULL reads back as None or NaN
        want = expected[(row["record_id"], row["question"])]
        assert list(row["probs"]) == pytest.approx(want["probs"], abs=1e-6)
        assert ({k: row[k] for k in ("benchmark", "top", "gold", "method", "truncated")}
                == {k: want[k] for k in ("benchmark", "top", "gold", "method", "truncated")})
        assert list(row["options"]) == want["options"]
    back = store.read("SELECT variant, n_questions, kernel_path, tokenizer_hash FROM runs WHERE run_id = ?", [rid])
    assert back.to_dict("records") == [{"variant": "tiny", "n_questions": 6, "kernel_path": "transformers grouped_mm",
                                        "tokenizer_hash": run.tokenizer_hash}]
    assert store.read("SELECT count(*) AS n FROM latencies WHERE run_id = ?", [rid]).n.tolist() == [8]


def test_the_engine_features_it_declares_make_the_kernel_path(suite):
    result = execute(spec("ReportingBackend", suite), echo=False)
    assert result.run.status == "ok", result.run.error
    assert result.run.kernel_path == "transformers grouped_mm +fused rmsnorm+rope +cuda-graph (partly eager)"
    assert result.run.extra["fused_ops"] == "rmsnorm+rope"
    # warmed before every decision but the cold one: 1 warmup, 5 suite records, 3 latency decisions
    assert result.run.extra["cuda_graph"] == {"replays": 7, "eager_calls": 2, "warmed": 9}


@pytest.mark.parametrize("backend, failure, words", [
    ("CrashBackend", "crashed", "signal 6"),
    ("RaiseBackend", "crashed", "kernel exploded on purpose"),
    ("LoadErrorBackend", "load_error", "missing key"),
])
def test_a_failing_child_leaves_a_failed_row_and_no_answers(tmp_path, suite, backend, failure, words):
    result = execute(spec(backend, suite), echo=False)
    assert result.run.status == "failed"
    assert result.run.failure == failure
    assert words in result.run.error
    assert result.answers == [] and result.latencies == []
    store = Store(tmp_path / "r.duckdb")
    store.write_run(result)
    ok = execute(spec("TinyBackend", suite), echo=False)
    store.write_run(ok)
    runs = store.read("SELECT status, failure FROM runs ORDER BY created_at")
    assert runs.status.tolist() == ["failed", "ok"]
    counts = store.read("SELECT run_id, count(*) AS n FROM answers GROUP BY run_id")
    assert counts.n.tolist() == [6]  # the failed run has no answers; the store stays consistent


def test_a_child_past_its_timeout_is_killed_and_recorded(suite):
    result = execute(spec("HangBackend", suite, timeout_s=3), echo=False)
    assert result.run.status == "failed" and result.run.failure == "timeout"
    assert "timeout of 3 s" in result.run.error


def test_a_gpu_mismatch_is_refused_before_anything_runs(suite):
    from quantbench.run.machine import detect

    if detect().has_gpu:
        pytest.skip("this test needs a CPU-only host")
    with pytest.raises(GpuMismatchError):
        execute(RunSpec(backend="tests.tiny:TinyBackend", suite=suite, gpu="blackwell"), echo=False)


def test_an_api_key_is_never_stored(suite):
    result = execute(spec("KeyedTinyBackend", suite, api_key="s3cret", limit=1), echo=False)
    assert result.run.spec["api_key"] == "***"
    assert "s3cret" not in str(result.run)


def test_throughput_mode_batches_decisions_into_one_forward(tiny_runs):
    result = tiny_runs[2]
    assert result.run.status == "ok", result.run.error
    suite_rows = [lat for lat in result.latencies if lat.phase == "suite"]
    assert [lat.batch for lat in suite_rows] == [2, 2, 2, 2, 1]  # 5 records, two at a time
    assert len(result.answers) == 6
    single = tiny_runs[1]
    probs = {(a.record_id, a.question): a.probs for a in single.answers}
    for a in result.answers:  # batching changes no answer
        assert a.probs == pytest.approx(probs[(a.record_id, a.question)], abs=1e-4)


def test_tokenizer_hash_is_the_sha256_of_the_token_ids_the_model_was_given(suite, tiny_runs):
    import hashlib

    from quantbench.engine.scoring import TransformersEngine
    from quantbench.protocol.suite import load_suite
    from tests.tiny import tiny_model, tiny_tokenizer

    engine = TransformersEngine(tiny_model(), tiny_tokenizer())
    digest = hashlib.sha256()
    for record in load_suite(suite).records:
        digest.update(json.dumps([record.id, engine.prepare(record.request).rows], separators=(",", ":")).encode())
    single, batched = tiny_runs[1], tiny_runs[2]
    assert single.run.tokenizer_hash == batched.run.tokenizer_hash == digest.hexdigest()  # batching: same inputs


# -- the child dies with its parent; a stopped parent stores `failed: interrupted` ------------------------------
def _alive(pid: int) -> bool:
    try:  # a zombie waiting for a reaper is dead: it computes nothing and holds no memory
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_for(check, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _start_cli_run(tmp_path, suite):
    """A real `quantbench run` whose child hangs after writing its pid; returns (parent, child pid, db)."""
    import subprocess
    import sys

    pidfile, db = tmp_path / "child.pid", tmp_path / "r.duckdb"
    env = {**os.environ, "QUANTBENCH_TEST_PIDFILE": str(pidfile)}
    parent = subprocess.Popen([sys.executable, "-m", "quantbench", "run", "--backend", "tests.tiny:PidHangBackend",
                               "--suite", suite, "--gpu", "cpu", "--db", str(db)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text(), 120), parent.communicate(timeout=5)[0]
    return parent, int(pidfile.read_text()), db


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_parent_takes_its_child_with_it(tmp_path, suite, sig):
    import signal
    import tempfile

    parent, child, db = _start_cli_run(tmp_path, suite)
    try:
        run_dirs = list(Path(tempfile.gettempdir()).glob(f"quantbench-run-{parent.pid}-*"))
        parent.send_signal(getattr(signal, sig))
        output = parent.communicate(timeout=60)[0].decode()
        assert _wait_for(lambda: not _alive(child), 10), f"the child {child} outlived its parent ({sig})"
    finally:  # never leave either hanging for an hour
        for pid in (child, parent.pid):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert len(run_dirs) == 1  # the run's folder is named after its parent
    if sig == "SIGTERM":  # the parent winds up: the run stored as interrupted, its folder removed, exit 128+15
        assert parent.returncode == 143, output
        runs = Store(db).read("SELECT status, failure, error FROM runs")
        assert runs[["status", "failure"]].values.tolist() == [["failed", "interrupted"]]
        assert "told to stop (SIGTERM)" in runs.error.iloc[0] and "interrupted" in output
        assert not run_dirs[0].exists()
    else:  # nothing could clean up; the next run removes the dead parent's folder
        from quantbench.run.runner import _clear_orphaned_tmp

        assert parent.returncode == -9 and run_dirs[0].exists()
        _clear_orphaned_tmp()
        assert not run_dirs[0].exists()


def test_a_child_whose_parent_is_not_the_pid_it_was_told_exits_at_once(tmp_path):
    # The parent may die while its child is still importing, before PR_SET_PDEATHSIG is set: the child then has
    # another parent (init, a subreaper) and must not run a benchmark nobody will store. Started by this process
    # but told another parent's pid, it leaves before anything else: no traceback, not even its faulthandler file.
    import subprocess
    import sys

    spec_path, result = tmp_path / "spec.json", tmp_path / "result.json"
    env = {**os.environ, "QUANTBENCH_PARENT_PID": str(os.getpid() + 1)}  # not this process: the child's parent
    done = subprocess.run([sys.executable, "-m", "quantbench.run.child", str(spec_path), str(result)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert not result.with_suffix(".faulthandler").exists() and not result.exists()


# -- failure labels: oom only with evidence -------------------------------------------------------------------
def _execute_and_kill_child(tmp_path, suite, monkeypatch):
    import signal
    import threading

    pidfile = tmp_path / "child.pid"
    monkeypatch.setenv("QUANTBENCH_TEST_PIDFILE", str(pidfile))
    results = []
    worker = threading.Thread(target=lambda: results.append(execute(spec("PidHangBackend", suite), echo=False)))
    worker.start()
    assert _wait_for(lambda: pidfile.exists() and pidfile.read_text(), 120)
    os.kill(int(pidfile.read_text()), signal.SIGKILL)  # from outside, as a user or a scheduler would
    worker.join(60)
    return results[0].run


def test_an_outside_sigkill_is_labelled_killed_not_oom(tmp_path, suite, monkeypatch):
    import quantbench.run.runner as runner

    monkeypatch.setattr(runner, "oom_kill_count", lambda: 0)  # the cgroup's counter, unchanged
    run = _execute_and_kill_child(tmp_path, suite, monkeypatch)
    assert (run.status, run.failure) == ("failed", "killed")
    assert "signal 9 (SIGKILL) from outside quantbench; no OOM kill was recorded" in run.error


def test_a_sigkill_with_an_oom_kill_recorded_in_the_cgroup_is_labelled_oom(tmp_path, suite, monkeypatch):
    # The kernel's OOM killer sends SIGKILL and counts it in the cgroup's memory.events; the counter is faked here
    # (an OOM kill for real would hit every process of this machine's cgroup).
    import itertools

    import quantbench.run.runner as runner

    counts = itertools.count(3)
    monkeypatch.setattr(runner, "oom_kill_count", lambda: next(counts))
    run = _execute_and_kill_child(tmp_path, suite, monkeypatch)
    assert run.failure == "oom"
    assert "by the kernel's OOM killer (the memory cgroup's oom_kill count went 3 → 4)" in run.error


def test_an_unreadable_oom_counter_is_no_evidence(tmp_path, suite, monkeypatch):
    import quantbench.run.runner as runner

    monkeypatch.setattr(runner, "oom_kill_count", lambda: None)
    assert _execute_and_kill_child(tmp_path, suite, monkeypatch).failure == "killed"


def test_a_child_that_runs_out_of_memory_is_labelled_oom(suite):
    result = execute(spec("OutOfMemoryBackend", suite), echo=False)
    assert result.run.failure == "oom"
    assert "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes" in result.run.error


def test_what_this_machine_cannot_run_is_labelled_unsupported(tmp_path, suite):
    # A real backend on a real checkpoint: quantbench's grouped-MoE engine refuses MoE blocks with shared experts.
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from tests.tiny import tiny_tokenizer

    cfg = Qwen2MoeConfig(vocab_size=600, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, num_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    Qwen2MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "shared")
    tiny_tokenizer().save_pretrained(tmp_path / "shared")
    result = execute(RunSpec(backend="bf16", model=str(tmp_path / "shared"), suite=suite, gpu="cpu",
                             experts_impl="quantbench", limit=1), echo=False)
    assert result.run.failure == "unsupported"
    assert "mlp.shared_expert: MoE blocks with shared experts are not supported" in result.run.error


def test_a_bad_setting_found_in_the_child_is_labelled_config_error(tmp_path, suite):
    from tests.tiny import save_tiny

    result = execute(RunSpec(backend="bf16", model=str(save_tiny(tmp_path / "m")), suite=suite, gpu="cpu",
                             dtype="float8", limit=1), echo=False)
    assert result.run.failure == "config_error"
    assert "--dtype 'float8': use one of bfloat16, float16, float32" in result.run.error


def test_classify_names_out_of_memory_only_with_evidence():
    import torch

    from quantbench.errors import ConfigError, LoadError, UnsupportedError, classify

    assert classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert classify(MemoryError()) == "oom"
    wrapped = LoadError("checkpoint")
    wrapped.__cause__ = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes")
    assert classify(wrapped) == "oom"
    assert classify(LoadError("x.safetensors: truncated")) == "load_error"
    assert classify(ConfigError("--dtype")) == "config_error"
    assert classify(UnsupportedError("cuda only")) == "unsupported"
    assert classify(RuntimeError("index out of range")) == "crashed"


# -- mistakes caught in the parent, before anything is spawned ----------------------------------------------------
def _truncated_checkpoint(tmp_path):
    from tests.tiny import save_tiny

    path = save_tiny(tmp_path / "cut")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted copy
    return path


@pytest.mark.parametrize("case, words", [
    ("no model", "--model {tmp}/nonexistent: no such directory; give a checkpoint directory"),
    ("truncated", "{tmp}/cut/model.safetensors: truncated: "),
    ("bad config", "{tmp}/badcfg/config.json: not valid JSON"),
    ("malformed suite line", "bad.jsonl:2: record: not valid JSON"),
    ("record without request", "norequest.jsonl:1: request"),
])
def test_mistakes_are_refused_in_the_parent_in_a_second_storing_nothing(tmp_path, suite, case, words):
    import time

    from typer.testing import CliRunner

    from quantbench.cli import app
    from tests.tiny import save_tiny

    args = ["run", "--backend", "bf16", "--gpu", "cpu", "--suite", suite]
    if case == "no model":
        args += ["--model", str(tmp_path / "nonexistent")]
    elif case == "truncated":
        args += ["--model", str(_truncated_checkpoint(tmp_path))]
    elif case == "bad config":
        path = save_tiny(tmp_path / "badcfg")
        (path / "config.json").write_text('{"model_type": "qwen3_moe",')
        args += ["--model", str(path)]
    elif case == "malformed suite line":
        lines = Path(suite).read_text().splitlines()
        (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], lines[1][:-7], *lines[2:]]) + "\n")
        args += ["--suite", str(tmp_path / "bad.jsonl")]
    else:
        record = json.loads(Path(suite).read_text().splitlines()[0])
        del record["request"]
        (tmp_path / "norequest.jsonl").write_text(json.dumps(record) + "\n")
        args += ["--suite", str(tmp_path / "norequest.jsonl")]
    db = tmp_path / "r.duckdb"
    t0 = time.perf_counter()
    result = CliRunner().invoke(app, [*args, "--db", str(db)])
    seconds = time.perf_counter() - t0
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert words.format(tmp=tmp_path) in " ".join(result.output.split())
    assert not db.exists()  # nothing stored: the shared store gets no row for a typo
    assert seconds < 5  # no child, no torch import: well under the 9-15 s a spawned child took


def test_an_auto_map_that_is_not_followed_is_said_once_and_recorded(tmp_path, suite, capsys):
    from tests.tiny import save_tiny

    path = save_tiny(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomMoeForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (path / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")  # proof its code never ran
    result = execute(RunSpec(backend="bf16", model=str(path), suite=suite, gpu="cpu", limit=1, warmup=0,
                             latency_min_decisions=1, latency_min_seconds=0.0), echo=False)
    assert result.run.status == "ok", result.run.error
    warnings = [line for line in capsys.readouterr().err.splitlines() if "auto_map" in line]
    assert warnings == [f"warning: {path / 'config.json'} names its own code (auto_map) but --trust-remote-code is "
                        "off: loading transformers' built-in Qwen3MoeForCausalLM instead (recorded on the run)"]
    assert not marker.exists()
    store = Store(tmp_path / "r.duckdb")
    store.write_run(result)
    extra = json.loads(store.read("SELECT extra FROM runs").extra.iloc[0])
    assert extra["auto_map_ignored"] == {"auto_map": config["auto_map"], "loaded": "Qwen3MoeForCausalLM"}


def test_a_stopped_sweep_stores_its_run_in_flight_as_interrupted_and_starts_no_other(tmp_path, suite):
    import signal
    import subprocess
    import sys

    sweep, pidfile, db = tmp_path / "sweep.toml", tmp_path / "child.pid", tmp_path / "r.duckdb"
    sweep.write_text(f'suites = ["{suite}"]\ngpus = ["cpu"]\n[defaults]\nwarmup = 0\n'
                     '[[variants]]\nbackend = "tests.tiny:PidHangBackend"\n'
                     '[[variants]]\nbackend = "tests.tiny:TinyBackend"\n')
    parent = subprocess.Popen([sys.executable, "-m", "quantbench", "sweep", str(sweep), "--db", str(db)],
                              env={**os.environ, "QUANTBENCH_TEST_PIDFILE": str(pidfile)}, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert _wait_for(lambda: pidfile.exists() and pidfile.read_text(), 120), parent.communicate(timeout=5)[0]
        child = int(pidfile.read_text())
        parent.send_signal(signal.SIGTERM)
        output = parent.communicate(timeout=60)[0].decode()
        assert _wait_for(lambda: not _alive(child), 10)
    finally:
        for pid in [parent.pid] + ([child] if pidfile.exists() else []):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert parent.returncode == 143, output
    runs = Store(db).read("SELECT backend, status, failure FROM runs")
    assert runs.values.tolist() == [["tests.tiny:PidHangBackend", "failed", "interrupted"]]  # TinyBackend never ran


def test_a_sweep_run_refused_before_its_child_is_labelled_and_names_the_file(tmp_path, suite):
    from quantbench.sweep import LocalExecutor, load_sweep, run_sweep

    cut = _truncated_checkpoint(tmp_path)
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'suites = ["{suite}"]\ngpus = ["cpu"]\n[[models]]\nname = "cut"\npath = "{cut}"\n'
                     '[[variants]]\nbackend = "bf16"\n')
    store = Store(tmp_path / "r.duckdb")
    outcome = run_sweep(load_sweep(sweep), LocalExecutor(), store)
    assert (outcome.ok, outcome.failed) == (0, 1)
    row = store.read("SELECT failure, error FROM runs")
    assert row.failure.tolist() == ["load_error"]
    assert f"{cut}/model.safetensors: truncated: " in row.error.iloc[0] and "copy or download it again" in row.error.iloc[0]


def test_a_model_answering_nan_probabilities_fails_naming_the_record_not_an_ok_run(suite):
    # before: stored `ok`, every probability NULL and the first option as the top answer
    result = execute(RunSpec(backend="tests.failing_backends:NanWeightsBackend", suite=suite, gpu="cpu", warmup=1,
                             latency_min_decisions=8, latency_min_seconds=0.0), echo=False)
    assert result.run.status == "failed" and result.answers == []
    assert "record r0: question 'q': the model answered non-finite probabilities (yes=nan" in result.run.error
    assert "check the checkpoint" in result.run.error
