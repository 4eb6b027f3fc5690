"""Issue #24 part 3: `quantbench quantize` on Qwen3-Omni-MoE checkpoints (full and thinker-only) quantizes the
thinker's MoE experts only, writes a thinker-only variant that quantbench's backends load and that answers as the
BF16 model does, leaves every non-expert tensor byte-identical to the source (checked, recorded, and checked again
here independently), and keeps ModelOpt's quantizers off the vision and audio towers during calibration.

The variants are made once per session by the real auto-round and ModelOpt (each library in its own child process,
as quantize runs them); about 25 s each on the 2-core CPU machine."""

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
import torch
from safetensors.torch import load_file, save_file

from backends.bf16 import Bf16Backend
from backends.fp8 import Fp8Backend
from backends.int4 import Int4Backend
from backends.nvfp4 import Nvfp4Backend
from quantbench.make.quantize import quantize
from quantbench.make.quantize.unchanged import ChangedTensor, check_unchanged
from quantbench.models.families import Qwen3OmniThinkerFamily
from quantbench.protocol.suitegen import generate
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from tests.omni_tiny import build_full, build_thinker

ROOT = Path(__file__).resolve().parents[1]
RECIPE = {"nsamples": 8, "seqlen": 64, "group_size": 32}
REQUESTS = generate("eval", 7, seed=1)  # one decision of each family of the built-in suite
CLEAR_MARGIN = 0.1  # BF16's top answer beats its second by this much: a quantized variant must keep it
TOLERANCE = 0.05  # any option's probability, variant against BF16 (measured: at most 0.021, nvfp4)


@cache
def root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="quantbench-omniquant-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@cache
def source(kind: str) -> Path:
    """The tiny full (`qwen3_omni_moe`) or thinker-only checkpoint, same thinker weights."""
    return (build_full if kind == "full" else build_thinker)(root() / kind)


@cache
def variant(kind: str, scheme: str) -> Path:
    """`quantize()` of the tiny `kind` checkpoint, except the thinker-only int4, made through the CLI."""
    out = root() / f"{kind}-{scheme}"
    if (kind, scheme) == ("thinker", "int4"):
        done = subprocess.run([sys.executable, "-m", "quantbench", "quantize", "--model", str(source(kind)),
                               "--scheme", scheme, "--out", str(out), "--nsamples", "8", "--seqlen", "64",
                               "--group-size", "32"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert f"quantized {source(kind)} → {out} (int4)" in " ".join(done.stdout.split())
        return out
    return quantize(source(kind), scheme, out, progress=False, **RECIPE)


def provenance(path: Path) -> dict:
    return json.loads((path / "quantbench_provenance.json").read_text())


def load(backend, model: Path, **options):
    return backend.load(RunSpec(backend=backend.name, model=str(model), device="cpu", **options), detect())


def answers(engine) -> dict[tuple[str, str], dict[str, float]]:
    return {(rec.id, q): a.probabilities for rec in REQUESTS
            for q, a in engine.forward(engine.prepare(rec.request)).items()}


@cache
def bf16_answers() -> dict[tuple[str, str], dict[str, float]]:
    return answers(load(Bf16Backend(), source("full")).engine)


def assert_answers_as_bf16(ours: dict[tuple[str, str], dict[str, float]]) -> None:
    clear = 0
    for key, probs in bf16_answers().items():
        first, second = sorted(probs.values(), reverse=True)[:2]
        if first - second > CLEAR_MARGIN:
            clear += 1
            assert max(ours[key], key=ours[key].get) == max(probs, key=probs.get), (key, ours[key], probs)
        assert max(abs(ours[key][o] - p) for o, p in probs.items()) < TOLERANCE, (key, ours[key], probs)
    assert clear >= 5  # the comparison has teeth: most questions have a clear BF16 answer


CASES = [("full", "int4", Int4Backend(), {}), ("thinker", "int4", Int4Backend(), {}),
         ("full", "nvfp4", Nvfp4Backend(), {"nvfp4_mode": "packed"}),
         ("full", "nvfp4", Nvfp4Backend(), {"nvfp4_mode": "unpacked"}),
         ("full", "fp8", Fp8Backend(), {})]


@pytest.mark.parametrize("kind, scheme, backend, options", CASES, ids=[f"{c[0]}-{c[1]}-{c[3].get('nvfp4_mode', '')}".rstrip("-") for c in CASES])
def test_an_omni_variant_is_a_thinker_checkpoint_that_answers_as_bf16(kind, scheme, backend, options):
    out = variant(kind, scheme)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_omni_moe_thinker"
    assert config["architectures"] == ["Qwen3OmniMoeThinkerForConditionalGeneration"]
    assert (out / "tokenizer.json").is_file()
    loaded = load(backend, out, **options)
    assert type(loaded.model).__name__ == "Qwen3OmniMoeThinkerForConditionalGeneration"
    assert loaded.info.kernel_path == "quantbench grouped-moe cpu-vectorised"
    assert loaded.info.extra["family"] == "qwen3_omni_thinker"
    assert_answers_as_bf16(answers(loaded.engine))


def non_expert(path: Path) -> dict[str, torch.Tensor]:
    """Every non-expert tensor the thinker reads, by module name: the test's own reading (safetensors' loader and
    the family's names), independent of quantize/unchanged.py."""
    family, config = Qwen3OmniThinkerFamily(), json.loads((path / "config.json").read_text())
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        for key, tensor in load_file(str(f)).items():
            name = family.module_name(key, config)
            if name is not None and ".experts." not in name:
                out[name] = tensor
    return out


@pytest.mark.parametrize("kind, scheme", [("full", "int4"), ("thinker", "int4"), ("full", "nvfp4"),
                                          ("full", "fp8")])
def test_every_non_expert_tensor_is_byte_identical_to_the_source_and_recorded(kind, scheme):
    ours, theirs = non_expert(variant(kind, scheme)), non_expert(source(kind))
    assert set(ours) == set(theirs)
    assert any(n.startswith("model.visual.") for n in ours) and any(n.startswith("model.audio_tower.") for n in ours)
    assert {"lm_head.weight", "model.language_model.embed_tokens.weight",
            "model.language_model.layers.0.mlp.gate.weight"} <= set(ours)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype == torch.bfloat16, name
        assert torch.equal(ours[name].view(torch.uint8), tensor.view(torch.uint8)), name
    checked = provenance(variant(kind, scheme))["unchanged"]
    assert (checked["result"], checked["tensors"]) == ("identical", len(theirs))
    assert checked["bytes"] == sum(t.numel() * t.element_size() for t in theirs.values())


def test_the_provenance_says_what_was_done():
    int4, nvfp4 = provenance(variant("full", "int4")), provenance(variant("full", "nvfp4"))
    import transformers  # the route names the version installed (CI installs the newest the pins allow)

    assert int4["route"].startswith("auto-round 0.16.1 on a thinker-only BF16 copy in hub names (its own omni "
                                    f"handler finds no blocks on transformers {transformers.__version__}")
    assert int4["thinker_copy"]["tensors"] == len(non_expert(source("full"))) + 2 * 8 * 3  # + per-expert weights
    assert int4["int4_expert_projections"] == 2 * 8 * 3
    for prov in (int4, nvfp4):
        assert prov["family"] == "qwen3_omni_thinker" and prov["source_model_type"] == "qwen3_omni_moe"
        assert prov["dropped"]["components"] == ["talker", "code2wav"]
        assert (prov["dropped"]["tensors"], prov["dropped"]["bytes"]) == (151, 870210)
    assert "thinker_copy" not in nvfp4 and "on the thinker as quantbench's loader reads it" in nvfp4["route"]
    thinker = provenance(variant("thinker", "int4"))
    assert "dropped" not in thinker and "thinker_copy" not in thinker
    assert "on the thinker-only source as it is" in thinker["route"]


@pytest.mark.parametrize("kind, scheme", [("full", "nvfp4"), ("full", "fp8")])
def test_modelopt_calibrated_with_the_towers_quantizers_off(kind, scheme):
    seen = provenance(variant(kind, scheme))["modelopt_calibration"]
    assert seen["disabled"]["towers"] == ["*audio_tower*", "*visual*"]
    parts = seen["quantizers"]  # as the first calibration forward found them
    for tower in ("audio_tower", "visual", "other"):
        assert parts[tower]["enabled"] == 0 and parts[tower]["disabled"] > 0, parts
    assert parts["experts"]["enabled"] > 0


TOWERS = """
import json, sys, torch
import modelopt.torch.quantization as mtq
from modelopt.torch.quantization.nn import TensorQuantizer
from quantbench.errors import QuantbenchError
from quantbench.make.quantize.modelopt import check_experts_only, load_for_calibration, modelopt_config
found = {}
for case in ("as configured", "without the tower entries"):
    model = load_for_calibration(sys.argv[1], "cpu")
    cfg = modelopt_config("nvfp4", model, experts_only=True)
    if case != "as configured":
        cfg["quant_cfg"] = [e for e in cfg["quant_cfg"] if e["quantizer_name"] not in ("*audio_tower*", "*visual*")]
    def calibrate(m):
        found[case] = {"towers": sorted(n for n, q in m.named_modules() if isinstance(q, TensorQuantizer)
                                        and q.is_enabled and (".audio_tower." in n or ".visual." in n))}
        try:
            check_experts_only(m)
        except QuantbenchError as e:
            found[case]["refused"] = str(e)
        ids = torch.randint(20, 600, (1, 16))
        m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    mtq.quantize(model, cfg, calibrate)
print(json.dumps(found))
"""


def test_no_tower_quantizer_is_enabled_during_calibration_and_a_stray_one_is_refused():
    done = subprocess.run([sys.executable, "-c", TOWERS, str(source("full"))], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["as configured"] == {"towers": []}
    stray = found["without the tower entries"]  # ModelOpt's own defaults leave the audio convolutions enabled
    assert "model.audio_tower.conv2d1.weight_quantizer" in stray["towers"]
    assert "outside the MoE experts are enabled (first: model.audio_tower." in stray["refused"]


def tampered(src: Path, edit) -> Path:
    dst = Path(tempfile.mkdtemp(prefix="quantbench-omniquant-tampered-"))
    atexit.register(shutil.rmtree, dst, True)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    for f in sorted(dst.glob("*.safetensors")):
        save_file(edit(load_file(str(f))), str(f), metadata={"format": "pt"})
    return dst


def flip_one_bit(key: str):
    def edit(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if key in tensors:
            raw = tensors[key].clone().view(torch.int16)
            raw.view(-1)[3] ^= 1  # one mantissa bit of one element: the value barely moves
            tensors[key] = raw.view(torch.bfloat16)
        return tensors
    return edit


@pytest.mark.parametrize("kind, scheme, key", [
    ("full", "int4", "visual.blocks.1.attn.qkv.weight"),  # hub names
    ("full", "nvfp4", "model.audio_tower.conv2d1.weight"),  # ModelOpt's module names
    ("full", "fp8", "model.language_model.layers.1.mlp.gate.weight"),
    ("thinker", "int4", "lm_head.weight"),
])
def test_a_tampered_variant_fails_the_check_naming_the_tensor(kind, scheme, key):
    out = variant(kind, scheme)
    assert check_unchanged(source(kind), out)["result"] == "identical"
    with pytest.raises(ChangedTensor, match=rf"non-expert tensor {key}( \(source: thinker\.\S+\))? differs from the "
                                            "source's bytes"):
        check_unchanged(source(kind), tampered(out, flip_one_bit(key)))
    dropped = tampered(out, lambda t: {k: v for k, v in t.items() if k != key})
    with pytest.raises(ChangedTensor, match=r"the source's non-expert tensor \S+ \(\S+\) is missing"):
        check_unchanged(source(kind), dropped)


def test_a_widened_tensor_is_a_mismatch_unless_restored_exactly():
    from quantbench.make.quantize.unchanged import restore_source_dtypes

    out, key = variant("full", "fp8"), "model.language_model.norm.weight"
    widened = tampered(out, lambda t: {k: (v.float() if k == key else v) for k, v in t.items()})
    with pytest.raises(ChangedTensor, match=rf"non-expert tensor {key} \(source: thinker\.model\.norm\.weight\) is "
                                            r"F32 \[256\], the source's is BF16 \[256\]"):
        check_unchanged(source("full"), widened)
    assert restore_source_dtypes(source("full"), widened)["tensors"] == 1
    assert check_unchanged(source("full"), widened)["result"] == "identical"
    moved = tampered(out, lambda t: {k: (v.float() + 1e-3 if k == key else v) for k, v in t.items()})
    assert restore_source_dtypes(source("full"), moved) == {}  # not the source's values: left for the check
    with pytest.raises(ChangedTensor, match=key):
        check_unchanged(source("full"), moved)


def test_quantize_removes_a_variant_whose_non_expert_tensors_changed(tmp_path, monkeypatch):
    import quantbench.make.quantize.multimodal as multimodal

    good = variant("full", "fp8")

    def library(recipe, src, out, *, progress):  # the library step, returning a head it changed
        shutil.copytree(tampered(good, flip_one_bit("lm_head.weight")), out)
        return {}

    monkeypatch.setattr(multimodal, "run_child", library)
    out = tmp_path / "fp8"
    with pytest.raises(ChangedTensor, match=rf"lm_head\.weight \(source: thinker\.lm_head\.weight\) differs .*"
                                            rf"\({out} was removed\)"):
        quantize(source("full"), "fp8", out, progress=False, **RECIPE)
    assert not out.exists()


def test_all_is_refused_for_the_omni_family(tmp_path):
    from quantbench.errors import ConfigError

    with pytest.raises(ConfigError, match="--all: Qwen3-Omni-MoE checkpoints are quantized experts only"):
        quantize(source("full"), "int4", tmp_path / "all", progress=False, experts_only=False, **RECIPE)


def test_int4_through_auto_rounds_per_expert_loop_answers_as_bf16():
    # last in this file: --no-fast-moe imports auto-round into this process (transformers' state is restored after
    # the load), as tests/test_omni_load.py's last test does
    loaded = load(Int4Backend(), variant("full", "int4"), fast_moe=False)
    assert loaded.info.kernel_path.startswith("auto-round per-expert loop")
    assert len(loaded.model.model.language_model.layers[0].mlp.experts) == 8
    assert_answers_as_bf16(answers(loaded.engine))
