"""quantbench.engine.fused.ops (RMSNorm, rotary) and quantbench.engine.moe.align (expert grouping): the Triton kernels run
under Triton's CPU interpreter here (the same source the GPU compiles; their GPU figures are in BENCHMARKS.md).
The interpreter rounds float32 -> bfloat16 toward zero where the GPU rounds to nearest, so bfloat16 results are
compared within one rounding step here and bit for bit on the GPU (benchmarks/fused_ops_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

INTERPRETED = """
import torch
from transformers.models.qwen3_moe import modeling_qwen3_moe as mq
from quantbench.engine.fused.ops import apply_rope, rms_norm
from quantbench.engine.moe.align import ONE_LAUNCH_PAIRS, group_by_expert

torch.manual_seed(0)
for n, shape in ((256, (3, 5, 256)), (64, (2, 9, 4, 64)), (48, (7, 48))):
    for dtype in (torch.float32, torch.bfloat16):
        norm = mq.Qwen3MoeRMSNorm(n, eps=1e-6).to(dtype)
        norm.weight.data = (1 + 0.2 * torch.randn(n)).to(dtype)
        x = (torch.randn(*shape) * 3).to(dtype)
        want, got = norm(x), rms_norm(x, norm.weight, norm.variance_epsilon)
        assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype)
        tol = 1e-5 if dtype == torch.float32 else 2 ** -6
        assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol), (n, dtype, (got - want).abs().max())

# q's and k's slices of the fused q/k/v output ([B, T, H, D] views, rows 6 heads apart) are read in place: the same
# bits as their contiguous copies
for dtype in (torch.float32, torch.bfloat16):
    norm = mq.Qwen3MoeRMSNorm(64, eps=1e-6).to(dtype)
    norm.weight.data = (1 + 0.2 * torch.randn(64)).to(dtype)
    qkv = (torch.randn(2, 9, 6 * 64) * 3).to(dtype)
    for x in (qkv[..., :4 * 64].view(2, 9, 4, 64), qkv[..., 4 * 64:5 * 64].view(2, 9, 1, 64)):
        got = rms_norm(x, norm.weight, norm.variance_epsilon)
        assert got.is_contiguous() and torch.equal(got, rms_norm(x.contiguous(), norm.weight, norm.variance_epsilon))
        assert torch.equal(got, rms_norm(x.clone().reshape(-1, 64), norm.weight, 1e-6).view(x.shape))

for dtype in (torch.float32, torch.bfloat16):
    q = torch.randn(2, 7, 4, 64).to(dtype).transpose(1, 2)  # [B, H, T, D] views, as attention makes them
    k = torch.randn(2, 7, 2, 64).to(dtype).transpose(1, 2)
    cos, sin = (torch.randn(2, 7, 64).to(dtype) for _ in range(2))
    # and one row of positions shared by the batch (no position_ids: cos / sin [1, T, D]), as batched runs pass it
    for cos, sin in ((cos, sin), (cos[:1], sin[:1])):
        for want, got in zip(mq.apply_rotary_pos_emb(q, k, cos, sin), apply_rope(q, k, cos, sin)):
            assert got.shape == want.shape and got.dtype == want.dtype
            assert got.transpose(1, 2).is_contiguous()  # [B, T, H, D] memory, as q_proj wrote it
            if dtype == torch.float32:
                assert torch.equal(got, want)
            else:
                assert float((got.float() - want.float()).abs().max()) <= 2 ** -6 * float(want.float().abs().max())

# one launch (up to ONE_LAUNCH_PAIRS pairs; 300 x 8 is three chunks of its histograms, 38 blocks) and the
# three-launch path; experts 3 (not a power of two) to 512 (blocks of 16 pairs)
for t, k, e in ((37, 4, 16), (5, 2, 3), (300, 8, 128), (40, 8, 512), (2100, 8, 128)):
    w, idx = torch.rand(t, e).topk(k, dim=-1)
    g = group_by_expert(idx, w.to(torch.bfloat16), e)
    ids = idx.reshape(-1)
    assert g.offsets.tolist() == torch.cumsum(torch.bincount(ids, minlength=e), 0).tolist()
    rows = torch.arange(t * k)
    assert torch.equal(ids[g.row_pair.long()], torch.searchsorted(g.offsets.long(), rows, right=True))
    assert sorted(g.row_pair.tolist()) == list(range(t * k))  # a permutation: every pair placed once
    assert torch.equal(g.pair_row[g.row_pair.long()].long(), rows)
    assert torch.equal(g.row_token, g.row_pair // k)
    assert torch.equal(g.row_scale, w.to(torch.bfloat16).reshape(-1)[g.row_pair.long()])
    if t * k <= ONE_LAUNCH_PAIRS:  # pair order within each expert: a stable sort's
        assert torch.equal(g.row_pair.long(), torch.sort(ids, stable=True).indices)
print("ok")
"""


def test_kernels_match_transformers_and_group_every_pair_under_the_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")  # read when triton is imported: a fresh process
    done = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_install_leaves_a_cpu_model_alone_and_rejects_an_unknown_mode():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from quantbench.engine import fused

    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            num_experts=4, num_experts_per_tok=2)
    model = Qwen3MoeForCausalLM(config)
    norm = model.model.norm
    assert fused.install(model) is None  # the CPU keeps transformers' ops
    assert "forward" not in vars(norm)
    assert "forward" not in vars(model.model.layers[0].self_attn.q_proj)
    with pytest.raises(ValueError, match="fused ops mode"):
        fused.install(model, "fast")


def test_rms_norm_reads_a_strided_slice_of_the_fused_projection_without_a_copy():
    from quantbench.engine.fused.ops import _rows

    qkv = torch.randn(2, 9, (32 + 2 * 4) * 128)
    for h, x in ((32, qkv[..., :32 * 128].view(2, 9, 32, 128)), (4, qkv[..., 32 * 128:36 * 128].view(2, 9, 4, 128))):
        rows, heads, stride_o, stride_h = _rows(x)
        assert rows.data_ptr() == x.data_ptr() and rows.shape == (18, h, 128)
        assert (heads, stride_o, stride_h) == (h, 40 * 128, 128)
    # evenly spaced rows keep the flat indexing (H = 1)
    x = torch.randn(3, 7, 256)
    assert _rows(x)[0].data_ptr() == x.data_ptr() and _rows(x)[1:] == (1, 256, 0)
    assert _rows(x[1])[1:] == (1, 256, 0) and _rows(x[:, 0])[1:] == (1, 7 * 256, 0)
    assert _rows(torch.randn(2, 5, 4, 64))[1:] == (1, 64, 0)
    t = x.transpose(0, 1)  # [7, 3, 256]: rows 7·256 apart within a token, 256 between tokens: read in place
    assert _rows(t)[0].data_ptr() == x.data_ptr() and _rows(t)[1:] == (3, 256, 7 * 256)
    assert _rows(x[..., ::2])[0].is_contiguous()  # a strided last dim is copied first


def test_run_spec_and_sweep_accept_fused_ops_and_refuse_other_values():
    from quantbench.run.spec import EngineOptions, RunSpec, choices

    assert RunSpec(backend="bf16").options.fused_ops == "auto"
    assert choices(EngineOptions.model_fields["fused_ops"]) == ("auto", "off")  # what the sweep file accepts


def test_the_cli_names_the_flag_when_fused_ops_is_wrong(tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    result = CliRunner().invoke(app, ["run", "--backend", "bf16", "--fused-ops", "fast", "--db", str(tmp_path / "r.db")])
    assert result.exit_code != 0
    assert "--fused-ops 'fast'" in result.output


def test_grouped_moe_on_cpu_still_takes_the_sort_path():
    from quantbench.engine.moe.engine import DenseExperts, GroupedMoE

    torch.manual_seed(0)
    gate = torch.nn.Linear(16, 4, bias=False)
    moe = GroupedMoE(gate, DenseExperts(torch.randn(4, 2 * 8, 16)), DenseExperts(torch.randn(4, 16, 8)), top_k=2,
                     norm_topk_prob=True)
    x = torch.randn(5, 16)
    out = moe(x)
    probs = torch.softmax(gate(x), dim=-1)
    w, idx = probs.topk(2, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    want = torch.zeros_like(x)
    for t in range(5):
        for slot in range(2):
            e = int(idx[t, slot])
            h = moe.gate_up.weight[e] @ x[t]
            want[t] += w[t, slot] * (moe.down.weight[e] @ (torch.nn.functional.silu(h[:8]) * h[8:]))
    assert torch.allclose(out, want, atol=1e-4)
    assert moe.kernel_path == "cpu-vectorised"  # CPU tensors take the sort path, with or without a GPU beside them


def test_a_probe_that_fails_to_run_keeps_the_original_op_and_says_why():
    """An optional kernel that does not compile on some GPU must not end the run: the probe says no, with a warning."""
    from quantbench.engine.fused import ops as fused_ops

    def broken(*_):
        raise RuntimeError("PTX too new for this driver")

    with pytest.warns(RuntimeWarning, match="failed its probe.*PTX too new.*keeping transformers' op"):
        assert fused_ops.probe("rmsnorm", broken) is False
    assert fused_ops.probe("rope", lambda: True) is True
