"""W4A8 (`--int4-activations int8`): the int4 checkpoint's weights with int8 activations per row per 128 inputs, a
variant of its own. The packed layout, the activation quantizer, the reference the GPU kernel is held to, the
format in the engine on the CPU, and the backend option (CPU only)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.engine.moe.engine import GroupedMoE
from quantbench.engine.moe.int4 import Int4Experts, rtn_experts, unpack_k
from quantbench.engine.moe.w4a8 import (
    Int4W4A8Experts,
    fake_quant,
    install_w4a8,
    pack_w4a8,
    quantize_rows,
    reference_grouped_mm,
    unpack_w4a8,
)
from quantbench.errors import ConfigError
from quantbench.run.spec import RunSpec


def asym_int4(e: int, n: int, k: int, seed: int = 0) -> Int4Experts:
    """RTN codes with random zero points and signed scales: the general (asymmetric) case."""
    g = torch.Generator().manual_seed(seed)
    sym = rtn_experts(torch.randn(e, n, k, generator=g))
    zeros = torch.randint(0, 16, sym.zeros.shape, generator=g, dtype=torch.uint8)
    scales = (sym.scales.float() * torch.where(torch.rand(sym.scales.shape, generator=g) < 0.2, -1, 1)).half()
    return Int4Experts(sym.qweight, scales, zeros, 128, sym=False, k_block=sym.k_block)


# -- the packed layout --------------------------------------------------------------------------------------------
def test_pack_and_unpack_are_inverse_and_put_inputs_c_and_64_plus_c_in_one_byte():
    q = torch.randint(0, 16, (3, 5, 384), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    packed = pack_w4a8(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 192)
    assert torch.equal(unpack_w4a8(packed), q)
    for b, c in ((0, 0), (1, 17), (2, 63)):
        assert torch.equal(packed[..., 64 * b + c], q[..., 128 * b + c] | (q[..., 128 * b + 64 + c] << 4))
    with pytest.raises(ValueError, match="not a multiple of 128"):
        pack_w4a8(q[..., :200])


# -- the activations --------------------------------------------------------------------------------------------
def test_quantize_rows_follows_the_contract_on_a_hand_computed_case():
    x = torch.zeros(2, 256)
    # row 0, group 0: amax 127, so the codes are x rounded half to even; group 1 all zeros
    x[0, :7] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.0, -3.2])
    # row 1, group 0: amax 254 (codes x / 2); group 1: amax 1 (codes 127 x)
    x[1, :5] = torch.tensor([3.0, 5.0, -254.0, 1.0, 7.0])
    x[1, 128:131] = torch.tensor([0.5, -0.25, 1.0])
    xq, sx, xsum = quantize_rows(x)
    assert (xq.dtype, sx.dtype, xsum.dtype) == (torch.int8, torch.float32, torch.int32)
    assert xq[0, :7].tolist() == [0, 2, 2, 0, -2, 127, -3]
    assert xq[1, :5].tolist() == [2, 2, -127, 0, 4]  # 1.5 -> 2, 2.5 -> 2, 0.5 -> 0, 3.5 -> 4
    assert xq[1, 128:131].tolist() == [64, -32, 127]  # 63.5 -> 64, -31.75 -> -32
    assert not xq[0, 128:].any() and not xq[0, 7:128].any() and not xq[1, 131:].any()
    assert sx.tolist() == [[1.0, 0.0], [2.0, torch.tensor(1 / 127, dtype=torch.float32).item()]]
    assert xsum.tolist() == [[0 + 2 + 2 + 0 - 2 + 127 - 3, 0], [2 + 2 - 127 + 0 + 4, 64 - 32 + 127]]
    # a bf16 input gives the codes of its float32 values
    assert torch.equal(quantize_rows(x.bfloat16())[0], quantize_rows(x.bfloat16().float())[0])


def test_fake_quant_is_within_half_a_step_and_keeps_the_dtype():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 512, generator=g) * torch.logspace(-3, 3, 4).repeat_interleave(128)
    x[5, 128:256] = 0  # a group of zeros stays zeros
    got = fake_quant(x, torch.tensor([10, 64], dtype=torch.int32))
    amax = x.abs().reshape(64, 4, 128).amax(-1).repeat_interleave(128, dim=1)
    assert torch.all((got - x).abs() <= amax / 254 * (1 + 1e-6))
    assert not got[5, 128:256].any()
    assert fake_quant(x.bfloat16()).dtype == torch.bfloat16
    assert fake_quant(x.reshape(8, 8, 512)).shape == (8, 8, 512)


# -- the kernel's reference -------------------------------------------------------------------------------------
def float64_formula(x, w: Int4W4A8Experts, offsets, *, row_index=None, act=None, row_scale=None, row_dest=None):
    """The same output from the dequantized weights, (q − z) · s, and the fake-quantized rows, xq · sx (float64)."""
    rows = x if row_index is None else x[row_index]
    xq, sx, _ = quantize_rows(rows)
    xd = xq.double() * sx.double().repeat_interleave(128, dim=1)
    q = unpack_w4a8(w.packed).double()
    weight = (q - w.zeros.double().repeat_interleave(128, 1).transpose(1, 2)) \
        * w.scales.double().repeat_interleave(128, 1).transpose(1, 2)
    y = torch.zeros(rows.shape[0], w.out_features, dtype=torch.float64)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        y[start:end] = xd[start:end] @ weight[e].T
        start = end
    if act == "swiglu":
        y = F.silu(y[:, : w.out_features // 2]) * y[:, w.out_features // 2 :]
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    if row_dest is not None:
        y = torch.zeros_like(y).index_copy_(0, row_dest.long(), y)
    return y


@pytest.mark.parametrize("features", [{}, {"row_index": True, "act": "swiglu"}, {"row_scale": True, "row_dest": True}])
def test_reference_grouped_mm_is_the_dequantized_formula_with_each_fused_step(features):
    g = torch.Generator().manual_seed(3)
    w = Int4W4A8Experts.from_int4(asym_int4(3, 256, 384, seed=4))
    offsets = torch.tensor([4, 4, 10], dtype=torch.int32)  # expert 1 has no rows
    x = torch.randn(7 if features.get("row_index") else 10, 384, generator=g)
    kw = {"act": features.get("act")}
    if features.get("row_index"):
        kw["row_index"] = torch.randint(0, 7, (10,), generator=g, dtype=torch.int32)
    if features.get("row_scale"):
        kw["row_scale"] = torch.rand(10, generator=g)
    if features.get("row_dest"):
        kw["row_dest"] = torch.randperm(10, generator=g).int()
    got = reference_grouped_mm(x, w.packed, w.scales, w.zeros, offsets, **kw)
    want = float64_formula(x, w, offsets, **kw)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


# -- the format -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sym", [True, False])
def test_w4a8_experts_hold_the_same_weights_bit_for_bit_in_the_same_bytes(sym):
    int4 = rtn_experts(torch.randn(5, 256, 256)) if sym else asym_int4(5, 256, 256)
    w8 = Int4W4A8Experts.from_int4(int4)
    codes = unpack_k(int4.qweight, int4.k_block).transpose(1, 2)
    assert torch.equal(unpack_w4a8(w8.packed), codes.to(torch.uint8))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert torch.equal(w8.dequantize(dtype), int4.dequantize(dtype))
    hit = torch.tensor([4, 1])
    assert torch.equal(w8.dequantize(torch.bfloat16, hit), int4.dequantize(torch.bfloat16, hit))
    assert w8.nbytes() == int4.nbytes() and not hasattr(w8, "qweight")
    assert w8.format == f"int4-g128-{'sym' if sym else 'asym'}-w4a8" and w8.fused_kernel == "gluon-wgmma-int4-w4a8"
    assert w8.fused_features == int4.fused_features and w8.input_quant_rowwise
    assert not w8.quantizes_input_in_kernel(torch.device("cpu"))
    assert w8.grouped_mm(torch.randn(4, 256), torch.tensor([4, 4, 4, 4, 4], dtype=torch.int32), "auto") is None


def test_a_group_size_other_than_128_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match=r"--int4-activations int8: down has group size 64; W4A8 quantizes"):
        Int4W4A8Experts.from_int4(rtn_experts(torch.randn(2, 128, 256), group_size=64), "down")
    with pytest.raises(ConfigError, match="--int4-activations int8: the model has no int4 experts"):
        install_w4a8(nn.Linear(2, 2))


def test_the_engine_on_the_cpu_emulates_w4a8_close_to_w4a16_and_as_the_reference_computes():
    g = torch.Generator().manual_seed(5)
    hidden, inter, experts, top_k, tokens = 256, 256, 4, 2, 16
    gate = nn.Linear(hidden, experts, bias=False)
    moe = GroupedMoE(gate, rtn_experts(torch.randn(experts, 2 * inter, hidden, generator=g) * 0.05),
                     rtn_experts(torch.randn(experts, hidden, inter, generator=g) * 0.05),
                     top_k=top_k, norm_topk_prob=True, act=F.silu)  # silu as a function: no transformers import
    x = torch.randn(tokens, hidden, generator=g)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    block = nn.Sequential(moe)
    with torch.inference_mode():
        w4a16 = moe.experts_forward(x, index, weights)
        assert install_w4a8(block) == 2 and moe.kernel_path == "cpu-vectorised"
        w4a8 = moe.experts_forward(x, index, weights)
    rel = ((w4a8 - w4a16).norm() / w4a16.norm()).item()
    assert 0.002 < rel < 0.05, rel  # the activations really are int8 (1.7% here), and close
    # the same numbers as the kernel's reference: gather + SwiGLU, then routing weights + scatter
    order = torch.sort(index.reshape(-1), stable=True)[1]
    offsets = torch.cumsum(torch.bincount(index.reshape(-1), minlength=experts), 0).int()
    up, down = moe.gate_up, moe.down
    h = reference_grouped_mm(x, up.packed, up.scales, up.zeros, offsets, row_index=(order // top_k).int(),
                             act="swiglu")
    y = reference_grouped_mm(h, down.packed, down.scales, down.zeros, offsets,
                             row_scale=weights.reshape(-1)[order], row_dest=order.int())
    torch.testing.assert_close(w4a8, y.view(tokens, top_k, hidden).sum(1), rtol=0, atol=1e-4 * w4a8.abs().max().item())


# -- the backend option -------------------------------------------------------------------------------------------
def test_the_option_is_a_labelled_variant_of_its_own_config():
    from quantbench.run.machine import detect
    from quantbench.run.runner import spec_hash

    int8 = RunSpec(backend="int4", int4_activations="int8")
    assert int8.options.label() == "-w4a8" and RunSpec(backend="int4").options.label() == ""
    machine = detect()
    assert spec_hash(int8, machine) != spec_hash(RunSpec(backend="int4"), machine)
    with pytest.raises(ConfigError, match=r"int4_activations 'int4' \(backend int4\): use one of bf16, int8"):
        RunSpec(backend="int4", int4_activations="int4")


def test_run_help_shows_the_flag_and_no_fast_moe_with_int8_is_refused_naming_it(tmp_path, monkeypatch):
    from quantbench.run import runner

    monkeypatch.setattr(runner.subprocess, "Popen", lambda *a, **k: pytest.fail("a child process was started"))
    env = {"COLUMNS": "400"}
    shown = CliRunner().invoke(app, ["run", "--help"], env=env)
    assert shown.exit_code == 0 and "--int4-activations" in shown.output and "W4A8" in shown.output
    db = tmp_path / "r.duckdb"
    done = CliRunner().invoke(app, ["run", "--backend", "int4", "--gpu", "cpu", "--no-fast-moe", "--int4-activations",
                                    "int8", "--db", str(db)], env=env)
    assert done.exit_code == 2 and not db.exists(), done.output
    assert "error: --int4-activations int8 with --no-fast-moe: auto-round's own per-expert path is W4A16 only" \
        in done.output


def test_a_stored_w4a8_run_is_a_variant_of_its_own_never_pooled_with_int4(tmp_path):
    from quantbench import report
    from quantbench.analysis.select import RunFilter, select_run, summaries
    from tests.test_report import Lab

    lab = Lab(tmp_path / "r.duckdb", n=40)
    lab.run()  # the BF16 reference
    w4a16 = lab.run(lab.answers(noise=0.04, seed=5), backend="int4", variant="int4", weight_format="int4 w4a16 g128")
    w4a8 = lab.run(lab.answers(noise=0.05, seed=6), backend="int4", variant="int4-w4a8",  # newer
                   weight_format="int4 w4a8 g128; activations int8 per row per 128 inputs (quantbench)")
    # `compare int4`, `runs --variant int4`: the W4A16 run, though the W4A8 one is newer and of the same backend
    assert select_run(lab.store, "int4", prefer_here=False)[0] == w4a16
    assert select_run(lab.store, "int4-w4a8", prefer_here=False)[0] == w4a8
    assert [r.run_id for r in summaries(lab.store, RunFilter(variant="int4"))] == [w4a16]
    assert [r.run_id for r in summaries(lab.store, RunFilter(variant="INT4-W4A8"))] == [w4a8]
    [rep] = report.build_report(lab.store)
    rows = {r.label: r.run.run_id for r in rep.rows}
    assert rows["int4"] == w4a16 and rows["int4-w4a8"] == w4a8


@pytest.mark.slow
def test_a_run_of_the_default_model_records_the_w4a8_variant_and_format(monkeypatch):
    """The embedded default model's int4 variant (the cached RTN one every `run --backend int4` prepares), through
    a real run: its own variant, the W4A8 format, emulated on the CPU."""
    from pathlib import Path

    from quantbench.run.runner import execute

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    result = execute(RunSpec(backend="int4", int4_activations="int8", gpu="cpu", limit=2, warmup=0,
                             latency_min_decisions=1, latency_min_seconds=0.0), echo=False)
    run = result.run
    assert run.status == "ok", run.error
    assert (run.variant, run.native) == ("int4-w4a8", "emulated")
    assert run.weight_format == ("int4 w4a8 g128 sym (auto_round:auto_gptq); activations int8 per row per 128 "
                                 "inputs (quantbench)")
    assert run.kernel_path.startswith("quantbench grouped-moe cpu-vectorised, int8 activations emulated")
    assert run.spec["int4_activations"] == "int8"


@pytest.mark.slow
def test_the_omni_family_which_loads_int4_itself_runs_w4a8_too():
    """Qwen3-Omni's thinker reads its int4 export straight into the engine (loads_int4_itself): its experts are
    Int4Experts in GroupedMoE layers, so W4A8 swaps them the same way (the omni default model's int4 variant, which
    tests/test_planted_omni.py prepares too)."""
    from types import SimpleNamespace

    from backends.int4 import Int4Backend
    from quantbench.make.quantize import default_variant
    from quantbench.protocol import parse_request

    path = str(default_variant("int4", "omni"))
    request = parse_request({"state": {"observation": "wall ahead"},
                             "questions": {"action": {"type": "choice", "criteria": {"left": "l", "right": "r"}}}})
    cpu = SimpleNamespace(has_gpu=False, gpu_name=None)
    got = {}
    for acts in ("bf16", "int8"):
        loaded = Int4Backend().load(RunSpec(backend="int4", model=path, device="cpu", dtype="float32",
                                            int4_activations=acts), cpu)
        got[acts] = loaded.engine.forward(loaded.engine.prepare(request))["action"].probabilities
    assert loaded.info.variant == "int4-w4a8" and "w4a8" in loaded.info.weight_format
    assert all(isinstance(m.gate_up, Int4W4A8Experts) for m in loaded.model.modules() if isinstance(m, GroupedMoE))
    assert got["int8"] != got["bf16"] and abs(got["int8"]["left"] - got["bf16"]["left"]) < 0.02
