import hashlib
import json

import pytest
import torch

from quantbench.make import fixture as F
from quantbench.make.synthetic import save_synthetic
from quantbench.models import build
from quantbench.models import synthetic as S
from quantbench.models.checkpoint import SYNTHETIC_FILE, fingerprint, load_causal_lm, model_identity
from quantbench.models.families.qwen3_moe.family import SHAPES as TEXT_SHAPES
from quantbench.protocol.prompt import CHOICE_LABELS
from quantbench.protocol.suite import load_suite


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_labels_are_single_distinct_tokens():
    tok = F.build_tokenizer()
    ids = [tok(" " + label, add_special_tokens=False)["input_ids"] for label in CHOICE_LABELS + ["yes", "no"]]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == len(ids)
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    assert not getattr(tok, "chat_template", None)  # the plain template of quantbench.protocol.prompt applies


def test_tokenizer_splits_numbers_into_digits():
    tok = F.build_tokenizer()
    assert tok.convert_ids_to_tokens(tok("a: 47", add_special_tokens=False)["input_ids"])[-2:] == ["4", "7"]


def test_fixture_id_follows_the_recipe():
    assert F.fixture_id() == F.fixture_id(seed=0, steps=F.TRAIN["steps"])
    assert F.fixture_id(steps=3) != F.fixture_id()
    assert F.fixture_id(seed=1) != F.fixture_id()
    assert F.fixture_id().startswith("quantbench-fixture-moe-")


@pytest.mark.slow
def test_two_short_builds_give_bit_identical_checkpoints(tmp_path):
    a = F.build_fixture(tmp_path / "a", steps=3)
    b = F.build_fixture(tmp_path / "b", steps=3)
    for name in ("model.safetensors", "tokenizer.json", "config.json", F.FIXTURE_INFO_FILE):
        assert _sha(tmp_path / "a" / name) == _sha(tmp_path / "b" / name), name
    assert a.final_loss == b.final_loss
    # and the short build is a loadable, strictly complete, bf16 checkpoint that names itself
    model = load_causal_lm(tmp_path / "a", dtype=torch.bfloat16, device="cpu")
    assert model.config.num_experts >= 8 and model.config.num_experts_per_tok == 2
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers >= 2
    assert not model.config.tie_word_embeddings
    ident = model_identity(tmp_path / "a")
    assert ident["model_id"] == f"{F.fixture_id(steps=3)}-w{fingerprint(tmp_path / 'a')[:8]}"
    assert a.model_id == F.fixture_id(steps=3)
    assert ident["weights"] == "trained"


def test_a_failed_build_leaves_no_directory_behind(tmp_path, monkeypatch):
    def boom(out_dir, **kwargs):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(F, "build_fixture", boom)
    target = tmp_path / "models" / "fixture-x"
    target.parent.mkdir()
    with pytest.raises(RuntimeError, match="mid-build"):
        F._build_into(target, rebuild=False, progress=False)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".fixture-x.lock"]


def test_default_model_beats_chance_on_every_held_out_family(fixture_model_dir):
    suite = load_suite(None)
    accuracy = F.evaluate(fixture_model_dir, suite)
    assert set(accuracy) == set(suite.benchmarks)
    chance: dict[str, list[float]] = {}
    for record in suite.records:
        for question in record.request.questions.values():
            chance.setdefault(record.benchmark, []).append(1 / len(question.options))
    for family, acc in accuracy.items():
        level = sum(chance[family]) / len(chance[family])
        assert acc >= level + 0.25, f"{family}: {acc:.2f} vs chance {level:.2f}"
    assert sum(accuracy.values()) / len(accuracy) >= 0.85
    # The build recorded the same figures beside the weights (scored on the saved checkpoint there too; allow
    # one near-tie question per family to flip under another thread count).
    assert F.read_info(fixture_model_dir).accuracy == pytest.approx(accuracy, abs=1 / 52 + 1e-6)


def test_default_model_answers_are_peaked(fixture_model_dir):
    from transformers import AutoTokenizer

    from quantbench.engine.scoring import TransformersEngine

    model = load_causal_lm(fixture_model_dir, dtype=torch.bfloat16, device="cpu")
    engine = TransformersEngine(model, AutoTokenizer.from_pretrained(fixture_model_dir))
    records = load_suite(None).records[:70]
    answers = engine.forward_many([engine.prepare(r.request) for r in records])
    tops = [max(a.probabilities.values()) for ans in answers for a in ans.values()]
    assert all(a.method == "label_logit" for ans in answers for a in ans.values())
    assert sum(tops) / len(tops) >= 0.8


def test_default_model_dir_is_cached_and_names_the_fixture(fixture_model_dir):
    before = (fixture_model_dir / "model.safetensors").stat().st_mtime_ns
    assert F.default_model_dir(progress=False) == fixture_model_dir
    assert (fixture_model_dir / "model.safetensors").stat().st_mtime_ns == before
    assert fixture_model_dir.name == f"fixture-{F.recipe_hash()[:8]}"
    # the recipe's id, tagged with the weights' hash: another build of the recipe with other weights is another model
    assert model_identity(fixture_model_dir)["model_id"] == f"{F.fixture_id()}-w{fingerprint(fixture_model_dir)[:8]}"
    assert not list(fixture_model_dir.glob("*.bin"))


def test_the_fixture_command_shows_where_and_per_family_accuracy(fixture_model_dir):
    from typer.testing import CliRunner

    from quantbench.cli import app

    done = CliRunner().invoke(app, ["fixture", "--out", str(fixture_model_dir)])
    assert done.exit_code == 0, done.output
    shown = done.stdout
    assert f"fixture {model_identity(fixture_model_dir)['model_id']} at " in shown
    assert str(fixture_model_dir) in shown.replace("\n", "")
    for family in load_suite(None).benchmarks:
        assert family in shown
    assert F.find_or_build(out=fixture_model_dir).model_id == F.fixture_id()


@pytest.mark.slow
def test_build_synthetic_has_the_real_30b_shape_with_one_layer():
    model, tokenizer = S.build_synthetic(layers=1, seed=0)
    cfg = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (151936, 2048, 1)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 4, 128)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    assert cfg.norm_topk_prob
    assert tokenizer.model_max_length == cfg.max_position_embeddings == 40960  # no 1024-token warning at 2048
    assert model.lm_head.weight.shape == (151936, 2048)
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.bfloat16
    assert model.quantbench_weights == "synthetic"
    std = model.model.layers[0].mlp.experts.down_proj.float().std().item()
    assert 0.015 < std < 0.025  # really filled, not left empty
    ids = tokenizer("State:\nobservation: wall\nAnswer:", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=1).logits
    assert logits.shape == (1, 1, 151936) and torch.isfinite(logits).all()


def test_synthetic_weights_follow_the_seed(monkeypatch):
    small = dict(TEXT_SHAPES["qwen3-30b-a3b"], vocab_size=2048, hidden_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, num_experts=8, moe_intermediate_size=64)
    monkeypatch.setitem(TEXT_SHAPES, "small", small)
    a, _ = S.build_synthetic("small", layers=2, seed=0)
    b, _ = S.build_synthetic("small", layers=2, seed=0)
    c, _ = S.build_synthetic("small", layers=2, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    # rotary frequencies are recomputed, not left as uninitialised memory
    assert torch.equal(a.model.rotary_emb.inv_freq, c.model.rotary_emb.inv_freq)
    assert torch.isfinite(a.model.rotary_emb.inv_freq).all()


def test_saved_synthetic_checkpoint_loads_strictly_and_is_marked_synthetic(tmp_path, monkeypatch):
    small = dict(TEXT_SHAPES["qwen3-30b-a3b"], vocab_size=2048, hidden_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, num_experts=8, moe_intermediate_size=64)
    monkeypatch.setitem(TEXT_SHAPES, "small", small)
    out = save_synthetic("small", tmp_path / "syn", layers=2, seed=3)
    marker = json.loads((out / SYNTHETIC_FILE).read_text())
    assert marker == {"model_id": S.synthetic_id("small", 2, 3), "shape": "small", "layers": 2, "seed": 3}
    model = load_causal_lm(out, dtype=torch.bfloat16, device="cpu")
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 2048
    ident = model_identity(out)
    assert ident["weights"] == "synthetic" and ident["model_id"] == S.synthetic_id("small", 2, 3)


def test_unknown_synthetic_shape_names_the_known_ones():
    with pytest.raises(ValueError, match="qwen3-30b-a3b"):
        S.build_synthetic("llama-7b", layers=1)


def test_the_fixture_command_writes_a_real_shape_checkpoint_and_refuses_what_it_cannot_do(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from quantbench.cli import app

    small = dict(TEXT_SHAPES["qwen3-30b-a3b"], vocab_size=2048, hidden_size=128, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, num_experts=8, moe_intermediate_size=64)
    monkeypatch.setitem(TEXT_SHAPES, "small", small)
    runner = CliRunner()
    done = runner.invoke(app, ["fixture", "--shape", "small", "--layers", "1", "--seed", "2", "--out", str(tmp_path / "s")])
    assert done.exit_code == 0, done.output
    assert S.synthetic_id("small", 1, 2) in done.output and "speed and memory only" in done.output
    assert model_identity(tmp_path / "s")["weights"] == "synthetic"
    for args, message in ((["--shape", "llama-7b", "--out", str(tmp_path / "x")], "use one of"),
                          (["--shape", "small"], "give --out"),
                          (["--shape", "small", "--layers", "0", "--out", str(tmp_path / "y")], "at least 1"),
                          (["--layers", "2"], "--shape only")):
        done = runner.invoke(app, ["fixture", *args])
        assert done.exit_code != 0 and message in done.output, (args, done.output)


def test_a_real_shape_that_cannot_fit_is_refused_before_allocating_with_the_layers_that_would(monkeypatch):
    from quantbench.errors import UnsupportedError

    monkeypatch.setattr(build, "free_bytes", lambda device: 24 * 2**30)  # a 24 GiB host: 61 GB of BF16 cannot fit
    with pytest.raises(UnsupportedError, match=r"need 56\.9 GiB on cpu, 24\.0 GiB is free; give --layers N .*at most"):
        S.build_synthetic("qwen3-30b-a3b", device="cpu")


HOLD = """
import fcntl, sys, time
from pathlib import Path
from quantbench.make import fixture as F
path = Path(sys.argv[1])
if sys.argv[2] == "quantbench":
    with F._locked(path, "building fixture-test"):
        print("held", flush=True)
        sys.stdin.readline()
else:  # an older quantbench: the lock, and nothing written into it
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.readline()
"""


@pytest.mark.parametrize("holder", ["quantbench", "older"])
def test_waiting_on_the_fixture_lock_says_who_holds_it_and_keeps_saying(holder, tmp_path, monkeypatch, capfd):
    import os
    import socket
    import subprocess
    import sys
    import threading
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    lock = tmp_path / ".fixture-test.lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), holder], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        monkeypatch.setattr(F, "LOCK_REMIND_S", 1.0, raising=False)
        got = threading.Event()

        def wait_for_it():
            with F._locked(lock):
                got.set()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert not got.wait(2.6)  # held: it waits, and says so
        proc.stdin.write("\n")
        proc.stdin.flush()
        waiter.join(30)
        assert got.is_set()
    finally:
        proc.kill()
        proc.wait()
    said = capfd.readouterr().err.splitlines()
    who = (f"pid {proc.pid} on {socket.gethostname()}, building fixture-test since 20" if holder == "quantbench"
           else f"pid {proc.pid} on this host")
    waits = [line for line in said if line.startswith(f"waiting for {lock}: held by {who}")]
    assert len(waits) >= 2 and "(waited " in waits[1]  # said at once, then again every LOCK_REMIND_S
    assert any(line.startswith(f"got {lock} after ") for line in said)


def test_a_fixture_build_to_a_pipe_prints_plain_progress_lines_as_it_trains(tmp_path, monkeypatch, capfd):
    from quantbench import term

    monkeypatch.setattr(term, "LINE_EVERY_S", 0.0, raising=False)  # a line per step instead of one every 10 s
    monkeypatch.setattr(F, "evaluate", lambda out_dir: {"facts": 0.5})  # the suite's accuracy: not this test's
    F._build_into(tmp_path / "fixture-test", rebuild=False, progress=True, steps=3)
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith(f"building the embedded model fixture-test into {tmp_path / 'fixture-test'} (3 training")
    steps = [line for line in err if line.startswith("training fixture ") and "━" not in line]
    assert [s.split()[2] for s in steps] == ["0/3", "1/3", "2/3", "3/3"]  # plain lines, as it goes
    assert "loss -" in steps[0] and "loss " in steps[1]
    assert "evaluating the embedded model on the built-in suite" in err
