"""NVFP4: the E2M1 code and two-level scale as ModelOpt defines them, the packed format in the grouped-MoE engine,
the fused Triton kernel (under Triton's CPU interpreter), and the loader for ModelOpt / compressed-tensors /
auto-round checkpoints — each checked against ModelOpt's own code or against hand-made tensors of known value."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantbench.engine.moe import nvfp4 as nv
from quantbench.engine.moe import nvfp4_numbers as nvn
from quantbench.engine.triton_common import triton
from quantbench.errors import LoadError
from tests.interpreted import run_interpreted
from tests.tiny import save_tiny

ROOT = Path(__file__).resolve().parents[1]


# -- shared with tests/test_fp8.py ----------------------------------------------------------------------------------
VARIANTS = {"nvfp4": ("nvfp4", True), "nvfp4-full": ("nvfp4", False), "fp8": ("fp8", True), "fp8-full": ("fp8", False)}


@functools.cache
def modelopt_variants() -> dict[str, Path]:
    """The tiny random model and its ModelOpt variants, made once per test session by the real ModelOpt in one
    child process (mtq.quantize patches module classes in the process that runs it)."""
    root = Path(tempfile.mkdtemp(prefix="quantbench-modelopt-"))
    atexit.register(shutil.rmtree, root, True)
    src = save_tiny(root / "bf16")
    code = ("import sys, json; from quantbench.make.quantize.modelopt import quantize_modelopt\n"
            "for out, (scheme, experts_only) in json.loads(sys.argv[2]).items():\n"
            "    quantize_modelopt(sys.argv[1], scheme, out, nsamples=4, seqlen=64, experts_only=experts_only,"
            " progress=False, device='cpu')")
    jobs = {str(root / name): job for name, job in VARIANTS.items()}
    done = subprocess.run([sys.executable, "-c", code, str(src), json.dumps(jobs)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"bf16": src, **{name: root / name for name in VARIANTS}}


def rewrite(src: Path, dst: Path, *, config: dict | None = None, rename=None, drop: str | None = None,
            add: dict | None = None) -> Path:
    """Copy a checkpoint, changing its config's quantization_config and its tensors (to hand-make layouts)."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    out = {}
    for k, t in tensors.items():
        if k == drop:
            continue
        new = rename(k, t) if rename else (k, t)
        if new is not None:
            out[new[0]] = new[1]
    out.update(add or {})
    save_file(out, str(dst / "model.safetensors"))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = config
        (dst / "config.json").write_text(json.dumps(cfg))
        (dst / "hf_quant_config.json").unlink(missing_ok=True)
    return dst


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.float()


IDS = torch.tensor([[5, 17, 33, 2, 90, 14, 61, 7, 7, 300, 42, 11, 150, 9, 3, 27]])


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return modelopt_variants()["bf16"]


@pytest.fixture(scope="module")
def nvfp4_dir() -> Path:
    return modelopt_variants()["nvfp4"]


# -- E2M1 and the two-level scale, on hand-made tensors -------------------------------------------------------------
def test_e2m1_codes_decode_to_the_modelopt_table_low_nibble_first():
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import e2m1_values

    packed = torch.tensor([[0x21, 0xF8, 0x7A]], dtype=torch.uint8)  # codes 1,2 | 8,15 | 10,7
    values = nvn.decode_e2m1(nvn.unpack_codes(packed))
    assert values.tolist() == [[0.5, 1.0, -0.0, -6.0, -1.0, 6.0]]
    every = nvn.decode_e2m1(torch.arange(16, dtype=torch.uint8))
    assert torch.equal(every, e2m1_values.float())
    assert torch.equal(nvn.pack_codes(nvn.unpack_codes(packed)), packed)


def test_two_level_scale_is_e4m3_block_scale_times_fp32_global_scale():
    codes = torch.zeros(2, 32, dtype=torch.uint8)
    codes[0, :16] = 7  # 6.0
    codes[0, 16:] = 9  # -0.5
    codes[1, :] = 3  # 1.5
    block = torch.tensor([[2.0, 0.25], [448.0, 0.001953125]]).to(torch.float8_e4m3fn)
    w = nvn.dequantize(nvn.pack_codes(codes), block, torch.tensor([0.5, 4.0]), torch.float32)
    assert w[0, :16].eq(6.0 * 2.0 * 0.5).all() and w[0, 16:].eq(-0.5 * 0.25 * 0.5).all()
    assert w[1, :16].eq(1.5 * 448.0 * 4.0).all() and w[1, 16:].eq(1.5 * 2**-9 * 4.0).all()


def test_rounding_to_e2m1_ties_go_to_the_even_code_and_saturate_at_six():
    scaled = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 100.0, -0.74, -3.0])
    assert nvn.round_to_e2m1(scaled).tolist() == [0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -3.0]


def test_quantize_and_dequantize_are_bit_identical_to_modelopt():
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    torch.manual_seed(0)
    weight = torch.randn(3, 48, 64, dtype=torch.bfloat16) * torch.rand(3, 48, 1, dtype=torch.bfloat16)
    packed, block, gs = nvn.quantize(weight)
    for e in range(3):
        q, ref_block, ref_gs = NVFP4QTensor.quantize(weight[e].clone(), 16)
        assert torch.equal(q._quantized_data, packed[e])
        assert torch.equal(ref_block.view(torch.uint8), block[e].view(torch.uint8))
        assert torch.equal(ref_gs, gs[e])
        ref = q.dequantize(torch.bfloat16, scale=ref_block, double_scale=ref_gs, block_sizes={-1: 16})
        assert torch.equal(ref, nvn.dequantize(packed[e], block[e], gs[e].expand(48), torch.bfloat16))


def test_activation_fake_quant_follows_modelopts_dynamic_block_definition():
    gs = torch.tensor(1 / 448)  # global amax 6: a block of amax 6 gets scale e4m3(448) * gs = 1
    x = torch.zeros(3, 16)
    x[0] = torch.tensor([6.0, 0.3, -0.74, 1.25, 2.6, -5.2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.1])
    x[1] = x[0] / 3  # amax 2: scale = e4m3(448 / 3 = 149.33 -> 144) * gs = 0.3214...
    x[2, 0] = 1e-9  # scale below 1e-5: ModelOpt uses 1.0, so the value rounds to 0
    out = nvn.fake_quantize_activations(x, gs)
    assert out[0].tolist()[:6] == [6.0, 0.5, -0.5, 1.0, 3.0, -6.0] and out[0, 15] == 0.0
    scale = 144 / 448
    expected = nvn.round_to_e2m1(x[1] / scale) * scale
    assert torch.allclose(out[1], expected, rtol=1e-6, atol=0) and out[1, 0] == pytest.approx(6 * scale)
    assert out[2].eq(0).all()
    per_row = nvn.fake_quantize_activations(x[:2], torch.tensor([1 / 448, 1 / 448]))
    assert torch.equal(per_row, out[:2])
    assert out.dtype == x.dtype and nvn.fake_quantize_activations(x.bfloat16(), gs).dtype == torch.bfloat16


def test_packed_experts_take_under_35_percent_of_bf16_at_the_fixture_shape():
    weight = torch.randn(8, 512, 256, dtype=torch.bfloat16)
    packed = nv.Nvfp4Experts.from_weights(weight)
    assert packed.nbytes() <= 0.35 * weight.numel() * 2
    assert packed.unpacked(torch.bfloat16).nbytes() == weight.numel() * 2


@pytest.mark.skipif(triton is None, reason="triton is not installed")
def test_fused_triton_kernels_match_their_references_under_the_interpreter():
    """The GPU kernels' exact code, run by Triton's CPU interpreter: the grouped GEMM on fresh random inputs with
    uneven expert counts (one expert empty, one with a partial tile) against dequantize + a float32 matmul, and
    the activation fake-quant (shared and per-expert scales) against the torch definition, element for element."""
    code = """
import torch
from quantbench.engine.moe import nvfp4 as nv
from quantbench.engine.moe import nvfp4_numbers as nvn
from quantbench.engine.triton_common import expert_of_rows
torch.manual_seed(1)
e, n, k = 5, 48, 64
fmt = nv.Nvfp4Experts.from_weights(torch.randn(e, n, k))
counts = torch.tensor([3, 0, 17, 1, 9])
offsets = torch.cumsum(counts, 0, dtype=torch.int32)
x = torch.randn(int(counts.sum()), k).bfloat16()
y = nv.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale, offsets,
                        config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32})
w = fmt.dequantize(torch.bfloat16).float()[expert_of_rows(offsets, x.shape[0])]
ref = torch.einsum("sk,snk->sn", x.float(), w)
err = ((y.float() - ref).norm() / ref.norm()).item()
assert err < 4e-3, err
assert (y.float() - ref).abs().max() <= ref.abs().max() * 2**-7
# the fused activation fake-quant: float32 in and out (the interpreter's casts to bf16 / fp8 truncate)
xa = torch.randn(30, 64) * 3
scales = torch.tensor([4.0, 1.0, 8.0, 0.5, 2.0]) / 2688
offs = torch.tensor([3, 3, 20, 21, 30], dtype=torch.int32)
assert torch.equal(nv.fake_quantize_activations_fused(xa, scales[:1]), nvn.fake_quantize_activations(xa, scales[0]))
per_expert = nvn.fake_quantize_activations(xa, scales[expert_of_rows(offs, 30)])
assert torch.equal(nv.fake_quantize_activations_fused(xa, scales, offs), per_expert)
print("ok", err)
"""
    run_interpreted(code)


@pytest.mark.skipif(triton is None, reason="triton is not installed")
def test_fused_steps_match_the_unfused_reference_in_both_orientations_under_the_interpreter():
    """The engine's fused steps in the NVFP4 kernel: token gather + SwiGLU for gate_up, routing weights + scatter
    back to (token, slot) order for down, with the weights on the MMA's M side (SWAP_AB) and without."""
    run_interpreted("""
import torch
from quantbench.engine.moe import nvfp4 as nv
from tests.interpreted import check_fused_steps
torch.manual_seed(2)
fmt = nv.Nvfp4Experts.from_weights(torch.randn(5, 48, 64))
check_fused_steps(lambda x, offsets, cfg, **steps: nv.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale,
                                                                       offsets, cfg, **steps), fmt)
print("ok")
""")


def test_one_input_scale_lets_the_engine_quantize_tokens_before_the_gather():
    """Rows quantized with one scale for every expert can be quantized before routing (the fused gather reads
    them); per-expert scales cannot (each row needs its expert's)."""
    weight = torch.randn(3, 32, 64)
    assert nv.Nvfp4Experts.from_weights(weight, input_scale=torch.tensor([0.01])).input_quant_rowwise
    assert not nv.Nvfp4Experts.from_weights(weight, input_scale=torch.tensor([0.01, 0.02, 0.03])).input_quant_rowwise
    assert nv.Nvfp4Experts.from_weights(weight, input_scale=torch.tensor([0.01]), activations=False).input_quant_rowwise
    assert nv.Nvfp4Experts.from_weights(weight).input_quant_rowwise  # no input scale: weights only (W4A16)


# -- the engine path --------------------------------------------------------------------------------------------------
def _loop_reference(x, gate_up, down, index, weights, s_in, s_down):
    """A per-expert Python loop (the transformers eager path) with the same W4A4 emulation: independent of the
    engine's sorting, offsets and grouped matmul."""
    out = torch.zeros_like(x, dtype=torch.float32)
    wg, wd = gate_up.float(), down.float()
    for t in range(x.shape[0]):
        for j in range(index.shape[1]):
            e = int(index[t, j])
            xi = nvn.fake_quantize_activations(x[t : t + 1], s_in) if s_in is not None else x[t : t + 1]
            g, u = (xi.float() @ wg[e].T).to(x.dtype).chunk(2, dim=-1)
            h = (torch.nn.functional.silu(g) * u)
            h = nvn.fake_quantize_activations(h, s_down) if s_down is not None else h
            out[t] += float(weights[t, j]) * (h.float() @ wd[e].T).to(x.dtype)[0].float()
    return out


@pytest.mark.parametrize("activations", [True, False])
def test_grouped_engine_quantizes_each_projections_input_like_a_per_expert_loop(activations):
    from quantbench.engine.moe.engine import GroupedMoE, route

    torch.manual_seed(2)
    e, h, i, tokens = 6, 64, 32, 20
    gate_up = nv.Nvfp4Experts.from_weights(torch.randn(e, 2 * i, h) * 0.1, input_scale=torch.tensor([3.0 / 2688]),
                                           activations=activations)
    down = nv.Nvfp4Experts.from_weights(torch.randn(e, h, i) * 0.1, input_scale=torch.tensor([0.5 / 2688]),
                                        activations=activations)
    router = torch.nn.Linear(h, e, bias=False)
    moe = GroupedMoE(router, gate_up, down, top_k=2, norm_topk_prob=True)
    x = torch.randn(tokens, h)
    with torch.no_grad():
        weights, index = route(x, router.weight, 2, True)
        got = moe.experts_forward(x, index, weights)
    s_in, s_down = (gate_up.input_scale, down.input_scale) if activations else (None, None)
    ref = _loop_reference(x, gate_up.dequantize(torch.float32), down.dequantize(torch.float32), index, weights,
                          s_in, s_down)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)
    def weights_only(f):
        return nv.Nvfp4Experts(f.packed, f.block_scale, f.global_scale, f.input_scale, activations=False)

    plain = GroupedMoE(router, weights_only(gate_up), weights_only(down), top_k=2, norm_topk_prob=True)
    with torch.no_grad():
        assert activations == (not torch.allclose(plain.experts_forward(x, index, weights), got))


# -- the loader on real ModelOpt exports and hand-made layouts ---------------------------------------------------------
def test_modelopt_export_loads_and_matches_modelopt_dequantized_experts_layer_by_layer(tiny_dir, nvfp4_dir):
    """Weights only (activations off): each MoE layer's output equals transformers' own eager experts running on
    weights dequantized by ModelOpt's NVFP4QTensor from the exported tensors."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    from quantbench.models.checkpoint import load_causal_lm
    from quantbench.models.modelopt import load_quantized

    mine = load_quantized(nvfp4_dir, scheme="nvfp4", activations=False).model
    ref = load_causal_lm(tiny_dir, dtype=torch.bfloat16, device="cpu", experts_implementation="eager")
    tensors = load_file(str(nvfp4_dir / "model.safetensors"))

    def deq(prefix):
        w = tensors[f"{prefix}.weight"]
        q = NVFP4QTensor(torch.Size([w.shape[0], w.shape[1] * 2]), torch.bfloat16, w)
        return q.dequantize(torch.bfloat16, scale=tensors[f"{prefix}.weight_scale"],
                            double_scale=tensors[f"{prefix}.weight_scale_2"], block_sizes={-1: 16})

    torch.manual_seed(3)
    for layer in range(2):
        experts = ref.model.layers[layer].mlp.experts
        p = f"model.layers.{layer}.mlp.experts"
        with torch.no_grad():
            for e in range(experts.num_experts):
                experts.gate_up_proj[e] = torch.cat([deq(f"{p}.{e}.gate_proj"), deq(f"{p}.{e}.up_proj")])
                experts.down_proj[e] = deq(f"{p}.{e}.down_proj")
        hidden = torch.randn(1, 24, 128, dtype=torch.bfloat16)
        with torch.inference_mode():
            want = ref.model.layers[layer].mlp(hidden).float()
            got = mine.model.layers[layer].mlp(hidden).float()
        assert ((got - want).norm() / want.norm()).item() < 5e-3
    # everything outside the experts is the BF16 checkpoint's, bit for bit
    assert torch.equal(mine.model.layers[0].self_attn.q_proj.weight, ref.model.layers[0].self_attn.q_proj.weight)


def test_packed_and_unpacked_give_identical_logits_and_unpacked_is_bf16_sized(nvfp4_dir):
    from quantbench.engine.moe.engine import experts_nbytes
    from quantbench.models.modelopt import load_quantized

    packed = load_quantized(nvfp4_dir, scheme="nvfp4", mode="packed").model
    unpacked = load_quantized(nvfp4_dir, scheme="nvfp4", mode="unpacked").model
    assert torch.equal(logits(packed, IDS), logits(unpacked, IDS))
    bf16_experts = 2 * 8 * (2 * 64 * 128 + 128 * 64) * 2
    assert bf16_experts <= experts_nbytes(unpacked) <= bf16_experts + 64  # + one activation scale per projection
    assert experts_nbytes(packed) <= 0.35 * bf16_experts
    off = load_quantized(nvfp4_dir, scheme="nvfp4", activations=False).model
    assert not torch.equal(logits(off, IDS), logits(packed, IDS))


def _ct_rename(k, t):
    """ModelOpt names -> compressed-tensors / auto-round names (global and input scales as reciprocals)."""
    if k.endswith(".weight") and t.dtype == torch.uint8:
        return k[: -len("weight")] + "weight_packed", t
    if k.endswith(".weight_scale_2"):
        return k[: -len("weight_scale_2")] + "weight_global_scale", (1.0 / t).reshape(1)
    if k.endswith(".input_scale"):
        return k[: -len("input_scale")] + "input_global_scale", (1.0 / t).reshape(1)
    return k, t


CT_CONFIG = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"],
                                           "weights": {"num_bits": 4, "type": "float", "group_size": 16,
                                                       "strategy": "tensor_group"},
                                           "input_activations": {"num_bits": 4, "type": "float", "group_size": 16,
                                                                 "dynamic": "local", "strategy": "tensor_group"}}},
             "ignore": ["lm_head"]}
AR_CONFIG = {"quant_method": "auto-round", "packing_format": "auto_round:llm_compressor", "data_type": "nv_fp",
             "bits": 4, "group_size": 16, "sym": True, "act_bits": 4, "act_data_type": "nv_fp4_with_static_gs",
             "act_group_size": 16, "autoround_version": "0.16.1"}


@pytest.mark.parametrize("config", [CT_CONFIG, AR_CONFIG], ids=["compressed-tensors", "auto-round"])
def test_compressed_tensors_and_autoround_layouts_load_to_the_same_model(nvfp4_dir, tmp_path, config):
    from quantbench.models.modelopt import load_quantized

    other = rewrite(nvfp4_dir, tmp_path / "other", config=config, rename=_ct_rename)
    got = load_quantized(other, scheme="nvfp4")
    assert got.layout.producer == config["quant_method"] and got.layout.activations == "static"
    want = logits(load_quantized(nvfp4_dir, scheme="nvfp4").model, IDS)
    assert torch.allclose(logits(got.model, IDS), want, atol=2e-2, rtol=0)


def test_a_missing_tensor_is_refused_by_name(nvfp4_dir, tmp_path):
    from quantbench.models.modelopt import load_quantized

    broken = rewrite(nvfp4_dir, tmp_path / "broken", drop="model.layers.1.mlp.experts.3.up_proj.weight_scale")
    with pytest.raises(LoadError, match=r"model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight_scale is missing"):
        load_quantized(broken, scheme="nvfp4")
    no_norm = rewrite(nvfp4_dir, tmp_path / "no_norm", drop="model.layers.0.input_layernorm.weight")
    with pytest.raises(LoadError, match=r"no tensor for model\.layers\.0\.input_layernorm\.weight"):
        load_quantized(no_norm, scheme="nvfp4")


def test_leftover_and_misshapen_tensors_are_refused_by_name(nvfp4_dir, tmp_path):
    from quantbench.models.modelopt import load_quantized

    extra = rewrite(nvfp4_dir, tmp_path / "extra", add={"model.layers.0.mlp.experts.0.gate_proj.k_scale": torch.ones(())})
    with pytest.raises(LoadError, match=r"no place for: model\.layers\.0\.mlp\.experts\.0\.gate_proj\.k_scale"):
        load_quantized(extra, scheme="nvfp4")
    key = "model.layers.0.mlp.experts.2.down_proj.weight_scale"
    bad = rewrite(nvfp4_dir, tmp_path / "bad", rename=lambda k, t: (k, t.float()) if k == key else (k, t))
    with pytest.raises(LoadError, match=key.replace(".", r"\.") + r".*expected float8_e4m3fn"):
        load_quantized(bad, scheme="nvfp4")


@pytest.mark.parametrize("config, message", [
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo 'W4A8_AWQ'"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq'"),
    ({"quant_method": "auto-round", "bits": 4, "data_type": "int", "packing_format": "auto_round:auto_gptq"},
     "--backend int4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}, "kv_cache_quant_algo"),
])
def test_formats_it_does_not_read_are_refused_with_the_reason(nvfp4_dir, tmp_path, config, message):
    from quantbench.models.modelopt import load_quantized

    other = rewrite(nvfp4_dir, tmp_path / "other", config=config)
    with pytest.raises(LoadError, match=message):
        load_quantized(other, scheme="nvfp4")


def test_an_nvfp4_checkpoint_given_to_fp8_names_the_right_backend(nvfp4_dir, tiny_dir):
    from quantbench.models.modelopt import load_quantized

    with pytest.raises(LoadError, match="--backend nvfp4"):
        load_quantized(nvfp4_dir, scheme="fp8")
    with pytest.raises(LoadError, match="not a quantized checkpoint"):
        load_quantized(tiny_dir, scheme="nvfp4")


def test_full_variant_quantizes_attention_too_and_still_loads_exactly():
    from quantbench.engine.moe.nvfp4 import Nvfp4Linear
    from quantbench.models.modelopt import load_quantized

    full = modelopt_variants()["nvfp4-full"]
    got = load_quantized(full, scheme="nvfp4")
    assert "model.layers.1.self_attn.o_proj" in got.quantized_linears
    assert isinstance(got.model.model.layers[1].self_attn.o_proj, Nvfp4Linear)
    unpacked = load_quantized(full, scheme="nvfp4", mode="unpacked")
    assert torch.equal(logits(got.model, IDS), logits(unpacked.model, IDS))


# -- the backend ---------------------------------------------------------------------------------------------------------
def test_backend_records_packed_emulated_w4a4_and_answers(nvfp4_dir):
    from backends.nvfp4 import Nvfp4Backend
    from quantbench.protocol import parse_request
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    machine = detect()
    backend = Nvfp4Backend()
    assert backend.availability(machine).native == "emulated"
    loaded = backend.load(RunSpec(backend="nvfp4", model=str(nvfp4_dir), device="cpu"), machine)
    info = loaded.info
    assert info.variant == "nvfp4-packed" and info.native == "emulated"
    assert info.weight_format.startswith("nvfp4 w4a4 g16 (modelopt")
    assert info.kernel_path == "quantbench grouped-moe cpu-vectorised"
    assert info.extra["nvfp4_activations"] == "on" and info.experts_bytes < 0.35 * 2 * 8 * 3 * 64 * 128 * 2
    request = parse_request({"state": {"observation": "wall"},
                             "questions": {"action": {"type": "choice", "criteria": {"left": "l", "right": "r"}}}})
    answers = loaded.engine.forward(loaded.engine.prepare(request))
    assert abs(sum(answers["action"].probabilities.values()) - 1) < 1e-6
    off = backend.load(RunSpec(backend="nvfp4", model=str(nvfp4_dir), device="cpu", nvfp4_mode="unpacked",
                               nvfp4_activations="off"), machine).info
    assert off.variant == "nvfp4-unpacked" and "w4a16" in off.weight_format and "unpacked to BF16" in off.weight_format


def test_backend_availability_says_native_only_on_blackwell():
    from types import SimpleNamespace

    from backends.nvfp4 import Nvfp4Backend

    def machine(family, cc):
        return SimpleNamespace(gpu_family=family, gpu_name=f"a {family} GPU", has_gpu=True, gpu_cc=cc)

    backend = Nvfp4Backend()
    assert backend.availability(machine("blackwell", "12.0")).native == "native"
    assert backend.availability(machine("hopper", "9.0")).native == "emulated"
    assert backend.availability(machine("ada", "8.9")).native == "emulated"


@pytest.mark.slow
def test_default_variant_packed_and_unpacked_agree_on_every_question_of_the_default_suite():
    from backends.nvfp4 import Nvfp4Backend
    from quantbench.protocol.suite import load_suite
    from quantbench.run.machine import detect
    from quantbench.run.resolve import resolve
    from quantbench.run.spec import RunSpec

    machine, backend = detect(), Nvfp4Backend()
    packed = backend.load(resolve(RunSpec(backend="nvfp4", device="cpu")), machine).engine
    unpacked = backend.load(resolve(RunSpec(backend="nvfp4", device="cpu", nvfp4_mode="unpacked")), machine).engine
    records = load_suite(None).records
    batch = 16
    for start in range(0, len(records), batch):
        chunk = [r.request for r in records[start : start + batch]]
        a = packed.forward_many([packed.prepare(r) for r in chunk])
        b = unpacked.forward_many([unpacked.prepare(r) for r in chunk])
        for x, y in zip(a, b, strict=True):
            for name in x:
                assert x[name].top == y[name].top
                for opt, p in x[name].probabilities.items():
                    assert abs(p - y[name].probabilities[opt]) < 1e-6
