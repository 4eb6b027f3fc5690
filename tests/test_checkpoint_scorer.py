"""A checkpoint's own scorer (issue #24 part 7): a tiny checkpoint that ships a scorer written for these tests
(tests/checkpoint_scorer/: one forward pass, the last hidden state through its own BF16 head, whose weights are a
safetensors file beside it). Refused without --trust-remote-code by run, serve and sweep in the parent; with it,
the answers stored are the scorer's (compared with the scorer called directly, without quantbench), the method is
recorded on every answer; a scorer's bad output fails the run naming it; quantize keeps it byte-identical and the
variants answer through it; the server answers through it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.errors import ConfigError
from quantbench.models import scorer as checkpoint_scorer
from quantbench.models.checkpoint import PROVENANCE_FILE
from quantbench.models.scorer import ScorerError, ScorerFiles
from quantbench.protocol import parse_request
from quantbench.run.runner import execute
from quantbench.run.scorer import check_answers
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests.test_server import free_port
from tests.tiny import save_tiny

ROOT = Path(__file__).resolve().parents[1]
SCORER_CODE = Path(__file__).parent / "checkpoint_scorer"
CODE_FILES = ("decision_scorer.py", "decision_head.py")
QUIET = dict(gpu="cpu", warmup=0, latency_min_decisions=0, latency_min_seconds=0.0)
RECORDS = [
    {"id": "r0", "benchmark": "mini", "gold": {"q": "yes"},
     "request": {"state": {"observation": "a wall"}, "questions": {
         "q": {"type": "boolean"},
         "action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right", "forward": "Go"}}}}},
    {"id": "r1", "benchmark": "mini", "request": {"state": {"observation": "a door"}, "questions": {"q": {"type": "boolean"}}}},
    {"id": "r2", "benchmark": "mini", "request": {"state": {"observation": "stairs", "light": "dim"},
                                                  "questions": {"go": {"type": "choice", "criteria": {"up": "Up", "down": "Down"}}}}},
]
# The scorer called directly, the way its authors would call it: transformers' own loading, nothing of quantbench.
DIRECT = """
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.dynamic_module_utils import get_class_from_dynamic_module
root, suite = sys.argv[1:3]
config = json.load(open(root + "/config.json"))["quantbench_scorer"]
model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.bfloat16).eval()
weights = {k: v for f in config["files"] for k, v in load_file(root + "/" + f).items()}
cls = get_class_from_dynamic_module(config["class"], root, local_files_only=True)
scorer = cls(model=model, tokenizer=AutoTokenizer.from_pretrained(root), processor=None, checkpoint=root,
             device=torch.device("cpu"), weights=weights)
out = {}
with torch.inference_mode():
    for line in open(suite):
        record = json.loads(line)
        out[record["id"]] = scorer.score(scorer.prepare(record["request"]))
print(json.dumps(out))
"""


def with_scorer(path: Path, cls: str = "TinyScorer") -> Path:
    """The tiny random Qwen3-MoE with the test scorer: its code beside config.json, a BF16 head of seeded weights
    in decision_head.safetensors, and the config entry that names them."""
    save_tiny(path)
    for name in CODE_FILES:
        shutil.copyfile(SCORER_CODE / name, path / name)
    g = torch.Generator().manual_seed(0)
    save_file({"proj.weight": (torch.randn(8, 128, generator=g) * 0.5).to(torch.bfloat16),
               "proj.bias": torch.zeros(8, dtype=torch.bfloat16)}, str(path / "decision_head.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["quantbench_scorer"] = {"class": f"decision_scorer.{cls}", "files": ["decision_head.safetensors"]}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def pythonpath() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Path:
    return with_scorer(tmp_path_factory.mktemp("scored") / "scored-moe")


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "mini.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


@pytest.fixture(scope="module")
def direct(scored, suite) -> dict:
    """{record: {question: {option: probability}}} from the scorer called directly, in a fresh process (once
    auto_round is imported, as other test modules do, transformers mis-loads plain MoE checkpoints)."""
    done = subprocess.run([sys.executable, "-c", DIRECT, str(scored), str(suite)], capture_output=True, text=True,
                          env=pythonpath(), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def variants(scored, tmp_path_factory) -> dict[str, Path]:
    """int4 (auto-round) and fp8 (ModelOpt) made by `quantize`, each in its own process, both at once."""
    out = tmp_path_factory.mktemp("variants")
    jobs = {"int4": dict(nsamples=8, seqlen=64, group_size=64), "fp8": dict(nsamples=4, seqlen=64)}
    code = ("import json, sys; from quantbench.make.quantize import quantize; "
            "quantize(sys.argv[1], sys.argv[2], sys.argv[3], progress=False, **json.loads(sys.argv[4]))")
    procs = {scheme: subprocess.Popen([sys.executable, "-c", code, str(scored), scheme, str(out / scheme),
                                       json.dumps(opts)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      env=pythonpath(), cwd=ROOT)
             for scheme, opts in jobs.items()}
    for scheme, proc in procs.items():
        said = proc.communicate(timeout=600)[0].decode(errors="replace")
        assert proc.returncode == 0, f"{scheme}: {said[-3000:]}"
    return {scheme: out / scheme for scheme in jobs}


def answers_by_question(result) -> dict[tuple[str, str], dict[str, float]]:
    return {(a.record_id, a.question): dict(zip(a.options, a.probs, strict=True)) for a in result.answers}


def assert_same_as_direct(got: dict[tuple[str, str], dict[str, float]], direct: dict) -> None:
    want = {(r, q): probs for r, answers in direct.items() for q, probs in answers.items()}
    assert got.keys() == want.keys()
    for key, probs in want.items():
        assert list(got[key]) == list(probs), key  # the request's option order
        assert max(abs(got[key][o] - p) for o, p in probs.items()) < 1e-3, (key, got[key], probs)


# -- refused without --trust-remote-code, in the parent -----------------------------------------------------------
def one_error_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_run_refuses_a_checkpoint_naming_a_scorer_without_the_flag_before_any_child(scored, suite, tmp_path,
                                                                                      monkeypatch):
    import quantbench.run.runner as runner

    def no_child(*a, **kw):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(runner.subprocess, "Popen", no_child)
    db = tmp_path / "r.duckdb"
    done = CliRunner().invoke(app, ["run", "--backend", "bf16", "--model", str(scored), "--suite", str(suite),
                                    "--gpu", "cpu", "--db", str(db)], env={"COLUMNS": "400"})
    line = one_error_line(done)
    assert line == (f"error: {scored / 'config.json'} names its own scorer, {scored / 'decision_scorer.py'} (class "
                    "decision_scorer.TinyScorer): the checkpoint's code runs only with --trust-remote-code; read that "
                    "file, then pass --trust-remote-code to score through it")
    assert not db.exists()  # nothing stored


def test_serve_and_sweep_refuse_it_too(scored, suite, tmp_path):
    served = CliRunner().invoke(app, ["serve", "--model", str(scored), "--port", str(free_port())],
                                env={"COLUMNS": "400"})
    assert "decision_scorer.py" in one_error_line(served) and "--trust-remote-code" in served.output
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'suites = ["{suite}"]\ngpus = ["cpu"]\n[[models]]\nname = "scored"\npath = "{scored}"\n'
                     '[[variants]]\nbackend = "bf16"\n')
    db = tmp_path / "s.duckdb"
    swept = CliRunner().invoke(app, ["sweep", str(sweep), "--db", str(db)], env={"COLUMNS": "400"})
    line = one_error_line(swept)
    assert "decision_scorer.py" in line and f"trust_remote_code = true on model 'scored' in {sweep}" in line
    assert not db.exists()


def test_a_malformed_scorer_entry_is_refused_naming_the_config_and_the_fix(scored, tmp_path):
    broken = shutil.copytree(scored, tmp_path / "pickled")
    config = json.loads((broken / "config.json").read_text())
    config["quantbench_scorer"]["files"] = ["decision_head.bin"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match=r"quantbench_scorer\.files: 'decision_head\.bin' is not a \.safetensors"):
        checkpoint_scorer.describe(broken)
    config["quantbench_scorer"] = {"class": "other/repo--decision_scorer.TinyScorer"}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match=r"is not module\.Class"):
        checkpoint_scorer.describe(broken)


# -- with the flag: the scorer's answers, stored like any other ------------------------------------------------------
def test_with_the_flag_the_stored_answers_are_the_scorers_with_the_method_on_each(scored, suite, direct, tmp_path):
    result = execute(RunSpec(backend="bf16", model=str(scored), suite=str(suite), trust_remote_code=True, **QUIET),
                     echo=False)
    assert result.run.status == "ok", result.run.error
    assert_same_as_direct(answers_by_question(result), direct)
    assert {a.method for a in result.answers} == {"checkpoint_scorer"}
    assert result.run.kernel_path.endswith("+checkpoint-scorer")
    record = result.run.extra["scorer"]
    assert record == checkpoint_scorer.describe(scored).record()
    assert set(record["files"]) == {*CODE_FILES, "decision_head.safetensors"}  # the relative import is hashed too
    assert all(lat.tokens > 0 for lat in result.latencies)  # the scorer's own count of its tokens
    store = Store(tmp_path / "r.duckdb")
    store.write_run(result)
    assert store.read("SELECT DISTINCT method FROM answers")["method"].tolist() == ["checkpoint_scorer"]


@pytest.mark.parametrize("out, words", [
    ({"q": {"yes": 0.7, "no": 0.7}}, "for question 'q' probabilities that sum to 1.4, not 1"),
    ({"q": {"yes": 1.0}}, "for question 'q' options ['yes'], not the question's ['yes', 'no']"),
    ({"q": {"yes": float("nan"), "no": 0.5}}, "for question 'q' nan for option 'yes'"),
    ({"q": {"yes": 1.5, "no": -0.5}}, "for question 'q' -0.5 for option 'no'"),
    ({}, "for question 'q' nothing"),
    ({"q": {"yes": 0.5, "no": 0.5}, "extra": {}}, "questions the request does not ask (extra)"),
    ([0.5, 0.5], "a list, not a mapping"),
])
def test_bad_scorer_output_is_a_scorer_error_naming_the_scorer_and_question(out, words):
    found = ScorerFiles(Path("/ck"), "joint.JointScorer", ())
    request = parse_request({"state": {"o": "x"}, "questions": {"q": {"type": "boolean"}}})
    with pytest.raises(ScorerError) as e:
        check_answers(found, request, out)
    assert str(e.value).startswith(f"the checkpoint's scorer joint.JointScorer ({Path('/ck/joint.py')}) answered {words}")


def test_a_scorer_returning_bad_probabilities_fails_the_run_with_the_reason(tmp_path, suite):
    broken = with_scorer(tmp_path / "unnormalised-moe", cls="UnnormalisedScorer")
    result = execute(RunSpec(backend="bf16", model=str(broken), suite=str(suite), trust_remote_code=True, **QUIET),
                     echo=False)
    assert (result.run.status, result.run.failure) == ("failed", "load_error")
    first = result.run.error.splitlines()[0]
    assert first.startswith("ScorerError: the checkpoint's scorer decision_scorer.UnnormalisedScorer "
                            f"({broken / 'decision_scorer.py'}) answered for question 'q' probabilities that sum to ")
    assert result.answers == []


# -- quantized variants: the scorer byte-identical, and answering through it -----------------------------------------
def test_quantize_copies_the_scorer_byte_identical_and_records_it(scored, variants):
    source = checkpoint_scorer.describe(scored).record()
    for scheme, path in variants.items():
        copied = checkpoint_scorer.describe(path)
        assert copied is not None and copied.record() == source, scheme
        provenance = json.loads((path / PROVENANCE_FILE).read_text())["scorer"]
        assert provenance["byte_identical"] is True and provenance["sha256"] == source["sha256"], scheme
        assert provenance["files"]["decision_head.safetensors"] == source["files"]["decision_head.safetensors"]


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_a_quantized_variant_answers_through_the_scorer_and_needs_the_flag(scheme, variants, suite, direct):
    spec = dict(backend=scheme, model=str(variants[scheme]), suite=str(suite), **QUIET)
    with pytest.raises(ConfigError, match="--trust-remote-code"):
        execute(RunSpec(**spec), echo=False)
    result = execute(RunSpec(**spec, trust_remote_code=True), echo=False)
    assert result.run.status == "ok", result.run.error
    assert {a.method for a in result.answers} == {"checkpoint_scorer"}
    assert result.run.extra["scorer"]["sha256"] == checkpoint_scorer.describe(variants[scheme]).record()["sha256"]
    got = answers_by_question(result)
    for record, answers in direct.items():  # quantized experts move the probabilities a little, not these answers
        for q, probs in answers.items():
            assert max(got[(record, q)], key=got[(record, q)].get) == max(probs, key=probs.get), (scheme, record, q)


# -- the server ------------------------------------------------------------------------------------------------------
def test_the_server_answers_through_the_scorer_and_an_http_run_stores_it(scored, suite, direct, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "quantbench", "serve", "--backend", "bf16", "--model", str(scored),
                             "--trust-remote-code", "--port", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=pythonpath(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                health = httpx.get(url + "/healthz", timeout=5)
                if health.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        info = health.json()["info"]
        assert info["kernel_path"].endswith("+checkpoint-scorer") and info["extra"]["scorer"]["class"] == \
            "decision_scorer.TinyScorer"
        answer = httpx.post(url + "/v1/systemone", json=RECORDS[0]["request"], timeout=60).json()
        assert {a["method"] for a in answer["answers"].values()} == {"checkpoint_scorer"}
        for q, probs in direct["r0"].items():
            assert max(abs(answer["answers"][q]["probabilities"][o] - p) for o, p in probs.items()) < 1e-3
        result = execute(RunSpec(backend="http", endpoint=url, suite=str(suite), **QUIET), echo=False)
        assert result.run.status == "ok", result.run.error
        assert {a.method for a in result.answers} == {"checkpoint_scorer"}
        assert_same_as_direct(answers_by_question(result), direct)
    finally:
        proc.terminate()
        proc.wait(60)
