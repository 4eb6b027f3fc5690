"""quantbench.engine.fused.layer: the decoder layer's residual adds and the q/k norms folded into the kernels beside them.
The kernels run under Triton's CPU interpreter (a fresh process each), on a tiny Qwen3-MoE; their GPU figures are in
docs/BENCHMARKS.md. The interpreter's float32 -> bfloat16 cast truncates, so where a path rounds with a cast and the
other in integer arithmetic (round_bf16), bfloat16 results are compared within one rounding step."""

from __future__ import annotations

import pytest

from tests.interpreted import run_interpreted

pytest.importorskip("triton")

KERNELS = """
import torch
from quantbench.engine.fused.ops import add_rms_norm, apply_rope, rms_norm
from quantbench.engine.moe.routing import sum_slots, sum_slots_norm

torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    x, r = (torch.randn(3, 5, 256).to(dtype) * 3 for _ in range(2))
    w = (1 + 0.2 * torch.randn(256)).to(dtype)
    normed, total = add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, r + x)  # the add rounded as torch's
    assert torch.equal(normed, rms_norm(r + x, w, 1e-6))  # then the same norm, bit for bit
    slots = torch.randn(7, 4, 96).to(dtype)
    res = torch.randn(7, 96).to(dtype)
    assert torch.equal(sum_slots(slots, res), res + sum_slots(slots))
    for h in (96, 2048):  # and the next layer's norm from the same pass: the norm kernel's bits
        slots, res = torch.randn(7, 4, h).to(dtype), torch.randn(7, h).to(dtype)
        nw = (1 + 0.2 * torch.randn(h)).to(dtype)
        out, normed = sum_slots_norm(slots, res, nw, 1e-6)
        assert torch.equal(out, res + sum_slots(slots)) and torch.equal(normed, rms_norm(out, nw, 1e-6))

    # q / k norms inside the rotary kernel, against the norm kernels then the rotary kernel
    qn, kn = (torch.nn.RMSNorm(64, eps=1e-6) for _ in range(2))
    for n in (qn, kn):
        n.weight.data = (1 + 0.3 * torch.randn(64)).to(dtype)
        n.variance_epsilon = n.eps
    qkv = (torch.randn(2, 9, 7 * 64) * 3).to(dtype)  # the fused projection's output: q (4 heads), k (1), v (2)
    q = qkv[..., :4 * 64].view(2, 9, 4, 64).transpose(1, 2)
    k = qkv[..., 4 * 64:5 * 64].view(2, 9, 1, 64).transpose(1, 2)
    cos, sin = (torch.randn(1, 9, 64).to(dtype) for _ in range(2))
    want = apply_rope(rms_norm(q, qn.weight, 1e-6), rms_norm(k, kn.weight, 1e-6), cos, sin)
    got = apply_rope(q, k, cos, sin, norms=(qn, kn))
    for g, w_ in zip(got, want):
        assert g.shape == w_.shape and g.transpose(1, 2).is_contiguous()
        err = float((g.float() - w_.float()).abs().max())
        assert err <= (1e-5 if dtype == torch.float32 else 2 ** -6) * float(w_.float().abs().max()), (dtype, err)
    # a wrong weight is far outside that
    other = apply_rope(q, k, cos, sin, norms=(kn, qn))[0]
    assert float((other.float() - want[0].float()).abs().max()) > 0.05 * float(want[0].float().abs().max())
print("ok")
"""


def test_add_norm_slot_sum_and_qk_norm_rope_kernels_match_the_unfused_ops():
    run_interpreted(KERNELS)


LAYERS = """
import functools
import torch
from quantbench.engine.fused import layer as fused_layer
from quantbench.engine.fused import ops as fused_ops
from quantbench.engine.moe import install_grouped_moe
from quantbench.engine.moe.engine import DenseExperts
from quantbench.models.families import moe_layout
from tests.tiny import tiny_model

for dtype in (torch.float32, torch.bfloat16):
    model = tiny_model(dtype=dtype)
    torch.manual_seed(1)
    for m in model.modules():  # norm weights away from 1, so a norm applied twice or never shows
        if type(m).__name__.endswith("RMSNorm"):
            m.weight.data = (1 + 0.3 * torch.randn(m.weight.shape)).to(dtype)
            m.forward = functools.partial(fused_ops._norm_forward, m)  # as fused.install swaps them
    if dtype == torch.bfloat16:  # layer 1's MoE through quantbench's engine: its residual goes in with the sum
        install_grouped_moe(model, lambda i, ex: (DenseExperts(ex.gate_up_proj.data), DenseExperts(ex.down_proj.data)),
                            layout=moe_layout(model))
    ids = torch.randint(0, 600, (2, 11))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        # rope_fits asks for CUDA tensors; here the interpreter runs the kernel on CPU ones
        fused_layer.rope_fits = lambda q, k, cos, sin: q.dim() == 4 and k.dim() == 4
        # layer 1's output norm (the final one) comes from its MoE's pass where the engine runs it (bf16 here)
        fused = ["residual", "qknorm"] + (["nextnorm"] if dtype == torch.bfloat16 else [])
        assert fused_layer.install(model) == fused, "a probe failed"
        assert fused_layer.install(model) == fused  # twice: nothing swapped twice
        assert (model.model.layers[1].__dict__.get("_quantbench_next_norm") is model.model.norm) == (dtype == torch.bfloat16)
        layer = model.model.layers[0]
        assert layer.forward.func is fused_layer.layer_forward
        assert layer.self_attn.forward.func is fused_layer.attention_forward
        got = model(input_ids=ids).logits
    tol = 1e-4 if dtype == torch.float32 else 0.05
    err = float((got.float() - want.float()).abs().max())
    assert err <= tol * float(want.float().abs().max()), (dtype, err)
    assert torch.equal(got.argmax(-1), want.argmax(-1))

    # the decoder layer alone, bit for bit (its attention run the same way on both sides)
    attn = layer.self_attn
    cos, sin = (torch.randn(2, 11, 32).to(dtype) for _ in range(2))
    x = torch.randn(2, 11, 128).to(dtype)
    kw = dict(attention_mask=None, position_embeddings=(cos, sin))
    with torch.no_grad():
        assert torch.equal(layer(x, **kw), layer._quantbench_original_forward(x, **kw))
        # with positional arguments or gradients: the module's own forward
        calls = []
        original = layer._quantbench_original_forward
        layer._quantbench_original_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
        layer(x, None, position_embeddings=(cos, sin))  # attention_mask given by position
        with torch.enable_grad():
            layer(x, **kw)
        assert calls == [1, 1]
        layer._quantbench_original_forward = original
print("ok")
"""


def test_fused_decoder_layer_and_attention_match_the_model_under_the_triton_interpreter():
    run_interpreted(LAYERS)
