"""INT4 W4A16: the AutoRound quantize wrapper, the int4 expert format, and the int4 backend's two paths."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from backends.int4 import Int4Backend
from quantbench.engine.moe.int4 import (
    Int4Experts,
    pack_k,
    pack_rows,
    regroup_experts,
    rtn_experts,
    unpack_k,
    unpack_rows,
)
from quantbench.errors import ConfigError, LoadError
from quantbench.make.quantize import Recipe, cached_variant, quantize
from quantbench.models.calibration import calibration_texts
from quantbench.models.checkpoint import PROVENANCE_FILE, fingerprint, load_causal_lm
from quantbench.run.spec import RunSpec

CPU = SimpleNamespace(has_gpu=False, gpu_name=None)


# -- the format, without a checkpoint ---------------------------------------------------------------------------
@pytest.mark.parametrize("k_block", [8, 128])
def test_pack_and_unpack_are_inverse(k_block):
    q = torch.randint(0, 16, (3, 256, 24))
    assert torch.equal(unpack_k(pack_k(q, k_block), k_block), q)


def test_the_block_layout_puts_16_consecutive_rows_in_each_nibble():
    q = torch.arange(256).remainder(16).view(256, 1).expand(256, 3)  # row r holds code r % 16
    words = pack_k(q, 128)
    assert torch.equal((words[:16] >> 4) & 0xF, q[16:32])  # nibble 1 of the first 16 words = rows 16..31


def quant_linear(k: int, n: int, group: int, *, sym: bool, seed: int):
    """An auto-round QuantLinear (its torch kernel) holding random int4 codes, scales and zero points."""
    # lazy: importing auto-round takes seconds; only the tests that build QuantLinears need it
    from auto_round_extension.torch.qlinear_torch_zp import QuantLinear

    g = torch.Generator().manual_seed(seed)
    layer = QuantLinear(bits=4, group_size=group, infeatures=k, outfeatures=n, bias=False)
    layer.qweight = pack_rows(torch.randint(0, 16, (k, n), generator=g))
    zeros = torch.full((k // group, n), 8) if sym else torch.randint(1, 16, (k // group, n), generator=g)
    layer.qzeros = pack_rows((zeros - 1).T.contiguous()).T.contiguous()  # stored as zero point - 1, packed along N
    layer.scales = (torch.randn(k // group, n, generator=g) * 0.05).half()  # negative scales too, as AutoRound's
    return layer


def per_expert_mlps(experts: int, hidden: int, inter: int, group: int, *, sym: bool):
    mlps = torch.nn.ModuleList()
    for e in range(experts):
        mlp = torch.nn.Module()
        mlp.gate_proj = quant_linear(hidden, inter, group, sym=sym, seed=3 * e)
        mlp.up_proj = quant_linear(hidden, inter, group, sym=sym, seed=3 * e + 1)
        mlp.down_proj = quant_linear(inter, hidden, group, sym=sym, seed=3 * e + 2)
        mlps.append(mlp)
    return mlps


@pytest.mark.parametrize("sym", [True, False])
def test_regrouped_experts_compute_what_autorounds_own_kernel_computes(sym):
    mlps = per_expert_mlps(3, 256, 128, 64, sym=sym)
    gate_up, down = regroup_experts(mlps, sym=sym)
    assert gate_up.format == f"int4-g64-{'sym' if sym else 'asym'}"
    w_gu, w_dn = gate_up.dequantize(torch.float32), down.dequantize(torch.float32)
    x = torch.randn(5, 256)
    for e, mlp in enumerate(mlps):
        mlp.float()  # auto-round's kernel then dequantizes in float32 too: the comparison is exact
        want = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
        torch.testing.assert_close(x @ w_gu[e].T, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(want[:, :128] @ w_dn[e].T, mlp.down_proj(want[:, :128]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("e,n,k,g,k_block", [(8, 512, 256, 128, 128), (3, 48, 256, 32, 128), (4, 64, 96, 32, 8),
                                               (2, 32, 256, 40, 128)])
def test_cpu_dequantize_is_bit_identical_to_the_formula_in_every_layout(e, n, k, g, k_block):
    """(q - z) * s in float32, rounded once: slice by slice (dequantize_slices), or by the whole-block fallback
    where a group does not hold whole 16-row slices (g = 40), asymmetric zero points, any subset of experts."""
    torch.manual_seed(e + k)
    q = torch.randint(0, 16, (e, k, n))
    groups = -(-k // g)
    scales = (torch.randn(e, groups, n) * 0.01).half()
    zeros = torch.randint(0, 16, (e, groups, n), dtype=torch.uint8)
    fmt = Int4Experts(pack_k(q, k_block), scales, zeros, g, False, "t", k_block)
    z = zeros.float().repeat_interleave(g, dim=1)[:, :k]
    s = scales.float().repeat_interleave(g, dim=1)[:, :k]
    for dtype in (torch.bfloat16, torch.float32):
        want = ((q.float() - z) * s).to(dtype).transpose(-2, -1)
        assert torch.equal(fmt.dequantize(dtype), want)
        assert torch.equal(fmt.dequantize(dtype, torch.tensor([e - 1, 0])), want[[e - 1, 0]])


def test_zero_points_are_read_from_qzeros_not_assumed():
    """auto_round:auto_gptq stores zero point - 1 in qzeros, packed along N: the loader's own unpacking
    (Int4Experts.from_quant_linears) must give back the zero points written, and dequantize must subtract them."""
    layer = quant_linear(128, 64, 128, sym=False, seed=0)
    zeros = torch.tensor([1, 15, 8, 2, 9, 4, 12, 7] * 8)  # one group of 64 outputs, asymmetric: none of them 8 - 1
    layer.qzeros = pack_rows((zeros - 1).view(1, 64).T.contiguous()).T.contiguous()
    fmt = Int4Experts.from_quant_linears([[layer]], group_size=128, sym=False, name="t")
    assert fmt.zeros[0, 0].tolist() == zeros.tolist()
    q = unpack_rows(layer.qweight).float()  # [K, N]
    want = (layer.scales.float() * (q - zeros.float())).T
    assert torch.equal(fmt.dequantize(torch.float32)[0], want)


def test_wrong_bits_are_a_load_error_naming_the_tensor():
    mlps = per_expert_mlps(2, 128, 128, 128, sym=True)
    mlps[1].down_proj.bits = 8
    with pytest.raises(LoadError, match=r"experts\.1\.down_proj: 8-bit"):
        regroup_experts(mlps, sym=True)


def test_scales_of_the_wrong_shape_are_a_load_error_naming_the_tensor():
    mlps = per_expert_mlps(2, 128, 128, 64, sym=True)
    mlps[0].up_proj.scales = mlps[0].up_proj.scales[:1]
    with pytest.raises(LoadError, match=r"experts\.0\.up_proj\.scales: shape"):
        regroup_experts(mlps, sym=True)


def test_a_symmetric_config_over_asymmetric_zero_points_is_refused():
    mlps = per_expert_mlps(2, 128, 128, 128, sym=False)
    with pytest.raises(LoadError, match="sym=true but the zero points are not 8"):
        regroup_experts(mlps, sym=True)


def test_int4_experts_take_under_30_percent_of_bf16_bytes_at_the_30b_shape():
    # 4 of the 128 experts of one Qwen3-30B-A3B layer: gate_up [2*768, 2048], down [2048, 768]
    for n, k in ((1536, 2048), (2048, 768)):
        w = rtn_experts(torch.randn(4, n, k, dtype=torch.bfloat16))
        assert w.nbytes() <= 0.30 * (4 * n * k * 2)
        assert w.nbytes() == sum(t.numel() * t.element_size() for t in (w.qweight, w.scales, w.zeros))


def test_rtn_rounds_each_weight_to_within_half_a_step():
    w = torch.randn(2, 64, 256)
    q = rtn_experts(w)
    step = q.scales.float().repeat_interleave(128, dim=1).transpose(-2, -1)  # [E, N, K]
    assert bool(((q.dequantize(torch.float32) - w).abs() <= step / 2 + 1e-6).all())


INTERPRETED_KERNEL_CHECK = """
import torch
from torch.nn.functional import silu
from quantbench.engine.moe.int4 import Int4Experts
from quantbench.engine.moe.int4_kernels import int4_grouped_mm, triton_dequantize
torch.manual_seed(0)
worst = 0.0
cases = [(False, 128, (4, 256, 96), [5, 0, 16, 9], None), (True, 32, (3, 128, 64), [40, 1, 0], "swap"),
         (False, 256, (2, 512, 32), [3, 17], "plain"), (True, 32, (2, 384, 32), [17, 4], "plain"),
         (False, 256, (2, 512, 64), [30, 2], "swap")]
for sym, group, (e, k, n), counts, layout in cases:
    w = Int4Experts(torch.randint(-(2**31), 2**31 - 1, (e, k // 8, n), dtype=torch.int32),
                    (torch.randn(e, k // group, n) * 0.02).half(),
                    torch.randint(0, 16, (e, k // group, n), dtype=torch.uint8), group, sym=sym, k_block=128)
    cfg = layout and {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2,
                      "SWAP_AB": layout == "swap"}
    offsets = torch.cumsum(torch.tensor(counts), 0).to(torch.int32)
    x = torch.randn(sum(counts), k).half()
    dense, bounds = w.dequantize(torch.float64, use_triton=False), [0] + offsets.tolist()
    want = torch.cat([x[a:b].double() @ dense[i].T for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    y = torch.full((x.shape[0], n), float("nan"), dtype=torch.float16)  # poisoned: unwritten rows stay NaN
    int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, group, cfg, out=y)
    worst = max(worst, float((y.double() - want).norm() / want.norm()))
    # the engine's fused call: rows gathered from unsorted tokens, SwiGLU, routing weights
    tokens = x[::2].contiguous()
    index = torch.arange(x.shape[0], dtype=torch.int32) // 2
    scale = torch.rand(x.shape[0])
    y = int4_grouped_mm(tokens, w.qweight, w.scales, w.zeros, offsets, group, cfg, row_index=index, swiglu=True,
                        row_scale=scale)
    ref = torch.cat([tokens[index[a:b].long()].double() @ dense[i].T for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    gate, up = ref.chunk(2, dim=-1)
    ref = silu(gate) * up * scale.double()[:, None]
    worst = max(worst, float((y.double() - ref).norm() / ref.norm()))
    # rows written back through a permutation (the engine's down projection, in (token, slot) order)
    dest = torch.randperm(x.shape[0]).to(torch.int32)
    y = torch.full((x.shape[0], n), float("nan"), dtype=torch.float16)
    int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, group, cfg, out=y, row_scale=scale, row_dest=dest)
    ref = torch.empty_like(want)
    ref[dest.long()] = want * scale.double()[:, None]
    worst = max(worst, float((y.double() - ref).norm() / ref.norm()))
    unpacked = torch.empty(e, k, n)
    assert torch.equal(triton_dequantize(w.qweight, w.scales, w.zeros, group, 128, unpacked).transpose(1, 2),
                       w.dequantize(torch.float32, use_triton=False))
print(worst)
"""


def test_fused_kernel_matches_the_reference_under_the_triton_interpreter():
    """The Triton kernel's indexing (expert tiles, empty experts, groups, zero points) on the CPU: the
    interpreter runs the same kernel source the GPU compiles. (Its speed is measured on the H200.)"""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")  # read when triton is imported: a fresh process
    done = subprocess.run([sys.executable, "-c", INTERPRETED_KERNEL_CHECK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-2  # fp16 rounding of the weights, no NaN (unwritten)


# -- calibration and the quantize verb --------------------------------------------------------------------------
def test_calibration_texts_are_rendered_train_records_of_at_least_seqlen_tokens():
    from quantbench.make.fixture import build_tokenizer
    from quantbench.protocol.prompt import answer_text, render_prompt
    from quantbench.protocol.suitegen import generate, split_of

    tokenizer = build_tokenizer()
    texts = calibration_texts(tokenizer, 4, 128)
    assert len(texts) == 4
    assert all(len(tokenizer(t)["input_ids"]) >= 128 for t in texts)
    first = generate("train", 64)[0]
    name, question = next(iter(first.request.questions.items()))
    expected = render_prompt(tokenizer, first.request, name) + answer_text(tokenizer, question, first.gold[name])
    assert texts[0].startswith(expected + "\n\n")
    assert split_of(first.request.model_dump(exclude_defaults=True)) == "train"


def test_quantize_refuses_a_non_empty_output_directory(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        quantize(tmp_path / "src", "int4", tmp_path / "out")


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="--scheme"):
        Recipe("int3")


def test_plain_rtn_is_a_recipe_of_its_own_and_the_default_keeps_its_cache_key():
    default = Recipe("int4")
    assert "opt_rtn" not in default.to_dict()  # keys made before the choice existed stay valid
    assert default.hash == hashlib.sha256(json.dumps(
        {"scheme": "int4", "iters": 0, "nsamples": 128, "seqlen": 512, "group_size": 128, "experts_only": True,
         "seed": 0}, sort_keys=True).encode()).hexdigest()
    plain = Recipe("int4", opt_rtn=False)
    assert plain.to_dict()["opt_rtn"] is False and plain.hash != default.hash
    with pytest.raises(ConfigError, match="--plain-rtn"):
        Recipe("int4", iters=200, opt_rtn=False)


def test_quantize_takes_a_checkpoint_or_a_synthetic_shape_and_says_which_when_neither_fits(tmp_path):
    with pytest.raises(ConfigError, match="--model .* or --shape"):
        quantize(None, "int4", tmp_path / "out")
    with pytest.raises(ConfigError, match="--model .* or --shape"):
        quantize(tmp_path, "int4", tmp_path / "out", shape="qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="only int4 is quantized from memory"):
        quantize(None, "nvfp4", tmp_path / "out", shape="qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="--shape 'qwen9'"):
        quantize(None, "int4", tmp_path / "out", shape="qwen9")


SYNTHETIC_QUANTIZE = """
import json, sys
from pathlib import Path
from quantbench.models.families.qwen3_moe.family import SHAPES as TEXT_SHAPES
from quantbench.models.checkpoint import model_identity
from quantbench.make.quantize import quantize
import auto_round

made_with, real = {}, auto_round.AutoRound  # what AutoRound was asked for: --plain-rtn must reach it
auto_round.AutoRound = lambda *args, **kwargs: (made_with.update(kwargs), real(*args, **kwargs))[1]

# a small shape of the same family (the real one is 61 GB): registered for this process only
TEXT_SHAPES["test-moe"] = dict(TEXT_SHAPES["qwen3-30b-a3b"], hidden_size=256,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=128, intermediate_size=512, vocab_size=2048)
out = Path(sys.argv[1])
quantize(None, "int4", out, shape="test-moe", layers=2, weights_seed=3, nsamples=4, seqlen=64, progress=False,
         opt_rtn=False)
prov = json.loads((out / "quantbench_provenance.json").read_text())
assert prov["recipe"]["opt_rtn"] is False, prov["recipe"]  # plain RTN, as h200.sh's autoround part asks
assert made_with.get("disable_opt_rtn") is True, sorted(made_with)
assert prov["weights"] == "synthetic" and prov["source_model_id"] == "synthetic-test-moe-2l-seed3", prov
assert prov["source_model_hash"].startswith("synthetic:") and prov["source_model_path"].startswith("synthetic:")
ident = model_identity(out)
assert ident["weights"] == "synthetic" and ident["model_id"] == "synthetic-test-moe-2l-seed3", ident
config = json.loads((out / "config.json").read_text())
assert config["quantization_config"]["quant_method"] == "auto-round" and config["num_hidden_layers"] == 2
print("ok")
"""


def test_quantize_from_a_synthetic_shape_writes_no_bf16_checkpoint_and_says_synthetic(tmp_path):
    """`quantize --shape` quantizes the model `run --shape` builds, from memory (in a child: auto_round's import
    patches transformers for the rest of its process)."""
    done = subprocess.run([sys.executable, "-c", SYNTHETIC_QUANTIZE, str(tmp_path / "int4")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
    # No BF16 checkpoint was written: only the variant and, beside it, the libraries' log of the quantize step.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["int4", "int4.quantize.log"]


# -- a real checkpoint: the default model, quantized once (RTN) by AutoRound through quantbench -----------------
RECIPE = {"nsamples": 8, "seqlen": 128}


@pytest.fixture(scope="module")
def source():
    from quantbench.make.fixture import default_model_dir

    return default_model_dir(progress=False)


@pytest.fixture(scope="module")
def variant(source, tmp_path_factory):
    cache = tmp_path_factory.mktemp("qbcache")
    old = os.environ.get("QUANTBENCH_CACHE")
    os.environ["QUANTBENCH_CACHE"] = str(cache)
    try:
        yield cached_variant(source, "int4", **RECIPE)
    finally:
        if old is None:
            os.environ.pop("QUANTBENCH_CACHE")
        else:
            os.environ["QUANTBENCH_CACHE"] = old


def load(path, fast, dtype="float32"):
    return Int4Backend().load(RunSpec(backend="int4", model=str(path), dtype=dtype, fast_moe=fast, device="cpu"), CPU)


@pytest.mark.slow
def test_the_variant_is_a_plain_autoround_checkpoint_with_provenance(source, variant):
    config = json.loads((variant / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["packing_format"]) == ("auto-round", "auto_round:auto_gptq")
    assert (config["bits"], config["group_size"], config["sym"]) == (4, 128, True)
    prov = json.loads((variant / PROVENANCE_FILE).read_text())
    assert prov["source_model_hash"] == fingerprint(source)
    assert prov["recipe"] == Recipe("int4", **RECIPE).to_dict()
    assert prov["libraries"]["auto-round"] and prov["seconds"] > 0
    assert variant.name == f"{fingerprint(source)[:16]}-{Recipe('int4', **RECIPE).hash[:16]}"


@pytest.mark.slow
def test_experts_only_keeps_attention_router_embeddings_and_lm_head_in_bf16(variant):
    tensors = load_file(variant / "model.safetensors")
    for name, t in tensors.items():
        if ".experts." in name:
            assert name.rsplit(".", 1)[-1] in ("qweight", "qzeros", "scales"), name
        else:
            assert t.dtype == torch.bfloat16, name


@pytest.mark.slow
def test_the_cached_variant_is_reused_not_requantized(source, variant):
    stamp = (variant / PROVENANCE_FILE).stat().st_mtime_ns
    assert cached_variant(source, "int4", **RECIPE) == variant
    assert (variant / PROVENANCE_FILE).stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_fast_path_agrees_with_autorounds_per_expert_path_on_the_default_suite(variant):
    from quantbench.protocol.suite import load_suite

    records = load_suite(None).records
    engines = {fast: load(variant, fast).engine for fast in (True, False)}
    assert "cpu-vectorised" in load(variant, True).info.kernel_path
    worst, tops = 0.0, 0
    for i in range(0, len(records), 32):
        batch = records[i : i + 32]
        got = {fast: e.forward_many([e.prepare(r.request) for r in batch]) for fast, e in engines.items()}
        for fast_answers, slow_answers in zip(got[True], got[False], strict=True):
            for q, a in fast_answers.items():
                b = slow_answers[q]
                worst = max(worst, max(abs(a.probabilities[o] - b.probabilities[o]) for o in a.probabilities))
                assert a.top == b.top, q
                tops += 1
    assert worst <= 1e-3
    assert tops >= len(records)


@pytest.mark.slow
def test_each_fast_layer_matches_a_dequantized_transformers_block(variant, source):
    """Layer by layer: the engine on int4 vs transformers' own BF16-style MoE block holding the weights that
    auto-round's kernel dequantizes (read back through the identity), both in float32."""
    # lazy: importing transformers takes seconds; only this test needs it
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    slow, fast = load(variant, False).model, load(variant, True).model
    config = fast.config
    for i, (s_layer, f_layer) in enumerate(zip(slow.model.layers, fast.model.layers, strict=True)):
        block = Qwen3MoeSparseMoeBlock(config).float()
        eye = torch.eye(config.hidden_size)
        eye_i = torch.eye(config.moe_intermediate_size)
        with torch.no_grad():
            block.gate.weight.copy_(s_layer.mlp.gate.weight)
            for e, mlp in enumerate(s_layer.mlp.experts):
                block.experts.gate_up_proj[e] = torch.cat([mlp.gate_proj(eye), mlp.up_proj(eye)], dim=-1).T
                block.experts.down_proj[e] = mlp.down_proj(eye_i).T
        x = torch.randn(2, 24, config.hidden_size)
        with torch.inference_mode():
            torch.testing.assert_close(f_layer.mlp(x), block(x), rtol=1e-4, atol=1e-5, msg=f"layer {i}")


@pytest.mark.slow
def test_int4_experts_in_memory_take_under_30_percent_of_the_bf16_experts(variant, source):
    bf16 = load_causal_lm(source, dtype=torch.bfloat16, device="cpu")
    bf16_bytes = sum(p.numel() * p.element_size() for n, p in bf16.named_parameters() if ".experts." in n)
    info = load(variant, True, dtype="bfloat16").info
    assert info.experts_bytes <= 0.30 * bf16_bytes
    assert info.weight_format == "int4 w4a16 g128 sym (auto_round:auto_gptq)"
    per_expert = load(variant, False, dtype="bfloat16").info
    assert per_expert.kernel_path.startswith("auto-round per-expert loop")


@pytest.mark.slow
def test_a_checkpoint_missing_a_scales_tensor_is_a_load_error_naming_it(variant, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(variant, broken)
    tensors = load_file(broken / "model.safetensors")
    gone = "model.layers.1.mlp.experts.3.down_proj.scales"
    del tensors[gone]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoadError, match=gone.replace(".", r"\.")):
        load(broken, True)


@pytest.mark.slow
def test_a_config_that_does_not_match_the_tensors_is_a_load_error(variant, tmp_path):
    for key, value, message in (("bits", 8, "bits is 8"), ("group_size", 64, "scales")):
        broken = tmp_path / f"broken-{key}"
        shutil.copytree(variant, broken)
        config = json.loads((broken / "config.json").read_text())
        config["quantization_config"][key] = value
        (broken / "config.json").write_text(json.dumps(config))
        with pytest.raises(LoadError, match=message):
            load(broken, True)


def test_a_bf16_checkpoint_is_refused_by_the_int4_backend(tmp_path):
    from tests.tiny import save_tiny

    with pytest.raises(LoadError, match="no quantization_config"):
        load(save_tiny(tmp_path / "bf16"), True)


@pytest.mark.slow
def test_a_bf16_moe_checkpoint_still_loads_after_an_int4_load(tmp_path, variant):
    """Loading an auto-round checkpoint changes transformers' global conversion mapping; the backend puts it
    back, so a BF16 MoE checkpoint loaded later in the same process gets its real experts."""
    from tests.tiny import save_tiny

    load(variant, True)
    model = load_causal_lm(save_tiny(tmp_path / "bf16"), dtype=torch.bfloat16, device="cpu")
    assert type(model.model.layers[0].mlp).__name__ == "Qwen3MoeSparseMoeBlock"

