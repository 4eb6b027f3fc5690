"""Every run happens in a fresh child process and ends as a whole row: ok with every answer, or failed with why."""

import json
import os
from pathlib import Path

import pytest

from quantbench.backend import RunSpec
from quantbench.errors import GpuMismatchError
from quantbench.runner import execute
from quantbench.store import Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    # The child imports test backends by path (tests.tiny:...): make the repo root importable there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "mini.jsonl"
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


def test_a_run_answers_every_question_and_times_every_decision(tmp_path, suite):
    result = execute(spec("TinyBackend", suite), echo=False)
    assert result.run["status"] == "ok", result.run.get("error")
    assert len(result.answers) == 6  # 4 single-question records + one with two questions
    phases = [lat["phase"] for lat in result.latencies]
    assert phases.count("suite") == 5 and phases.count("latency") == 3  # at least 8 timed decisions in all
    run = result.run
    assert run["variant"] == "tiny" and run["n_records"] == 5 and run["n_questions"] == 6
    assert run["load_s"] > 0 and run["cold_ms"] > 0 and run["host_rss_peak_bytes"] > 0
    assert run["mem_weights_bytes"] is None and run["mem_nvml_peak_bytes"] is None  # CPU: NULL, not 0
    assert run["model_tensor_bytes"] > 0 and run["torch_version"] and run["spec_hash"]
    Store(tmp_path / "r.duckdb").write_run(result)


@pytest.mark.parametrize("backend, failure, words", [
    ("CrashBackend", "crashed", "signal 6"),
    ("RaiseBackend", "crashed", "kernel exploded on purpose"),
    ("LoadErrorBackend", "load_error", "missing key"),
])
def test_a_failing_child_leaves_a_failed_row_and_no_answers(tmp_path, suite, backend, failure, words):
    result = execute(spec(backend, suite), echo=False)
    assert result.run["status"] == "failed"
    assert result.run["failure"] == failure
    assert words in result.run["error"]
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
    assert result.run["status"] == "failed" and result.run["failure"] == "timeout"
    assert "timeout of 3 s" in result.run["error"]


def test_a_gpu_mismatch_is_refused_before_anything_runs(suite):
    from quantbench.machine import detect

    if detect().has_gpu:
        pytest.skip("this test needs a CPU-only host")
    with pytest.raises(GpuMismatchError):
        execute(RunSpec(backend="tests.tiny:TinyBackend", suite=suite, gpu="blackwell"), echo=False)


def test_an_api_key_is_never_stored(suite):
    result = execute(spec("TinyBackend", suite, api_key="s3cret", limit=1), echo=False)
    assert result.run["spec"]["api_key"] == "***"
    assert "s3cret" not in str(result.run)


def test_throughput_mode_batches_decisions_into_one_forward(suite):
    result = execute(spec("TinyBackend", suite, concurrency=2), echo=False)
    assert result.run["status"] == "ok", result.run.get("error")
    suite_rows = [lat for lat in result.latencies if lat["phase"] == "suite"]
    assert [lat["batch"] for lat in suite_rows] == [2, 2, 2, 2, 1]  # 5 records, two at a time
    assert len(result.answers) == 6
    single = execute(spec("TinyBackend", suite), echo=False)
    probs = {(a["record_id"], a["question"]): a["probs"] for a in single.answers}
    for a in result.answers:  # batching changes no answer
        assert a["probs"] == pytest.approx(probs[(a["record_id"], a["question"])], abs=1e-4)


def test_tokenizer_hash_is_the_sha256_of_the_token_ids_the_model_was_given(suite):
    import hashlib

    from quantbench.scoring import TransformersEngine
    from quantbench.suite import load_suite
    from tests.tiny import tiny_model, tiny_tokenizer

    engine = TransformersEngine(tiny_model(), tiny_tokenizer())
    digest = hashlib.sha256()
    for record in load_suite(suite).records:
        digest.update(json.dumps([record.id, engine.prepare(record.request).rows], separators=(",", ":")).encode())
    single = execute(spec("TinyBackend", suite), echo=False)
    batched = execute(spec("TinyBackend", suite, concurrency=2), echo=False)
    assert single.run["tokenizer_hash"] == batched.run["tokenizer_hash"] == digest.hexdigest()  # batching: same inputs
