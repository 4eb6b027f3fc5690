"""Checkpoints made elsewhere, brought by a user: what `quantbench quantize` and the int4 / nvfp4 / fp8 loaders do
with layouts auto-round and ModelOpt write themselves, and with odd ones. Each is made by hand here from the tiny
random model (tests/tiny.py) in the layout the library writes (no library run: seconds, not minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantbench.errors import ConfigError, LoadError, QuantbenchError
from tests.tiny import save_tiny

ROOT = Path(__file__).resolve().parent.parent
IDS = torch.tensor([[5, 17, 33, 2, 90, 14, 61, 7, 7, 300, 42, 11, 150, 9, 3, 27]])
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _config(path: Path, change) -> None:
    file = path / "config.json"
    config = json.loads(file.read_text())
    change(config)
    file.write_text(json.dumps(config, indent=2))


def _rewrite(src: Path, dst: Path, tensors: dict[str, torch.Tensor], quantization_config: dict | None) -> Path:
    """`src` (a tiny BF16 checkpoint) copied to `dst` with these tensors and this quantization_config."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    if quantization_config is not None:
        _config(dst, lambda c: c.__setitem__("quantization_config", quantization_config))
    return dst


def _is_expert(key: str) -> bool:
    return ".mlp.experts." in key and key.endswith("_proj.weight")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "bf16")


# -- quantize: what it is given as --model and --out ---------------------------------------------------------------
@pytest.mark.parametrize("out", [".", "..", "sub"], ids=["out-is-model", "out-holds-model", "out-inside-model"])
def test_quantize_never_removes_or_writes_into_its_source(tiny, tmp_path, out):
    """`--out` the source's own directory (or one holding it) with --overwrite removed the user's checkpoint before
    failing with 'no config.json'; one inside it changed the source's hash. All refused, the source untouched."""
    from quantbench.make.quantize import quantize

    source = tmp_path / "models" / "m"
    source.parent.mkdir()
    source.mkdir()
    for f in tiny.iterdir():
        (source / f.name).write_bytes(f.read_bytes())
    before = sorted(p.name for p in source.iterdir())
    with pytest.raises(ConfigError, match=r"--out .*the source checkpoint --model"):
        quantize(source, "fp8", source / out, overwrite=True, progress=False)
    assert sorted(p.name for p in source.iterdir()) == before


@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
def test_quantize_refuses_a_source_that_is_quantized_already(tiny, tmp_path, where):
    """An auto-round export as --model crashed auto-round (AttributeError 'act_bits'), a compressed-tensors one
    raised an ImportError, a ModelOpt one a list of UNEXPECTED keys: now one line naming the file, before loading."""
    from quantbench.make.quantize import quantize

    source = tmp_path / "int4"
    source.mkdir()
    for f in tiny.iterdir():
        (source / f.name).write_bytes(f.read_bytes())
    if where == "config.json":
        _config(source, lambda c: c.__setitem__("quantization_config", {"quant_method": "auto-round", "bits": 4}))
    else:
        (source / where).write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    with pytest.raises(LoadError, match=rf"already quantized \({where}"):
        quantize(source, "int4", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_quantize_never_runs_a_checkpoints_own_code_even_when_stdin_says_yes(tiny, tmp_path):
    """transformers asked on stdin (its prompt went to the libraries' log, unseen) whether to run a checkpoint's
    own code, and ran it on "y": quantize has no --trust-remote-code, so it is refused before anything loads."""
    source = tmp_path / "remote"
    source.mkdir()
    for f in tiny.iterdir():
        (source / f.name).write_bytes(f.read_bytes())
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    (source / "configuration_x.py").write_text(code)
    (source / "modeling_x.py").write_text(code)
    _config(source, lambda c: c.update(model_type="xmoe", auto_map={"AutoConfig": "configuration_x.XConfig",
                                                                    "AutoModelForCausalLM": "modeling_x.XForCausalLM"}))
    done = subprocess.run([sys.executable, "-m", "quantbench", "quantize", "--model", str(source), "--scheme", "fp8",
                           "--out", str(tmp_path / "out")], input="y\n", capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert not marker.exists()
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "model_type 'xmoe' is not built into transformers" in done.stderr and "never runs" in done.stderr


# -- int4: auto-round's own layouts ------------------------------------------------------------------------------------
GROUP = 32


def _int4_tensors(tiny: Path, *, awq: bool = False, group: int = GROUP, codes: int = 0x88888888,
                  scale: float = 1.0) -> dict[str, torch.Tensor]:
    """The tiny model's experts as auto-round int4, in auto_gptq packing (qweight [K/8, N], qzeros [K/G, N/8]) or
    auto_awq's (qweight [K, N/8]): every word holds `codes` (the default, 8 = the zero point: zero weights), every
    scale is `scale`, in groups of `group` inputs (-1: one group a row, auto-round's group_size -1)."""
    out = {}
    for k, w in load_file(str(tiny / "model.safetensors")).items():
        if not _is_expert(k):
            out[k] = w
            continue
        n, kk = w.shape
        p = k[: -len(".weight")]
        groups = 1 if group == -1 else kk // group
        out[f"{p}.qweight"] = torch.full((kk, n // 8) if awq else (kk // 8, n), codes - (1 << 32), dtype=torch.int32)
        out[f"{p}.qzeros"] = torch.full((groups, n // 8), 0x77777777, dtype=torch.int32)
        out[f"{p}.scales"] = torch.full((groups, n), scale, dtype=torch.float16)
    return out


def _autoround_config(*, sym: bool, packing: str = "auto_round:auto_gptq", group: int = GROUP) -> dict:
    """What auto-round 0.16.1 writes for an experts-only W4A16 export (attention and routers kept at 16 bits)."""
    keep = {f"model.layers.{i}.self_attn.{p}_proj": {"bits": 16} for i in range(2) for p in "qkvo"}
    keep.update({rf".*model\.layers\.{i}\.mlp\.gate.*": {"bits": 16, "data_type": "float"} for i in range(2)})
    return {"autoround_version": "0.16.1", "bits": 4, "block_name_to_quantize": "model.layers", "data_type": "int",
            "extra_config": keep, "group_size": group, "packing_format": packing, "quant_method": "auto-round",
            "sym": sym}


def test_an_awq_packed_int4_is_read_as_int4_and_refused_for_its_packing(tiny, tmp_path):
    """auto-round writes `auto_round:auto_awq` for sym=False: its qweight [K, N/8] was classified as 'int32' experts
    'in no format quantbench runs'; it is int4, and the refusal names the packing and the fix."""
    from backends.int4 import read_quant_config
    from quantbench.models import experts_claim

    path = _rewrite(tiny, tmp_path / "awq", _int4_tensors(tiny, awq=True),
                    _autoround_config(sym=False, packing="auto_round:auto_awq"))
    record = experts_claim.check("int4", path)
    assert {(v["format"], v["bits"], v["group_size"]) for v in record["layers"].values()} == {("int4", 4, GROUP)}
    with pytest.raises(LoadError, match=r"packing_format is 'auto_round:auto_awq' \(what auto-round writes for "
                                        r"sym=false\).*sym=True"):
        read_quant_config(path)


def test_an_asymmetric_auto_gptq_int4_without_a_cpu_kernel_names_the_missing_kernel(tiny, tmp_path):
    """auto-round has no CPU kernel for sym=False auto_gptq and falls back to its 'fake' backend, which makes no
    quantized layers: the refusal listed MISSING `weight` / UNEXPECTED `qweight` keys and 'transformers would fill
    the gaps with random weights'. It now says auto-round has no kernel here, and what to do. (The symmetric
    checkpoint of the same tensors loads: the hand-made layout is auto-round's.)"""
    from backends.int4 import Int4Backend
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    tensors = _int4_tensors(tiny)
    sym = _rewrite(tiny, tmp_path / "sym", tensors, _autoround_config(sym=True))
    asym = _rewrite(tiny, tmp_path / "asym", tensors, _autoround_config(sym=False))
    machine = detect()
    loaded = Int4Backend().load(RunSpec(backend="int4", model=str(sym), device="cpu", dtype="float32"), machine)
    assert loaded.info.variant == "int4"
    try:
        Int4Backend().load(RunSpec(backend="int4", model=str(asym), device="cpu", dtype="float32"), machine)
    except LoadError as e:  # (where auto-round has a CPU kernel for it, it loads)
        assert "missing keys" not in str(e)
        assert "auto-round has no kernel on cpu" in str(e) and "sym=false" in str(e) and "'auto_round:fake'" in str(e)


# -- ModelOpt's other NVFP4 / FP8 recipes ------------------------------------------------------------------------------
def _modelopt_tensors(tiny: Path, scheme: str, *, static: bool = False) -> dict[str, torch.Tensor]:
    """The tiny model's experts as ModelOpt exports them: fp8 per-channel (`weight` E4M3, `weight_scale` [N] fp32,
    no input_scale: per-token activations), nvfp4 (`weight` uint8, `weight_scale` E4M3, `weight_scale_2`); `static`:
    its default recipes instead, with an `input_scale` each (fp8 then per-tensor)."""
    from quantbench.engine.moe import fp8, nvfp4_numbers

    out = {}
    for k, w in load_file(str(tiny / "model.safetensors")).items():
        if not _is_expert(k):
            out[k] = w
            continue
        p = k[: -len(".weight")]
        if scheme == "fp8":
            out[k], out[f"{p}.weight_scale"] = fp8.quantize(w, per_channel=not static)
        else:
            out[k], out[f"{p}.weight_scale"], out[f"{p}.weight_scale_2"] = nvfp4_numbers.quantize(w)
        if static:
            out[f"{p}.input_scale"] = torch.tensor(0.01)
    return out


IGNORE = ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate",
          "model.layers.0.self_attn*", "model.layers.1.self_attn*"]


def _logits(model) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=IDS, use_cache=False).logits.float()


def test_modelopt_fp8_per_channel_per_token_loads_as_the_same_compressed_tensors_layout(tiny, tmp_path):
    """ModelOpt's FP8_PER_CHANNEL_PER_TOKEN (a scale per output row, per-token activations) was refused as an
    unknown quant_algo though the loader reads the same numbers from compressed-tensors."""
    from quantbench.models.modelopt import load_quantized

    tensors = _modelopt_tensors(tiny, "fp8")
    mo = _rewrite(tiny, tmp_path / "mo", tensors, {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN",
                                                    "producer": {"name": "modelopt", "version": "0.47.0"},
                                                    "ignore": IGNORE})
    ct = _rewrite(tiny, tmp_path / "ct", tensors, {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                         "strategy": "channel"},
                                      "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                            "dynamic": True}}}})
    got = load_quantized(mo, scheme="fp8", dtype=torch.float32)
    assert (got.layout.producer, got.layout.activations) == ("modelopt", "dynamic")
    assert "per-channel" in got.layout.weight_format
    assert torch.equal(_logits(got.model), _logits(load_quantized(ct, scheme="fp8", dtype=torch.float32).model))


def test_modelopt_w4a16_nvfp4_loads_as_nvfp4_weights_with_16_bit_activations(tiny, tmp_path):
    """ModelOpt's W4A16_NVFP4 (NVFP4 weights, no input_scale) was refused as an unknown quant_algo; it is the NVFP4
    checkpoint's weights run with activations off."""
    from quantbench.models.modelopt import load_quantized

    tensors = _modelopt_tensors(tiny, "nvfp4")
    groups = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}
    w4a16 = _rewrite(tiny, tmp_path / "w4a16", tensors, {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4",
                                                         "config_groups": groups, "ignore": IGNORE})
    scales = {k[: -len("weight_scale_2")] + "input_scale": torch.tensor(0.01) for k in tensors if k.endswith("_2")}
    w4a4 = _rewrite(tiny, tmp_path / "w4a4", {**tensors, **scales}, {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                                                     "config_groups": groups, "ignore": IGNORE})
    got = load_quantized(w4a16, scheme="nvfp4", dtype=torch.float32)
    assert got.layout.activations == "none" and got.layout.weight_format.startswith("nvfp4 w4a16 g16")
    want = load_quantized(w4a4, scheme="nvfp4", activations=False, dtype=torch.float32).model
    assert torch.equal(_logits(got.model), _logits(want))


def test_a_w4a16_nvfp4_run_records_its_activations_off(tiny, tmp_path):
    """The run's record said nvfp4_activations 'on' (the flag's default) for a W4A16 export, whose activations stay
    16-bit: it records what ran."""
    from backends.nvfp4 import Nvfp4Backend
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    groups = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}
    w4a16 = _rewrite(tiny, tmp_path / "w4a16", _modelopt_tensors(tiny, "nvfp4"), {
        "quant_method": "modelopt", "quant_algo": "W4A16_NVFP4", "config_groups": groups, "ignore": IGNORE})
    info = Nvfp4Backend().load(RunSpec(backend="nvfp4", model=str(w4a16), device="cpu", dtype="float32"), detect()).info
    assert info.extra["nvfp4_activations"] == "off" and "w4a16" in info.weight_format


def test_a_group_size_other_than_16_in_a_w4a16_nvfp4_config_is_refused(tiny, tmp_path):
    from quantbench.models.layout import read_layout

    path = _rewrite(tiny, tmp_path / "g32", load_file(str(tiny / "model.safetensors")), {
        "quant_method": "modelopt", "quant_algo": "W4A16_NVFP4",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 32}}}})
    with pytest.raises(QuantbenchError, match="NVFP4 group_size 32"):
        read_layout(path)
