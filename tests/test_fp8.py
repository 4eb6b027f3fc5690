"""FP8 (E4M3 W8A8): quantize / dequantize / activation fake-quant against ModelOpt's own code, the grouped-MoE
format and its Triton kernel (CPU interpreter), ModelOpt and compressed-tensors checkpoints, the backend."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from quantbench.engine.moe import fp8
from quantbench.engine.triton_common import expert_of_rows, triton
from quantbench.errors import LoadError
from tests.interpreted import run_interpreted
from tests.test_nvfp4 import IDS, logits, modelopt_variants, rewrite


def test_quantize_matches_modelopts_fp8qtensor_and_dequantize_is_weight_times_scale():
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor

    torch.manual_seed(0)
    w = torch.randn(2, 32, 48)
    q, scale = fp8.quantize(w)
    for e in range(2):
        ref, ref_scale = FP8QTensor.quantize(w[e])
        assert torch.equal(ref._quantized_data.view(torch.uint8), q[e].view(torch.uint8))
        assert torch.allclose(ref_scale.expand(32), scale[e], rtol=0, atol=0)
    # hand-made: the E4M3 bytes 0x38 = 1.0, 0x40 = 2.0, 0xC4 = -3.0, 0x7E = 448 times a row scale
    codes = torch.tensor([[0x38, 0x40], [0xC4, 0x7E]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert fp8.dequantize(codes, torch.tensor([0.5, 2.0]), torch.float32).tolist() == [[0.5, 1.0], [-6.0, 896.0]]
    per_channel_q, per_channel = fp8.quantize(w, per_channel=True)
    assert torch.allclose(per_channel, w.abs().amax(-1) / 448)
    assert (fp8.dequantize(per_channel_q, per_channel, torch.float32) - w).abs().max() < (w - fp8.dequantize(q, scale, torch.float32)).abs().max() * 1.01


def test_activation_fake_quant_equals_modelopts_fp8_eager():
    from modelopt.torch.quantization.tensor_quant import fp8_eager

    torch.manual_seed(1)
    x = (torch.randn(7, 64) * 3).bfloat16()
    amax = torch.tensor(5.0)
    assert torch.equal(fp8.fake_quantize_activations(x, amax / 448), fp8_eager(x, amax))
    dyn = fp8.fake_quantize_activations(x, None)
    rows = torch.stack([fp8_eager(r, r.float().abs().amax()) for r in x])
    assert torch.equal(dyn, rows)


def test_grouped_engine_runs_fp8_experts_like_a_per_expert_loop():
    from quantbench.engine.moe.engine import GroupedMoE, route

    torch.manual_seed(2)
    e, h, i = 5, 64, 32
    gate_up = fp8.Fp8Experts.from_weights(torch.randn(e, 2 * i, h) * 0.1, input_scale=torch.tensor([4.0 / 448]))
    down = fp8.Fp8Experts.from_weights(torch.randn(e, h, i) * 0.1, input_scale=torch.tensor([1.0 / 448]))
    router = torch.nn.Linear(h, e, bias=False)
    moe = GroupedMoE(router, gate_up, down, top_k=2, norm_topk_prob=True)
    x = torch.randn(12, h)
    with torch.no_grad():
        weights, index = route(x, router.weight, 2, True)
        got = moe.experts_forward(x, index, weights)
    wg, wd = gate_up.dequantize(torch.float32), down.dequantize(torch.float32)
    ref = torch.zeros_like(got)
    for t in range(x.shape[0]):
        for j in range(2):
            ex = int(index[t, j])
            g, u = (fp8.fake_quantize_activations(x[t], gate_up.input_scale) @ wg[ex].T).chunk(2)
            hq = fp8.fake_quantize_activations(torch.nn.functional.silu(g) * u, down.input_scale)
            ref[t] += float(weights[t, j]) * (hq @ wd[ex].T)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)
    assert gate_up.fused_kernel == "triton-fused-fp8"  # on the CPU: the emulated kernel's name, never "native"


@pytest.mark.skipif(triton is None, reason="triton is not installed")
def test_fused_triton_kernel_matches_the_dequantized_reference_under_the_interpreter():
    code = """
import torch
from quantbench.engine.moe import fp8
from quantbench.engine.triton_common import expert_of_rows
torch.manual_seed(3)
for per_channel in (False, True):
    fmt = fp8.Fp8Experts.from_weights(torch.randn(5, 48, 64), per_channel=per_channel, input_scale=torch.tensor([0.01]))
    counts = torch.tensor([3, 0, 17, 1, 9])
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    x = torch.randn(int(counts.sum()), 64).bfloat16()
    y = fp8.fp8_grouped_mm(x, fmt.weight, fmt.scale, offsets, config={"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32})
    w = fmt.dequantize(torch.bfloat16).float()[expert_of_rows(offsets, x.shape[0])]
    ref = torch.einsum("sk,snk->sn", x.float(), w)
    err = ((y.float() - ref).norm() / ref.norm()).item()
    assert err < 4e-3, err
print("ok")
"""
    run_interpreted(code)


@pytest.mark.skipif(triton is None, reason="triton is not installed")
def test_fused_steps_match_the_unfused_reference_in_both_orientations_under_the_interpreter():
    """The engine's fused steps in the FP8 kernel: the token gather + SwiGLU of gate_up, the routing weights + the
    scatter back to (token, slot) order of down, with the weights on the MMA's M side (SWAP_AB) and without."""
    run_interpreted("""
import torch
from quantbench.engine.moe import fp8
from tests.interpreted import check_fused_steps
torch.manual_seed(3)
fmt = fp8.Fp8Experts.from_weights(torch.randn(5, 48, 64), input_scale=torch.tensor([0.01]))
check_fused_steps(lambda x, offsets, cfg, **steps: fp8.fp8_grouped_mm(x, fmt.weight, fmt.scale, offsets, config=cfg,
                                                                      **steps), fmt)
print("ok")
""")


@pytest.mark.skipif(triton is None, reason="triton is not installed")
def test_e4m3_codes_between_the_projections_change_no_bit_under_the_interpreter():
    """FP8 with one input scale: tokens rounded to E4M3 once before the kernel (fp8_codes), gate_up writing h as the
    down kernel's codes, down reading them: the same bits as each kernel rounding its bf16 input itself (both
    orientations, both fused-step sets). The E4M3 casts here are the interpreter's, the same in both paths."""
    run_interpreted("""
import torch
from quantbench.engine.moe import fp8
torch.manual_seed(5)
gu = fp8.Fp8Experts.from_weights(torch.randn(5, 64, 64), input_scale=torch.tensor([0.02]))
dn = fp8.Fp8Experts.from_weights(torch.randn(5, 48, 32), input_scale=torch.tensor([0.05]))
counts = torch.tensor([3, 0, 17, 1, 9])
offsets = torch.cumsum(counts, 0, dtype=torch.int32)
s, t = int(counts.sum()), 11
x = (torch.randn(t, 64) * 3).bfloat16()
row_index, rs, dest = torch.randint(0, t, (s,), dtype=torch.int32), torch.rand(s).bfloat16(), torch.randperm(s).int()
for swap in (False, True):
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SWAP_AB": swap}
    mm = lambda f, v, **kw: fp8.fp8_grouped_mm(v, f.weight, f.scale, offsets, input_scale=f.input_scale, config=cfg, **kw)
    h = mm(gu, x, row_index=row_index, swiglu=True)
    h_codes = mm(gu, fp8.fp8_codes(x, gu.input_scale), row_index=row_index, swiglu=True, out_scale=dn.input_scale)
    assert h_codes.dtype == torch.float8_e4m3fn and h.dtype == torch.bfloat16
    assert torch.equal(h_codes.view(torch.uint8), fp8.fp8_codes(h, dn.input_scale).view(torch.uint8)), swap
    y = mm(dn, h, row_scale=rs, row_dest=dest)
    y_codes = mm(dn, h_codes, row_scale=rs, row_dest=dest)
    assert y_codes.dtype == torch.bfloat16 and torch.equal(y, y_codes), swap
    assert float(y.float().abs().max()) > 0
print("ok")
""")


def test_one_input_scale_is_what_lets_inputs_come_as_codes():
    one = fp8.Fp8Experts.from_weights(torch.randn(3, 8, 32), input_scale=torch.tensor([0.1, 0.1, 0.1]))
    per_expert = fp8.Fp8Experts.from_weights(torch.randn(3, 8, 32), input_scale=torch.tensor([0.1, 0.2, 0.1]))
    assert one._one_input_scale and not per_expert._one_input_scale
    assert one.codes_scale(torch.device("cpu")) is None  # no native kernel on the CPU: the engine never asks
    assert "codes" in one.fused_features


def test_modelopt_fp8_export_loads_exactly_and_dequantizes_as_modelopt_does():
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor

    from quantbench.engine.moe.fp8 import Fp8Linear
    from quantbench.models.modelopt import load_quantized

    paths = modelopt_variants()
    got = load_quantized(paths["fp8-full"], scheme="fp8")
    assert got.layout.weight_format == "fp8 w8a8 (modelopt 0.47.0)"
    q_proj = got.model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Fp8Linear)
    tensors = load_file(str(paths["fp8-full"] / "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj"
    ref = FP8QTensor(tensors[f"{key}.weight"].shape, torch.bfloat16, tensors[f"{key}.weight"]).dequantize(
        torch.float32, scale=tensors[f"{key}.weight_scale"])
    assert torch.equal(fp8.dequantize(q_proj.weight, q_proj.scale, torch.float32), ref)
    gate_up = got.model.model.layers[1].mlp.gate_up
    expert3 = torch.cat([tensors[f"model.layers.1.mlp.experts.3.{p}.weight"].float()
                         * tensors[f"model.layers.1.mlp.experts.3.{p}.weight_scale"] for p in ("gate_proj", "up_proj")])
    assert torch.equal(gate_up.dequantize(torch.float32, torch.tensor([3]))[0], expert3)
    assert gate_up.activations == "static" and gate_up.input_scale.numel() == 1
    # the experts-only variant leaves attention in BF16
    experts_only = load_quantized(paths["fp8"], scheme="fp8")
    assert experts_only.quantized_linears == [] and logits(experts_only.model, IDS).isfinite().all()


def _ct_fp8(src: Path, dst: Path, *, per_channel: bool, dynamic: bool) -> Path:
    """A compressed-tensors float-quantized checkpoint, hand-made from the ModelOpt export (same E4M3 codes)."""
    def rename(k, t):
        if k.endswith(".weight_scale"):
            rows = load_file(str(src / "model.safetensors"))[k[: -len("_scale")]].shape[0]
            return k, (t.reshape(1).expand(rows).reshape(rows, 1).clone() if per_channel else t.reshape(1)).bfloat16()
        if k.endswith(".input_scale"):
            return None if dynamic else (k, t.reshape(1))
        return k, t

    acts = {"num_bits": 8, "type": "float", "strategy": "token" if dynamic else "tensor", "dynamic": dynamic}
    config = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts,
                                            "weights": {"num_bits": 8, "type": "float",
                                                        "strategy": "channel" if per_channel else "tensor"}}}}
    return rewrite(src, dst, config=config, rename=rename)


@pytest.mark.parametrize("per_channel, dynamic", [(True, False), (False, True)])
def test_compressed_tensors_fp8_per_channel_and_dynamic_layouts_load(tmp_path, per_channel, dynamic):
    from quantbench.models.modelopt import load_quantized

    src = modelopt_variants()["fp8"]
    ct = load_quantized(_ct_fp8(src, tmp_path / "ct", per_channel=per_channel, dynamic=dynamic), scheme="fp8")
    assert ct.layout.producer == "compressed-tensors"
    assert ct.layout.activations == ("dynamic" if dynamic else "static")
    want = logits(load_quantized(src, scheme="fp8").model, IDS)
    got = logits(ct.model, IDS)
    if dynamic:  # per-token activation scales instead of the calibrated one: close, not equal
        assert ((got - want).norm() / want.norm()).item() < 0.05
    else:
        assert torch.allclose(got, want, atol=2e-2, rtol=0)


def test_block_wise_fp8_scales_are_refused(tmp_path):
    from quantbench.models.modelopt import load_quantized

    src = modelopt_variants()["fp8"]
    config = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                                        "block_structure": [128, 128]}}}}
    with pytest.raises(LoadError, match="strategy 'block'"):
        load_quantized(rewrite(src, tmp_path / "block", config=config), scheme="fp8")


def test_an_expert_with_a_per_expert_input_scale_quantizes_its_own_rows():
    torch.manual_seed(4)
    fmt = fp8.Fp8Experts.from_weights(torch.randn(3, 16, 32), input_scale=torch.tensor([0.01]))
    fmt.input_scale = torch.tensor([0.01, 0.5, 0.02])
    offsets = torch.tensor([2, 5, 6], dtype=torch.int32)
    x = torch.randn(6, 32)
    got = fmt.quantize_input(x, offsets)
    for row, e in enumerate(expert_of_rows(offsets, 6).tolist()):
        assert torch.equal(got[row], fp8.fake_quantize_activations(x[row], fmt.input_scale[e]))


def test_backend_says_native_from_ada_on_and_emulated_before():
    from backends.fp8 import Fp8Backend

    def gpu(cc):
        return SimpleNamespace(has_gpu=True, gpu_name="gpu", gpu_cc=cc, gpu_family="x")

    backend = Fp8Backend()
    assert backend.availability(gpu("9.0")).native == "native"
    assert backend.availability(gpu("8.9")).native == "native"
    assert backend.availability(gpu("8.0")).native == "emulated"
    assert backend.availability(SimpleNamespace(has_gpu=False)).native == "emulated"


def test_backend_loads_the_checkpoint_and_records_emulated_w8a8_on_the_cpu():
    from backends.fp8 import Fp8Backend
    from quantbench.protocol import parse_request
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    loaded = Fp8Backend().load(RunSpec(backend="fp8", model=str(modelopt_variants()["fp8"]), device="cpu"), detect())
    assert loaded.info.variant == "fp8" and loaded.info.native == "emulated"
    assert loaded.info.weight_format.startswith("fp8 w8a8") and loaded.info.extra["fp8_activations"] == "static"
    assert loaded.info.experts_bytes < 0.55 * 2 * 8 * 3 * 64 * 128 * 2
    request = parse_request({"state": {"x": 1}, "questions": {"ok": {"type": "boolean"}}})
    answer = loaded.engine.forward(loaded.engine.prepare(request))["ok"]
    assert set(answer.probabilities) == {"yes", "no"}
    with pytest.raises(LoadError, match="--backend fp8"):
        from quantbench.models.modelopt import load_quantized

        load_quantized(modelopt_variants()["fp8"], scheme="nvfp4")
    assert json.loads((modelopt_variants()["fp8"] / "config.json").read_text())["quantization_config"]["quant_algo"] == "FP8"
