"""A hostile or odd suite file is one line naming its place and the fix, refused before any model loads; a run that
is stopped, times out or crashes keeps what was known of it (its suite, its model), so it lands in its table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quantbench.errors import ConfigError
from quantbench.protocol.suite import load_suite
from quantbench.run import checks
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {"a": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}}


def _record(rid: str, state: dict) -> str:
    return json.dumps({"id": rid, "benchmark": "b", "request": {"state": state, "questions": QUESTIONS}})


def _env() -> dict[str, str]:
    # the child (and a CLI run) imports test backends by path (tests.tiny:...): the repo root must be importable
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A real (tiny, random) checkpoint directory: config.json with a 512-token context, tokenizer.json."""
    from tests.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-moe")


def spec(backend: str, suite: Path, **kw) -> RunSpec:
    return RunSpec(backend=backend, suite=str(suite), gpu="cpu", warmup=0, latency_min_decisions=1,
                   latency_min_seconds=0.0, **kw)


def no_child(monkeypatch):
    """Fail the test if a child process is spawned: what is checked here is checked before one."""
    def refuse(*a, **k):
        raise AssertionError("a child was spawned: the suite should have been refused before")

    monkeypatch.setattr("quantbench.run.runner.subprocess.Popen", refuse)


# -- 1. nesting deeper than the parser ------------------------------------------------------------------------
def test_a_record_nested_100000_deep_is_one_line_naming_the_place_and_the_fix(tmp_path):
    path = tmp_path / "deep.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(_record("ok", {"obs": "fine"}) + "\n" + _record("deep", {"obs": 0}).replace("0}", deep + "}") + "\n")
    with pytest.raises(ConfigError) as e:
        load_suite(path)  # what `run --suite`, `run --backend http --suite` and `load --suite` all read through
    assert str(e.value) == f"{path}:2: record: JSON nests deeper than the parser allows; flatten the state"


def test_a_deep_suite_on_the_command_line_exits_2_with_that_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(_record("deep", {"obs": 0}).replace("0}", "[" * 100_000 + "]" * 100_000 + "}") + "\n")
    done = subprocess.run([sys.executable, "-m", "quantbench", "run", "--backend", "bf16", "--suite", str(path),
                           "--gpu", "cpu", "--db", str(tmp_path / "x.duckdb")], capture_output=True, text=True,
                          cwd=ROOT, env=_env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert "deep.jsonl:1: record: JSON nests deeper than the parser allows; flatten the state" in done.stderr


def test_a_nesting_the_parser_takes_still_loads(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_text(_record("n", {"obs": 0}).replace("0}", "[" * 500 + "]" * 500 + "}") + "\n")
    assert [r.id for r in load_suite(path).records] == ["n"]


# -- 3. bytes that are not UTF-8, a byte order mark -----------------------------------------------------------
def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path):
    path = tmp_path / "nonutf8.jsonl"
    first = _record("r1", {"obs": "fine"}).encode()
    second = _record("r2", {"obs": "caf#"}).encode().replace(b"#", b"\xfa")  # latin-1's é, alone
    path.write_bytes(first + b"\n" + second + b"\n")
    column = second.index(b"\xfa") + 1
    with pytest.raises(ConfigError) as e:
        load_suite(path)
    assert str(e.value) == (f"{path}:2: not UTF-8 text (byte 0xfa at column {column}, offset {len(first) + column} "
                            "in the file); save the suite as UTF-8")


def test_the_column_counts_characters_and_the_offset_bytes(tmp_path):
    path = tmp_path / "accents.jsonl"
    path.write_bytes('{"id": "éé", '.encode() + b"\xff}\n")  # 13 characters, 15 bytes before the bad one
    with pytest.raises(ConfigError, match=r"accents\.jsonl:1: not UTF-8 text \(byte 0xff at column 14, offset 15 "):
        load_suite(path)


def test_a_byte_order_mark_at_the_start_is_tolerated(tmp_path):
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    text = _record("r1", {"obs": "fine"}) + "\n" + _record("r2", {"obs": "more"}) + "\n"
    plain.write_text(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    with_bom = load_suite(bom)
    assert [r.id for r in with_bom.records] == ["r1", "r2"] and with_bom.lines == [1, 2]
    assert [r.request for r in with_bom.records] == [r.request for r in load_suite(plain).records]


# -- 2. a state far over the model's context, refused before any model loads ----------------------------------
def test_the_bound_is_the_servers():
    from quantbench.server import schema

    assert checks.STATE_PREFIX_CHARS_PER_TOKEN == schema.STATE_PREFIX_CHARS_PER_TOKEN
    assert checks.STATE_PREFIX_MARGIN_TOKENS == schema.STATE_PREFIX_MARGIN_TOKENS


def test_the_context_limit_is_read_as_the_engine_reads_it():
    assert checks.context_limit({"max_position_embeddings": 1024}, None) == 1024
    assert checks.context_limit({"max_position_embeddings": 1024}, 300) == 300
    assert checks.context_limit({"text_config": {"max_position_embeddings": 1024}}, None) == 1024  # omni fixture
    assert checks.context_limit({"thinker_config": {"text_config": {"max_position_embeddings": 65536}}}, 4096) == 4096
    assert checks.context_limit({}, None) is None and checks.context_limit({}, 64) == 64


def _long_suite(tmp_path: Path, chars: int) -> Path:
    path = tmp_path / "big.jsonl"
    state = {"obs": ("word " * (chars // 5)).strip()}
    path.write_text(_record("small", {"obs": "a wall"}) + "\n\n" + _record("big", state) + "\n")
    return path


def test_a_10_mb_state_is_refused_in_the_parent_naming_state_and_the_fix(tmp_path, checkpoint, monkeypatch):
    no_child(monkeypatch)
    suite = _long_suite(tmp_path, 10_000_000)
    with pytest.raises(ConfigError) as e:
        execute(spec("tests.tiny:TinyBackend", suite, model=str(checkpoint)), echo=False)
    message = str(e.value)
    assert message.startswith(f"{suite}:3: state: record 'big' has a state of ")
    assert "over the model's context of 512 tokens" in message
    assert message.endswith("shorten the state, or pass --truncate to cut it to fit (each answer records that it "
                            "was cut)")


def test_max_tokens_is_the_limit_it_names(tmp_path, checkpoint, monkeypatch):
    no_child(monkeypatch)
    suite = _long_suite(tmp_path, 40_000)
    with pytest.raises(ConfigError, match="over --max-tokens 100; shorten the state"):
        execute(spec("tests.tiny:TinyBackend", suite, model=str(checkpoint), max_tokens=100), echo=False)


def test_a_normal_suite_tokenizes_nothing_in_the_parent(tmp_path, checkpoint, monkeypatch):
    import tokenizers

    def refuse(*a, **k):
        raise AssertionError("a state shorter than the bound was tokenized")

    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", refuse)
    suite = tmp_path / "normal.jsonl"
    suite.write_text(_record("r1", {"obs": "word " * 1000}) + "\n")
    checks.check_state_lengths(load_suite(suite), spec("tests.tiny:TinyBackend", suite), str(checkpoint))


def test_what_is_not_checked_in_the_parent(tmp_path, checkpoint):
    suite = load_suite(_long_suite(tmp_path, 100_000))
    for kw in ({"truncate": True}, {"backend": "http", "endpoint": "http://127.0.0.1:9"}):  # cut / the server's to bound
        checks.check_state_lengths(suite, spec(kw.pop("backend", "bf16"), tmp_path / "big.jsonl", **kw),
                                   str(checkpoint))
    checks.check_state_lengths(suite, spec("bf16", tmp_path / "big.jsonl", limit=1), str(checkpoint))  # not run
    with pytest.raises(ConfigError, match=":3: state: record 'big'"):
        checks.check_state_lengths(suite, spec("bf16", tmp_path / "big.jsonl"), str(checkpoint))


def test_with_truncate_a_long_state_still_runs_cut(tmp_path, checkpoint):
    suite = _long_suite(tmp_path, 20_000)
    result = execute(spec("tests.suite_fault_backends:SpecEngineBackend", suite, model=str(checkpoint),
                          truncate=True), echo=False)
    assert result.run.status == "ok", result.run.error
    assert {(a.record_id, a.truncated) for a in result.answers} == {("small", False), ("big", True)}


# -- 4. a run that ends without its child's result keeps what the parent knew ---------------------------------
def _mini_suite(tmp_path: Path) -> Path:
    path = tmp_path / "mini.jsonl"
    path.write_text("\n".join(_record(f"r{i}", {"obs": f"wall {i}"}) for i in range(3)) + "\n")
    return path


def _identity(checkpoint: Path) -> dict:
    from quantbench.models.checkpoint import model_identity

    ident = model_identity(checkpoint)
    return {k: ident[k] for k in ("model_id", "model_hash", "model_path")}


@pytest.mark.parametrize("backend, failure, timeout_s", [
    ("tests.tiny:HangBackend", "timeout", 4.0),  # killed by the parent before its model loaded
    ("tests.tiny:CrashBackend", "crashed", 300.0),  # died by SIGABRT with no result
])
def test_a_run_that_ended_without_its_childs_result_keeps_its_suite_and_model(tmp_path, checkpoint, backend, failure,
                                                                              timeout_s):
    suite = _mini_suite(tmp_path)
    result = execute(spec(backend, suite, model=str(checkpoint), timeout_s=timeout_s), echo=False)
    run = result.run
    assert (run.status, run.failure) == ("failed", failure)
    loaded = load_suite(suite)
    assert (run.suite_id, run.suite_hash, run.n_records, run.n_questions) == ("mini", loaded.hash, 3, 3)
    assert {k: getattr(run, k) for k in ("model_id", "model_hash", "model_path")} == _identity(checkpoint)
    assert run.weights == "checkpoint"


def test_a_load_error_the_child_reports_keeps_the_model_it_was_loading(tmp_path, checkpoint):
    """The child said why its model did not load (load_error) but not which model: the row names the model the
    parent gave it, so it lands in that model's table as failed instead of among the runs of no model."""
    result = execute(spec("tests.tiny:LoadErrorBackend", _mini_suite(tmp_path), model=str(checkpoint)), echo=False)
    run = result.run
    assert (run.status, run.failure) == ("failed", "load_error") and "missing key" in run.error
    assert {k: getattr(run, k) for k in ("model_id", "model_hash", "model_path")} == _identity(checkpoint)
    assert run.suite_id == "mini" and run.variant is None  # what only a loaded model says stays unsaid
    Store(tmp_path / "r.duckdb").write_run(result)
    assert Store(tmp_path / "r.duckdb").read("SELECT model_id FROM runs")["model_id"].tolist() == [run.model_id]


def _cli_run_stopped_by_sigterm(tmp_path: Path, backend: str, *args: str) -> tuple[dict, str]:
    """`quantbench run` of `backend` (it writes its pid to $QUANTBENCH_TEST_PIDFILE, then hangs), stopped with
    SIGTERM as `timeout` stops it; the stored row and what the command printed."""
    import time

    pidfile, db = tmp_path / "child.pid", tmp_path / "r.duckdb"
    env = {**_env(), "QUANTBENCH_TEST_PIDFILE": str(pidfile)}
    parent = subprocess.Popen([sys.executable, "-m", "quantbench", "run", "--backend", backend, "--suite",
                               str(_mini_suite(tmp_path)), "--gpu", "cpu", "--db", str(db), *args], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 120
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < end and parent.poll() is None:
            time.sleep(0.1)
        assert pidfile.exists(), parent.communicate(timeout=5)[0]
        parent.send_signal(signal.SIGTERM)
        output = parent.communicate(timeout=60)[0].decode()
    finally:
        if parent.poll() is None:
            parent.kill()
        if pidfile.exists() and pidfile.read_text():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert parent.returncode == 143, output
    rows = Store(db).read("SELECT * FROM runs").to_dict("records")
    assert len(rows) == 1
    return rows[0], output


def test_a_run_stopped_while_loading_keeps_its_suite_and_model(tmp_path, checkpoint):
    row, _ = _cli_run_stopped_by_sigterm(tmp_path, "tests.tiny:PidHangBackend", "--model", str(checkpoint))
    assert (row["status"], row["failure"]) == ("failed", "interrupted")
    assert row["suite_id"] == "mini" and row["suite_hash"] == load_suite(tmp_path / "mini.jsonl").hash
    assert {k: row[k] for k in ("model_id", "model_hash", "model_path")} == _identity(checkpoint)


def test_a_run_stopped_mid_suite_keeps_its_variant_too(tmp_path):
    row, _ = _cli_run_stopped_by_sigterm(tmp_path, "tests.suite_fault_backends:HangInForwardBackend")
    assert (row["status"], row["failure"]) == ("failed", "interrupted")
    assert row["suite_id"] == "mini" and row["n_records"] == 3
    # what the child saved once its model loaded: the variant and the kernel it planned
    assert (row["model_id"], row["variant"], row["kernel_path"]) == ("tiny-test", "tiny", "transformers grouped_mm")


def test_a_synthetic_shapes_model_id_is_the_backends():
    from quantbench.models.families import synthetic_shapes
    from quantbench.models.synthetic import synthetic_id
    from quantbench.run.runner import _model_columns

    shape = sorted(synthetic_shapes())[0]
    for layers in (None, 2):
        got = _model_columns(RunSpec(backend="bf16", shape=shape, layers=layers, seed=3, gpu="cpu"))
        assert got["model_id"] == synthetic_id(shape, layers, 3) and got["model_hash"] == "seed:3"
    assert _model_columns(RunSpec(backend="http", endpoint="http://127.0.0.1:9", gpu="cpu")) == {}
