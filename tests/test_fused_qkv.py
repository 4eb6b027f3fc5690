"""quantbench.engine.fused.ops.fuse_qkv: q_proj, k_proj, v_proj as one GEMM over views of one weight. install does this only
on a GPU after a probe; the mechanism itself is plain PyTorch and is tested here on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from quantbench.engine import fused
from quantbench.engine.fused import ops as fused_ops
from tests.tiny import tiny_model


def attentions(model):
    return [layer.self_attn for layer in model.model.layers]


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_fused_model_gives_the_same_logits_and_keeps_its_parameters():
    model = tiny_model()
    ids = torch.randint(0, 600, (2, 23))
    want = logits(model, ids)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    state = {name: t.clone() for name, t in model.state_dict().items()}

    assert all(fused_ops.fuse_qkv(a) for a in attentions(model))
    assert {name: p.shape for name, p in model.named_parameters()} == shapes
    assert all(torch.equal(t, state[name]) for name, t in model.state_dict().items())
    assert model.state_dict().keys() == state.keys()
    for a in attentions(model):
        q, k, v = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight
        storage = q.untyped_storage()
        assert storage.data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
        assert storage.nbytes() == (q.numel() + k.numel() + v.numel()) * q.element_size()  # not doubled
        assert (q.storage_offset(), k.storage_offset(), v.storage_offset()) == (0, q.numel(), q.numel() + k.numel())

    outputs = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(attentions(model)[0], name).register_forward_hook(lambda m, i, o, name=name: outputs.update({name: o}))
    got = logits(model, ids)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    # k and v were the columns of q's GEMM, not GEMMs of their own; q is a view of it, not a copy
    base = outputs["q_proj"].untyped_storage().data_ptr()
    assert outputs["k_proj"].untyped_storage().data_ptr() == base == outputs["v_proj"].untyped_storage().data_ptr()
    assert outputs["q_proj"].stride(-2) == 128 + 2 * 64
    with torch.no_grad():  # and outside inference_mode, where the input's version counter is checked
        assert torch.allclose(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_k_and_v_compute_their_own_projection_unless_given_q_s_unchanged_input():
    a = attentions(tiny_model())[0]
    assert fused_ops.fuse_qkv(a)
    q, k, v = a.q_proj, a.k_proj, a.v_proj
    state = getattr(q, fused_ops._QKV)
    x, y = torch.randn(3, 5, 128), torch.randn(3, 5, 128)
    with torch.no_grad():
        def own(m, t):
            return F.linear(t, m.weight, m.bias)

        assert torch.allclose(q(x), own(q, x), atol=1e-5)
        assert torch.equal(k(y), own(k, y))  # another input: k's own GEMM, and its kept columns are dropped
        assert torch.equal(k(x), own(k, x))
        assert torch.allclose(v(x), own(v, x), atol=1e-5)
        assert state.x is None and not state.kept  # both handed out: nothing kept alive

        q(x)
        x.add_(1)  # changed in place after q saw it
        assert torch.equal(k(x), own(k, x)) and torch.equal(v(x), own(v, x))
        q(x)
        assert torch.equal(v(x.clone()), own(v, x))  # equal values, another tensor
        assert torch.equal(k(x), state.projs[1](x))  # still nothing kept: computed again, same result
        assert torch.equal(v(x), own(v, x)) and torch.equal(k(x), own(k, x))  # another order
    with torch.inference_mode():
        x = torch.randn(3, 5, 128)
        want = [own(m, x) for m in (q, k, v)]
        got = [m(x) for m in (q, k, v)]
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want, strict=True))


def test_fusing_twice_changes_nothing_and_a_replaced_weight_is_used():
    model = tiny_model()
    a = attentions(model)[0]
    assert fused_ops.fuse_qkv(a)
    ptrs = [m.weight.data_ptr() for m in (a.q_proj, a.k_proj, a.v_proj)]
    forwards = [vars(m)["forward"] for m in (a.q_proj, a.k_proj, a.v_proj)]
    assert fused_ops.fuse_qkv(a)
    assert [m.weight.data_ptr() for m in (a.q_proj, a.k_proj, a.v_proj)] == ptrs
    assert [vars(m)["forward"] for m in (a.q_proj, a.k_proj, a.v_proj)] == forwards

    # load_state_dict(assign=True) replaces the Parameters: no longer one tensor, so each runs its own GEMM
    x = torch.randn(4, 128)
    new_k = torch.randn_like(a.k_proj.weight)
    a.k_proj.load_state_dict({"weight": new_k}, assign=True)
    with torch.no_grad():
        a.q_proj(x)
        assert torch.equal(a.k_proj(x), F.linear(x, new_k))
    # and .to() of the whole model: every weight moved apart, every projection its own again
    model.double()
    with torch.no_grad():
        assert torch.equal(a.q_proj(x.double()), F.linear(x.double(), a.q_proj.weight))

    fused_ops.unfuse_qkv(a)
    assert not any("forward" in vars(m) for m in (a.q_proj, a.k_proj, a.v_proj))


def test_only_plain_matching_linears_are_fused():
    class Quantized(nn.Linear):
        pass

    class Attention(nn.Module):
        def __init__(self, k_in=16, k_type=nn.Linear, bias=(True, True, True)):
            super().__init__()
            self.q_proj = nn.Linear(16, 8, bias=bias[0])
            self.k_proj = k_type(k_in, 4, bias=bias[1])
            self.v_proj = nn.Linear(16, 4, bias=bias[2])

    for bad in (Attention(k_type=Quantized), Attention(k_in=12), Attention(bias=(True, False, True)), nn.Linear(2, 2)):
        params = dict(bad.named_parameters())
        assert not fused_ops.fuse_qkv(bad)
        assert dict(bad.named_parameters()) == params and not any("forward" in vars(m) for m in bad.modules())
    half = Attention()
    half.v_proj.half()
    assert not fused_ops.fuse_qkv(half)

    biased = Attention()
    x = torch.randn(3, 16)
    want = [m(x) for m in (biased.q_proj, biased.k_proj, biased.v_proj)]
    assert fused_ops.fuse_qkv(biased)
    assert biased.k_proj.bias.untyped_storage().data_ptr() == biased.q_proj.bias.untyped_storage().data_ptr()
    with torch.no_grad():
        got = [m(x) for m in (biased.q_proj, biased.k_proj, biased.v_proj)]
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want, strict=True))
    # with autograd on, the three Parameters each get their gradient: the separate GEMMs run
    sum(m(x).sum() for m in (biased.q_proj, biased.k_proj, biased.v_proj)).backward()
    assert all(m.weight.grad is not None for m in (biased.q_proj, biased.k_proj, biased.v_proj))


def test_the_probe_passes_the_fused_projections_and_names_a_mismatch(monkeypatch):
    a = attentions(tiny_model())[0]
    assert fused_ops.fuse_qkv(a)
    assert fused_ops.probe("qkv", fused_ops._qkv_matches, a) is True
    monkeypatch.setattr(fused_ops, "_QKV_TOL", -1.0)  # as if cuBLAS's fused GEMM rounded beyond the tolerance
    with pytest.warns(RuntimeWarning, match="failed its probe.*q_proj differs from its own GEMM"):
        assert fused_ops.probe("qkv", fused_ops._qkv_matches, a) is False
    monkeypatch.undo()
    state = getattr(a.q_proj, fused_ops._QKV)
    state.sizes = [state.sizes[0] - 64, state.sizes[1] + 64, state.sizes[2]]  # wrong slices
    with pytest.warns(RuntimeWarning, match=r"failed its probe.*q_proj gives torch.float32 \[2, 19, 64\]"):
        assert fused_ops.probe("qkv", fused_ops._qkv_matches, a) is False


def test_install_fuses_every_attention_once_and_leaves_other_models_alone(monkeypatch):
    model = tiny_model()
    assert fused._install_qkv(model) and fused._install_qkv(model)
    assert all(isinstance(getattr(a.v_proj, fused_ops._QKV), fused_ops._FusedQKV) for a in attentions(model))
    plain = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    assert not fused._install_qkv(plain) and not any("forward" in vars(m) for m in plain.modules())

    monkeypatch.setattr(fused_ops, "_QKV_TOL", -1.0)  # a probe that fails: every projection keeps its own GEMM
    model = tiny_model()
    with pytest.warns(RuntimeWarning, match="failed its probe"):
        assert not fused._install_qkv(model)
    assert not any("forward" in vars(m) for a in attentions(model) for m in (a.q_proj, a.k_proj, a.v_proj))
