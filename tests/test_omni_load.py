"""Issue #24 parts 1 and 2: Qwen3-Omni-MoE checkpoints (full and thinker-only, in the three key layouts that exist)
load as their thinker through quantbench's strict loader, never read the talker / code2wav, and answer text
requests as transformers' own thinker does, in every backend."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
import safetensors
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

from backends.bf16 import Bf16Backend
from backends.fp8 import Fp8Backend
from backends.nvfp4 import Nvfp4Backend
from quantbench.engine.scoring import TransformersEngine
from quantbench.errors import LoadError
from quantbench.models.families import Qwen3OmniThinkerFamily, family_of
from quantbench.protocol import parse_request
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from tests.omni_tiny import build_full, build_thinker

ROOT = Path(__file__).resolve().parents[1]
REQUEST = parse_request({"state": {"observation": "wall ahead, player left"},
                         "questions": {"action": {"type": "choice", "criteria": {"left": "l", "right": "r",
                                                                                  "forward": "f"}},
                                       "ok": {"type": "boolean"}}})


@cache
def checkpoints() -> dict[str, Path]:
    """The tiny full and thinker-only checkpoints (same thinker weights), and the thinker in ModelOpt's module
    names (what its export writes), made once per session."""
    root = Path(tempfile.mkdtemp(prefix="quantbench-omni-"))
    atexit.register(shutil.rmtree, root, True)
    full, thinker = build_full(root / "full"), build_thinker(root / "thinker")
    modules = root / "modules"
    shutil.copytree(thinker, modules)
    family, config = Qwen3OmniThinkerFamily(), json.loads((thinker / "config.json").read_text())
    tensors = load_file(str(thinker / "model.safetensors"))
    save_file({family.module_name(k, config): t for k, t in tensors.items()}, str(modules / "model.safetensors"))
    return {"full": full, "thinker": thinker, "modules": modules}


def load(backend, model: Path, **options):
    return backend.load(RunSpec(backend=backend.name, model=str(model), device="cpu", **options), detect())


def answers(engine) -> dict[str, dict[str, float]]:
    return {k: a.probabilities for k, a in engine.forward(engine.prepare(REQUEST)).items()}


def top(probs: dict[str, dict[str, float]]) -> dict[str, str]:
    return {k: max(p, key=p.get) for k, p in probs.items()}


@cache
def reference() -> Qwen3OmniMoeThinkerForConditionalGeneration:
    """transformers' own load of the thinker (from the full checkpoint: it reads the thinker only)."""
    return Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(checkpoints()["full"],
                                                                        dtype=torch.bfloat16).eval()


def logits(model) -> torch.Tensor:
    ids = torch.arange(20, 60).reshape(1, -1)
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()


def test_both_omni_model_types_are_the_thinker_family():
    assert family_of({"model_type": "qwen3_omni_moe"}).name == "qwen3_omni_thinker"
    assert family_of({"model_type": "qwen3_omni_moe_thinker"}).name == "qwen3_omni_thinker"
    assert family_of({"model_type": "qwen3_moe"}).name == "qwen3_moe"
    family, full = Qwen3OmniThinkerFamily(), {"model_type": "qwen3_omni_moe"}
    assert family.module_name("thinker.model.layers.1.mlp.experts.3.up_proj.weight", full) == \
        "model.language_model.layers.1.mlp.experts.3.up_proj.weight"
    assert family.module_name("thinker.visual.blocks.0.attn.qkv.weight", full) == "model.visual.blocks.0.attn.qkv.weight"
    assert family.module_name("thinker.lm_head.weight", full) == "lm_head.weight"
    assert family.module_name("talker.model.layers.0.mlp.gate.weight", full) is None
    assert family.module_name("model.audio_tower.conv2d1.weight", {"model_type": "qwen3_omni_moe_thinker"}) == \
        "model.audio_tower.conv2d1.weight"


def test_a_full_checkpoint_loads_the_thinker_only_never_reading_the_talker(monkeypatch):
    real, read = safetensors.safe_open, []

    class Logged:  # the loader's view of each file: every tensor it reads is logged
        def __init__(self, *args, **kwargs):
            self.handle = real(*args, **kwargs)

        def keys(self):
            return self.handle.keys()

        def get_tensor(self, key):
            read.append(key)
            return self.handle.get_tensor(key)

    monkeypatch.setattr(safetensors, "safe_open", Logged)
    loaded = load(Bf16Backend(), checkpoints()["full"])
    assert type(loaded.model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    assert read and not any(k.startswith(("talker.", "code2wav.")) for k in read)
    assert all(k.startswith("thinker.") for k in read)
    assert loaded.info.extra["skipped"] == {"components": ["talker", "code2wav"], "tensors": 151, "bytes": 870210,
                                            "total_bytes": 9784642}
    assert loaded.info.load_note == "talker + code2wav not read: 151 tensors, 870,210 bytes of 9,784,642"
    assert loaded.info.extra["family"] == "qwen3_omni_thinker"
    assert torch.equal(logits(loaded.model), logits(reference()))


PEAK = """
import sys
import torch
from pathlib import Path
from quantbench.models.checkpoint import read_config
from quantbench.models.families import family_of
def anonymous():  # RssAnon: tensors read into memory, not library or mapped-file pages the kernel may drop
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssAnon:"))) * 1024
root = Path(sys.argv[1])
family = family_of(read_config(root))
family.build_meta(root, torch.bfloat16)  # imports transformers' modeling code before the baseline
before = anonymous()
model = family.load(root, torch.bfloat16, "cpu")
print(anonymous() - before)
"""


def test_loading_a_full_checkpoint_never_brings_the_talker_into_memory(tmp_path):
    # a talker ~13x the thinker: read, it would show in the process's anonymous memory after the load (the
    # thinker's load adds ~7 MB; transformers' own load of the full model ~138 MB, measured here)
    full = build_full(tmp_path / "big-talker", talker_hidden=1024, talker_layers=4)
    from quantbench.models.checkpoint import unread_tensors

    talker = unread_tensors(full, ("talker.", "code2wav."))["bytes"]
    assert talker > 100e6
    done = subprocess.run([sys.executable, "-c", PEAK, str(full)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    grew = int(done.stdout.strip().splitlines()[-1])
    assert grew < talker / 2, (grew, talker)


def test_the_thinker_context_limit_comes_from_its_text_config():
    assert load(Bf16Backend(), checkpoints()["thinker"]).engine.max_tokens == 4096


@pytest.mark.parametrize("layout", ["thinker", "modules"])
def test_every_key_layout_loads_the_same_thinker(layout):
    loaded = load(Bf16Backend(), checkpoints()[layout])
    assert "skipped" not in loaded.info.extra and loaded.info.load_note == ""
    assert torch.equal(logits(loaded.model), logits(reference()))


@pytest.mark.parametrize("impl", ["grouped_mm", "eager", "quantbench"])
def test_bf16_answers_text_requests_as_transformers_thinker_does(impl):
    loaded = load(Bf16Backend(), checkpoints()["full"], experts_impl=impl)
    ours = answers(loaded.engine)
    theirs = answers(TransformersEngine(reference(), loaded.engine.tokenizer))
    assert top(ours) == top(theirs)
    for q, probs in theirs.items():
        assert max(abs(ours[q][o] - p) for o, p in probs.items()) < 0.02, (impl, q, ours[q], probs)


def rewritten(src: Path, name: str, edit) -> Path:
    dst = Path(tempfile.mkdtemp(prefix=f"quantbench-omni-{name}-"))
    atexit.register(shutil.rmtree, dst, True)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    for f in sorted(dst.glob("*.safetensors")):
        save_file(edit(load_file(str(f))), str(f), metadata={"format": "pt"})
    return dst


def test_a_missing_or_stray_tensor_is_a_load_error_never_random_weights():
    thinker, full = checkpoints()["thinker"], checkpoints()["full"]
    dropped = rewritten(thinker, "missing", lambda t: {k: v for k, v in t.items()
                                                     if k != "model.layers.1.mlp.experts.7.down_proj.weight"})
    with pytest.raises(LoadError, match=r"model\.language_model\.layers\.1\.mlp\.experts\.7\.down_proj\.weight is "
                                        "missing"):
        load(Bf16Backend(), dropped)
    stray = rewritten(thinker, "stray", lambda t: {**t, "model.layers.9.mlp.gate.weight": torch.zeros(8, 256)})
    with pytest.raises(LoadError, match=r"no place for: model\.layers\.9\.mlp\.gate\.weight"):
        load(Bf16Backend(), stray)
    tower = rewritten(full, "tower", lambda t: {k: v for k, v in t.items()
                                               if k != "thinker.audio_tower.conv2d1.weight"})
    with pytest.raises(LoadError, match=r"no tensor for model\.audio_tower\.conv2d1\.weight"):
        load(Bf16Backend(), tower)


MODELOPT = """
import copy, shutil, sys, torch
from transformers import Qwen3OmniMoeThinkerForConditionalGeneration
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint
src = sys.argv[1]
for scheme, out in (("nvfp4", sys.argv[2]), ("fp8", sys.argv[3])):
    m = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(src, dtype=torch.bfloat16,
                                                                     experts_implementation="eager").eval()
    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG if scheme == "nvfp4" else mtq.FP8_DEFAULT_CFG)
    dense = [n for n, x in m.named_modules() if isinstance(x, torch.nn.Linear) and ".experts." not in f".{n}."]
    cfg["quant_cfg"] += [{"quantizer_name": f"{n}.*", "enable": False} for n in dense]
    cfg["quant_cfg"] += [{"quantizer_name": p, "enable": False} for p in ("*audio_tower*", "*visual*")]
    def calibrate(model):
        with torch.inference_mode():
            for s in range(2):
                ids = torch.randint(20, 600, (2, 32), generator=torch.Generator().manual_seed(s))
                model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    mtq.quantize(m, cfg, calibrate)
    export_hf_checkpoint(m, export_dir=out)
    for f in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(f"{src}/{f}", out)
"""


@cache
def modelopt_variants() -> dict[str, Path]:
    """NVFP4 and FP8 exports of the tiny thinker by the real ModelOpt (experts only; the towers' quantizers off),
    made once per session in one child process (mtq.quantize patches classes in the process that runs it)."""
    root = Path(tempfile.mkdtemp(prefix="quantbench-omni-modelopt-"))
    atexit.register(shutil.rmtree, root, True)
    out = {"nvfp4": root / "nvfp4", "fp8": root / "fp8"}
    done = subprocess.run([sys.executable, "-c", MODELOPT, str(checkpoints()["thinker"]), str(out["nvfp4"]),
                           str(out["fp8"])], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def dequantized_reference(quantized) -> TransformersEngine:
    """transformers' own thinker with the quantized variant's experts, dequantized, in place of its BF16 ones
    (everything else is the BF16 source, which ModelOpt left unquantized)."""
    model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(checkpoints()["thinker"],
                                                                        dtype=torch.bfloat16).eval()
    for ours, theirs in zip(quantized.model.model.language_model.layers, model.model.language_model.layers,
                            strict=True):
        experts = theirs.mlp.experts
        experts.gate_up_proj.data = ours.mlp.gate_up.dequantize(torch.bfloat16)
        experts.down_proj.data = ours.mlp.down.dequantize(torch.bfloat16)
    return TransformersEngine(model, quantized.engine.tokenizer)


@pytest.mark.parametrize("backend, options", [(Nvfp4Backend(), {"nvfp4_mode": "packed"}),
                                              (Nvfp4Backend(), {"nvfp4_mode": "unpacked"}),
                                              (Nvfp4Backend(), {"nvfp4_mode": "packed", "nvfp4_activations": "off"}),
                                              (Fp8Backend(), {})])
def test_modelopt_variants_of_the_thinker_load_and_answer_as_transformers_with_their_weights(backend, options):
    loaded = load(backend, modelopt_variants()[backend.name], **options)
    assert type(loaded.model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    assert loaded.info.kernel_path == "quantbench grouped-moe cpu-vectorised"
    assert loaded.info.extra["family"] == "qwen3_omni_thinker" and loaded.engine.max_tokens == 4096
    ours = answers(loaded.engine)
    assert top(ours) == top(answers(dequantized_reference(loaded)))


AUTOROUND = """
import re, sys, torch
from transformers import AutoTokenizer, Qwen3OmniMoeThinkerForConditionalGeneration
from auto_round import AutoRound
src, out = sys.argv[1:3]
model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(src, dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(src)
def checkpoint_name(n):  # auto-round's layer_config wants the checkpoint's (hub) names
    return re.sub(r"^model\\.(visual|audio_tower)\\.", r"\\1.", re.sub(r"^model\\.language_model\\.", "model.", n))
keep = {checkpoint_name(n): {"bits": 16} for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".experts." not in f".{n}."}
g = torch.Generator().manual_seed(0)
data = [{"input_ids": (ids := torch.randint(20, 600, (1, 64), generator=g)), "attention_mask": torch.ones_like(ids)}
        for _ in range(8)]
AutoRound(model, tok, scheme="W4A16", group_size=32, iters=0, dataset=data, nsamples=8, seqlen=64, layer_config=keep,
          batch_size=4, processor=tok).quantize_and_save(out, format="auto_round")
"""


@cache
def autoround_variant() -> Path:
    """auto-round's int4 export of the tiny thinker (experts only, kept per expert), made in a child process
    (importing auto-round changes transformers' loading in the process that does it)."""
    root = Path(tempfile.mkdtemp(prefix="quantbench-omni-int4-"))
    atexit.register(shutil.rmtree, root, True)
    done = subprocess.run([sys.executable, "-c", AUTOROUND, str(checkpoints()["thinker"]), str(root)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    variant = next(root.rglob("config.json")).parent
    shutil.copy(checkpoints()["thinker"] / "preprocessor_config.json", variant)  # auto-round saves the tokenizer only
    return variant


def test_auto_rounds_per_expert_export_loads_into_the_int4_engine_and_answers_as_transformers():
    from backends.int4 import Int4Backend

    variant = autoround_variant()
    keys = set(load_file(str(next(variant.glob("*.safetensors")))))
    assert "model.layers.0.mlp.experts.3.gate_proj.qweight" in keys and not any(k.endswith("gate_up_proj") for k in keys)
    loaded = load(Int4Backend(), variant)
    assert type(loaded.model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    assert loaded.info.kernel_path == "quantbench grouped-moe cpu-vectorised"
    assert loaded.info.weight_format == "int4 w4a16 g32 sym (auto_round:auto_gptq)"
    assert loaded.engine.max_tokens == 4096
    assert top(answers(loaded.engine)) == top(answers(dequantized_reference(loaded)))


def test_no_fast_moe_loads_auto_rounds_export_through_transformers_with_every_expert_filled():
    # last in this file: it imports auto-round into this process (transformers' state is restored after the load)
    from backends.int4 import Int4Backend

    fast = load(Int4Backend(), autoround_variant())
    expected = top(answers(dequantized_reference(fast)))
    loaded = load(Int4Backend(), autoround_variant(), fast_moe=False)
    assert loaded.info.kernel_path.startswith("auto-round per-expert loop")
    assert len(loaded.model.model.language_model.layers[0].mlp.experts) == 8
    assert top(answers(loaded.engine)) == expected


def test_lineage_pairs_every_layout_of_the_thinker_by_canonical_tensor_names():
    from quantbench.models.lineage import canonical_tensor_name, shared_tensors_hash

    assert canonical_tensor_name("thinker.model.layers.0.mlp.gate.weight") == "model.layers.0.mlp.gate.weight"
    assert canonical_tensor_name("model.language_model.norm.weight") == "model.norm.weight"
    assert canonical_tensor_name("model.visual.blocks.0.norm1.weight") == "visual.blocks.0.norm1.weight"
    assert canonical_tensor_name("talker.model.norm.weight") is None
    assert canonical_tensor_name("model.layers.0.mlp.gate.weight") == "model.layers.0.mlp.gate.weight"  # text: as is
    hashes = {name: shared_tensors_hash(path) for name, path in checkpoints().items()}
    assert hashes["full"] is not None and len(set(hashes.values())) == 1, hashes


def test_a_run_records_the_skipped_talker_and_a_checkpoint_short_of_a_tensor_is_a_load_error_row(tmp_path,
                                                                                              monkeypatch):
    from quantbench.run.runner import execute

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    suite = tmp_path / "one.jsonl"
    suite.write_text(json.dumps({"id": "r0", "benchmark": "mini", "gold": {"ok": "yes"},
                                 "request": {"state": {"observation": "wall"}, "questions": {"ok": {"type": "boolean"}}}})
                     + "\n")

    def run(model: Path):
        return execute(RunSpec(backend="bf16", model=str(model), suite=str(suite), gpu="cpu", warmup=0,
                               latency_min_decisions=1, latency_min_seconds=0.0), echo=False).run

    ok = run(checkpoints()["full"])
    assert ok.status == "ok", ok.error
    assert ok.extra["skipped"]["bytes"] == 870210 and ok.extra["family"] == "qwen3_omni_thinker"
    short = rewritten(checkpoints()["full"], "short", lambda t: {k: v for k, v in t.items()
                                                                 if k != "thinker.model.layers.0.mlp.gate.weight"})
    failed = run(short)
    assert (failed.status, failed.failure) == ("failed", "load_error")
    assert "no tensor for model.language_model.layers.0.mlp.gate.weight" in failed.error


def test_preflight_refuses_an_omni_config_without_its_text_decoder_before_any_child(tmp_path):
    from quantbench.run.runner import preflight

    broken = tmp_path / "no-text"
    shutil.copytree(checkpoints()["full"], broken)
    config = json.loads((broken / "config.json").read_text())
    del config["thinker_config"]["text_config"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=r"config\.json: model_type qwen3_omni_moe without thinker_config\.text_config"):
        preflight(RunSpec(backend="bf16", model=str(broken), gpu="cpu"))
    assert preflight(RunSpec(backend="bf16", model=str(checkpoints()["full"]), gpu="cpu")) == {}
