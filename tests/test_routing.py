"""quantbench.engine.moe.routing: the route kernel (softmax + top-k + renormalisation + cast) and the sum over the k slots,
run under Triton's CPU interpreter against the engine's torch ops and against the order each kernel documents.

Under the interpreter exp is numpy's, not CUDA's expf, so the kernel is compared bit for bit with that order spelled
out in torch around numpy's exp, and with torch's CPU ops (other exp, other sums) on indices and within a rounding
step on values. The interpreter truncates float32 -> bfloat16 casts; the kernels round in integer arithmetic
(triton_common.round_bf16), so bfloat16 results compare exactly. On a GPU the last test checks them against torch's CUDA
ops bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.interpreted import run_interpreted

ORDER = """
import numpy as np
import torch
import torch.nn.functional as F


def torch_route(logits, k, norm):  # the engine's route() after F.linear, on the CPU
    v, i = torch.topk(torch.softmax(logits, dtype=torch.float, dim=-1), k, dim=-1)
    if norm:
        v /= v.sum(dim=-1, keepdim=True)
    return v.to(logits.dtype), i


def fold(v):  # lanes l and l + n/2 first, then l + n/4, ...: the xor butterfly
    while v.shape[1] > 1:
        v = v[:, : v.shape[1] // 2] + v[:, v.shape[1] // 2 :]
    return v


def kernel_order(logits, k, norm):  # what route_kernel documents, with numpy's exp as the interpreter has it
    t, e = logits.shape
    p2 = 1 << (e - 1).bit_length()
    lanes = min(p2, 32)
    x = F.pad(logits.float(), (0, p2 - e), value=float("-inf"))
    ex = torch.from_numpy(np.exp((x - x.max(1, keepdim=True).values).numpy()))
    s = torch.zeros(t, lanes)
    for it in range(p2 // lanes):  # lane l sums elements l, l + lanes, ... in order
        s = s + ex[:, it * lanes : (it + 1) * lanes]
    p = (ex / fold(s))[:, :e]
    v, i = torch.sort(p, dim=1, descending=True, stable=True)  # equal values: lower expert first
    v, i = v[:, :k], i[:, :k]
    if norm:
        v = v / fold(F.pad(v, (0, (1 << (k - 1).bit_length()) - k)))
    return v.to(logits.dtype), i


def distinct_logits(t, e, dtype):  # no two experts of a row tie (a permutation of e grid values, exact in bf16)
    grid = torch.stack([torch.randperm(e) for _ in range(t)]).float() * (8 / e) - 4
    return grid.to(dtype) if dtype == torch.bfloat16 else grid + 0.01 * torch.rand(t, e)
"""


def test_route_kernel_matches_torch_and_its_documented_order_under_the_interpreter():
    pytest.importorskip("triton")
    run_interpreted(ORDER + """
from quantbench.engine.moe.routing import route_topk

torch.manual_seed(0)
ulps = cases = 0
for t, e in ((1, 8), (5, 64), (37, 128), (9, 8)):
    for k in (1, 2, 8):
        for dtype in (torch.float32, torch.bfloat16):
            for norm in (False, True):
                logits = distinct_logits(t, e, dtype)
                v, i = route_topk(logits, k, norm)
                want_v, want_i = kernel_order(logits, k, norm)
                assert v.dtype == dtype and i.dtype == torch.int64 and v.shape == i.shape == (t, k)
                assert torch.equal(i, want_i) and torch.equal(v, want_v), (t, e, k, dtype, norm)
                cpu_v, cpu_i = torch_route(logits, k, norm)
                assert torch.equal(i, cpu_i), (t, e, k, dtype, norm)
                # another exp and other sums: within 4 ulps in float32, one rounding step in bfloat16
                step = 2.0 ** -21 if dtype == torch.float32 else 2.0 ** -7
                assert ((v.float() - cpu_v.float()).abs() <= step * cpu_v.float().abs()).all(), (t, e, k, dtype, norm)
                ulps += int((v != cpu_v).sum()) if dtype == torch.bfloat16 else 0
                cases += v.numel() if dtype == torch.bfloat16 else 0
assert ulps <= 0.01 * cases, (ulps, cases)  # bf16 weights off torch's CPU ones by one step: rare
print("ok")
""")


def test_route_kernel_lists_tied_experts_lowest_first_under_the_interpreter():
    pytest.importorskip("triton")
    run_interpreted(ORDER + """
from quantbench.engine.moe.routing import route_topk

torch.manual_seed(1)
logits = torch.randint(-2, 3, (16, 64)).float()  # about 13 experts per value: ties inside and across the k-th
logits[0] = 0.0  # one row all tied
for dtype in (torch.float32, torch.bfloat16):
    for norm in (False, True):
        v, i = route_topk(logits.to(dtype), 8, norm)
        want_v, want_i = kernel_order(logits.to(dtype), 8, norm)
        assert torch.equal(i, want_i) and torch.equal(v, want_v), (dtype, norm)
        assert i[0].tolist() == list(range(8))
        for row, idx in zip(logits, i):  # the lowest experts of the k-th value's tie are the ones kept
            kth = row[idx[-1]]
            assert set((row > kth).nonzero().flatten().tolist()) <= set(idx.tolist())
            assert idx[row[idx] == kth].tolist() == (row == kth).nonzero().flatten()[: int((row[idx] == kth).sum())].tolist()
print("ok")
""")


def test_sum_slots_adds_the_slots_in_order_in_float32_and_rounds_once_under_the_interpreter():
    pytest.importorskip("triton")
    run_interpreted("""
import torch
from quantbench.engine.moe.routing import sum_slots

torch.manual_seed(2)
for t, k, h in ((1, 1, 64), (7, 2, 100), (3, 8, 2048)):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        w = (torch.randn(t, k, h) * 4).to(dtype)
        got = sum_slots(w)
        acc = w[:, 0].float()
        for j in range(1, k):
            acc = acc + w[:, j].float()
        assert got.dtype == dtype and got.shape == (t, h)
        assert torch.equal(got, acc.to(dtype)), (t, k, h, dtype)
        torch.testing.assert_close(got, w.sum(1))  # torch's sum, up to its order
print("ok")
""")


def test_the_engine_keeps_torchs_ops_on_the_cpu(monkeypatch):
    from quantbench.engine.moe import engine
    from quantbench.engine.moe.engine import DenseExperts, GroupedMoE, route

    def no_kernel(*_):
        raise AssertionError("a routing kernel ran on the CPU")

    monkeypatch.setattr(engine, "route_topk", no_kernel)
    monkeypatch.setattr(engine, "sum_slots", no_kernel)
    torch.manual_seed(3)
    gate = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(6, 16)
    weights, index = route(x, gate.weight, 2, True)
    probs = torch.softmax(gate(x), dtype=torch.float, dim=-1)
    want_w, want_i = probs.topk(2, dim=-1)
    assert torch.equal(index, want_i) and torch.equal(weights, want_w / want_w.sum(-1, keepdim=True))
    moe = GroupedMoE(gate, DenseExperts(torch.randn(8, 2 * 4, 16)), DenseExperts(torch.randn(8, 16, 4)), top_k=2,
                     norm_topk_prob=True)
    assert moe(x).shape == x.shape and moe.kernel_path == "cpu-vectorised"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_kernels_match_torchs_cuda_ops_bit_for_bit():
    pytest.importorskip("triton")
    from quantbench.engine.moe.routing import route_topk, sum_slots

    def bits(v):
        return v.view(torch.int16 if v.element_size() == 2 else torch.int32)

    torch.manual_seed(4)
    for e, k in ((8, 8), (60, 6), (128, 8), (256, 1), (1024, 32)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for norm in (False, True):
                logits = (torch.randn(1000, e, device="cuda") * 4).to(dtype)
                v, i = route_topk(logits, k, norm)
                want_v, want_i = torch.topk(torch.softmax(logits, dtype=torch.float, dim=-1), k, dim=-1)
                if norm:
                    want_v /= want_v.sum(dim=-1, keepdim=True)
                p = torch.softmax(logits, dtype=torch.float, dim=-1).sort(-1, descending=True).values
                tied = (p[:, : min(k + 1, e) - 1] == p[:, 1 : min(k + 1, e)]).any(-1)
                assert torch.equal(bits(v), bits(want_v.to(dtype))), (e, k, dtype, norm)
                assert torch.equal(i[~tied], want_i[~tied]), (e, k, dtype, norm)
                assert torch.equal(i.sort(-1).values, want_i.sort(-1).values), (e, k, dtype, norm)
    w = torch.randn(512, 8, 2048, device="cuda").bfloat16()
    acc = w[:, 0].float()
    for j in range(1, 8):
        acc = acc + w[:, j].float()
    assert torch.equal(bits(sum_slots(w)), bits(acc.bfloat16()))
