"""--max-options reaches every place a question's options are checked (issue #22, item 5): a suite with a
30-option question (a tool router) runs under `run --max-options 40` in a real child process, and a question
over the limit names the flag."""

import json
import os
from pathlib import Path

import pytest

from quantbench.errors import ConfigError
from quantbench.protocol.suite import load_suite
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def router_suite(tmp_path) -> str:
    record = {"id": "router", "benchmark": "tools", "gold": {"tool": "t7"},
              "request": {"state": {"task": "pick"},
                          "questions": {"tool": {"type": "choice", "criteria": {f"t{i}": "go" for i in range(30)}}}}}
    path = tmp_path / "router.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def test_run_with_max_options_40_answers_a_30_option_question_in_its_child(router_suite, monkeypatch):
    # The child imports the test backend by path (tests.tiny:...): make the repo root importable there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    spec = RunSpec(backend="tests.tiny:TinyBackend", suite=router_suite, gpu="cpu", warmup=0, max_options=40,
                   latency_min_decisions=1, latency_min_seconds=0.0)
    result = execute(spec, echo=False)
    assert result.run.status == "ok", result.run.error
    (answer,) = result.answers
    assert answer.options == [f"t{i}" for i in range(30)] and answer.method == "continuation"


def test_a_question_over_max_options_names_the_flag(router_suite):
    with pytest.raises(ConfigError, match=r"30 options, over the limit of 20 \(--max-options\)"):
        load_suite(router_suite, max_options=20)
    assert len(load_suite(router_suite).records) == 1  # the default (64) takes a 30-tool router
