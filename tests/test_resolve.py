"""The parent prepares, the child measures: `resolve` builds the embedded model or its cached variant before the
child is spawned, so the stored load_s times loading alone, and a backend's load() refuses a spec with no model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import quantbench.make.fixture
import quantbench.make.quantize
from quantbench.errors import ConfigError, LoadError
from quantbench.run.backend import EMBEDDED_MODEL, get_backend, model_dir
from quantbench.run.machine import detect
from quantbench.run.record import VariantInfo
from quantbench.run.resolve import resolve
from quantbench.run.runner import execute, spec_hash
from quantbench.run.spec import RunSpec
from tests.tiny import TinyBackend

ROOT = Path(__file__).resolve().parent.parent
PREPARE_S = 1.0  # how long the stand-in preparing takes in the parent


class PreparedBackend(TinyBackend):
    """A test backend that, like bf16, runs the embedded model when the spec names none; it loads only what the
    parent prepared and records which directory that was."""

    default_model = EMBEDDED_MODEL

    def load(self, spec, machine):
        path = model_dir(spec)
        loaded = super().load(spec, machine)
        # when load() ended, on the wall clock: with load_s it says when the child's load window opened
        loaded.info = VariantInfo(**{**vars(loaded.info), "model_path": str(path),
                                     "extra": {"load_ended": time.time()}})
        return loaded


@pytest.fixture
def suite(tmp_path) -> str:
    path = tmp_path / "mini.jsonl"
    records = [{"id": f"r{i}", "benchmark": "mini", "gold": {"q": "yes" if i % 2 else "no"},
                "request": {"state": {"observation": f"wall {i}"}, "questions": {"q": {"type": "boolean"}}}}
               for i in range(2)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    # The child imports the test backend by path (tests.test_resolve:...): make the repo root importable there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def test_resolve_names_the_embedded_model_or_its_variant_and_leaves_the_requested_spec_alone(tmp_path, monkeypatch):
    made: list[str] = []
    monkeypatch.setattr(quantbench.make.fixture, "default_model_dir", lambda: tmp_path / "fixture")
    monkeypatch.setattr(quantbench.make.quantize, "default_variant",
                        lambda scheme: made.append(scheme) or tmp_path / f"variant-{scheme}")
    requested = RunSpec(backend="bf16")
    assert resolve(requested).model == str(tmp_path / "fixture")
    assert requested.model is None  # the stored spec and its hash come from this one
    assert [resolve(RunSpec(backend=b)).model for b in ("int4", "nvfp4", "fp8")] == [
        str(tmp_path / "variant-int4"), str(tmp_path / "variant-nvfp4"), str(tmp_path / "variant-fp8")]
    assert made == ["int4", "nvfp4", "fp8"]
    for untouched in (RunSpec(backend="int4", model="/given"), RunSpec(backend="nvfp4", shape="qwen3-30b-a3b"),
                      RunSpec(backend="http", endpoint="http://127.0.0.1:1")):
        assert resolve(untouched) is untouched
    assert made == ["int4", "nvfp4", "fp8"]


def test_the_parent_prepares_and_the_childs_load_s_times_loading_alone(tmp_path, suite, monkeypatch):
    prepared = tmp_path / "prepared-model"
    prepared.mkdir()

    prepared_at: list[tuple[float, int]] = []

    def slow_prepare() -> Path:  # stands in for training the fixture on a cold cache
        time.sleep(PREPARE_S)
        prepared_at.append((time.time(), os.getpid()))
        return prepared

    monkeypatch.setattr(quantbench.make.fixture, "default_model_dir", slow_prepare)
    requested = RunSpec(backend="tests.test_resolve:PreparedBackend", suite=suite, gpu="cpu", warmup=0,
                        latency_min_decisions=1, latency_min_seconds=0.0)
    result = execute(requested, echo=False)
    run = result.run.model_dump()
    assert run["status"] == "ok", run["error"]
    [(prepare_ended, where)] = prepared_at
    assert where == os.getpid()  # prepared once, in the parent
    assert run["model_path"] == str(prepared)  # the child loaded what the parent prepared
    load_window_opened = run["extra"]["load_ended"] - run["load_s"]
    assert load_window_opened > prepare_ended  # load_s holds no preparing
    assert run["spec"]["model"] is None  # stored as requested: the hash does not depend on the cache's place
    assert run["spec_hash"] == spec_hash(RunSpec(**{**requested.to_dict(), "device": "cpu"}), detect())


def test_a_failure_while_preparing_is_a_failed_row_classified_as_a_childs_would_be(suite, monkeypatch):
    def broken_prepare() -> Path:
        raise LoadError("fixture cache: model.safetensors is truncated")

    monkeypatch.setattr(quantbench.make.fixture, "default_model_dir", broken_prepare)
    result = execute(RunSpec(backend="tests.test_resolve:PreparedBackend", suite=suite, gpu="cpu"), echo=False)
    run = result.run.model_dump()
    assert (run["status"], run["failure"]) == ("failed", "load_error")
    assert run["error"].startswith("LoadError: fixture cache: model.safetensors is truncated\n\nTraceback")
    assert run["spec"]["model"] is None and run["backend"] == "tests.test_resolve:PreparedBackend"
    assert result.answers == [] and run.get("load_s") is None  # no child was spawned


@pytest.mark.parametrize("backend", ["bf16", "int4", "nvfp4", "fp8"])
def test_a_backend_load_refuses_a_spec_that_was_not_resolved(backend, monkeypatch):
    def must_not_prepare() -> Path:
        raise AssertionError("load() prepared the embedded model")

    monkeypatch.setattr(quantbench.make.fixture, "default_model_dir", must_not_prepare)
    with pytest.raises(ConfigError, match=rf"^--backend {backend}: this spec names neither --model nor --shape; "
                                          "resolve it first"):
        get_backend(backend).load(RunSpec(backend=backend, device="cpu"), detect())
