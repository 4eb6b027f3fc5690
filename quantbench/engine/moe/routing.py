"""The grouped-MoE engine's routing bookkeeping as two Triton kernels instead of a chain of small PyTorch ones.

Why: at the Qwen3-30B-A3B shape (512 tokens, 128 experts, top-8) one layer spent about 36 µs on the H200 in
`route` and the final sum over the k slots, apart from the router's own GEMM (benchmarks/model_profile.py,
2026-11-30): softmax 1.8 µs, topk 14.2 (gatherTopK 9.3 + bitonicSort 4.9), renormalisation 2.2 + 1.7, the cast
to bf16 ~2.5, and `weighted.view(T, k, H).sum(1)` 10.9 µs (203 µs at 16,384 tokens).

- `route_topk(logits, top_k, norm_topk_prob)`: the engine's `route` after its F.linear, in one kernel: softmax in
  float32 in the order of torch's softmax_warp_forward (PersistentSoftmax.cuh, which torch runs for E <= 1024),
  top-k largest first, optional renormalisation in the order of torch's reduce kernel, rounding to the logits'
  dtype. On the H200 (torch 2.11, 2026-11-30) its values and indices were bit-identical to torch's ops on all
  591,264 random rows checked (E 8..1024, k 1..32, bf16 / fp16 / fp32, with and without renormalisation; indices
  compared on rows without exact ties), in 2.9 µs against 25.0 at 512 x 128 top-8 (12.9 against 134.8 µs at
  16,384 tokens). Exact ties: torch.topk keeps the lowest experts among those tied with the k-th value (its
  gatherTopK), as here, but lists tied experts in no fixed order (its bitonic sort is not stable; its docs say
  tied indices may vary); here the lower expert comes first.
- `sum_slots(weighted)`: [T, k, H] -> [T, H], the k slots summed in float32 in slot order, rounded once: 3.6 µs
  against 6.7 for torch's sum at 512 tokens, H 2048, top-8 (138 against 191 µs at 16,384), bf16 results
  identical to torch's on every element checked there (torch sums in another order: in fp32 42% of elements agree).

The engine calls them only on CUDA with Triton (`triton_available`); the CPU keeps its torch ops, and the tests run
these kernels under Triton's CPU interpreter against them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from quantbench.engine import pdl
from quantbench.engine.triton_common import interpreting, norm_tile, tl, triton

if triton is not None:  # what this file's kernels call (Triton resolves a callee in these globals)
    from triton.language.extra.cuda import libdevice

    from quantbench.engine.triton_common import round_bf16  # float32 -> nearest bfloat16 (integer ops)

ROUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_EXPERTS = 1024  # torch's warp softmax (whose order the kernel repeats) covers rows of up to 1024 float32
MAX_TOP_K = 32  # the selection loop is unrolled k times


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    @triton.jit
    def expf(x, INTERPRET: tl.constexpr):
        """CUDA's accurate expf, as torch's kernels call it (libdevice; Triton's tl.exp is ex2.approx). The
        interpreter has no libdevice: numpy's exp there."""
        if INTERPRET:
            return tl.exp(x)
        else:
            return libdevice.exp(x)

    @triton.jit
    def lanes_sum(v, lane, N: tl.constexpr):
        """The sum of v's N lanes (axis 1, N <= 32) as [rows, 1], in a warp's xor-shuffle order: lanes l and
        l + N/2 first, then l + N/4, ..., i.e. v[:, :16] + v[:, 16:], then [:8] + [8:16], ... Each step leaves
        every lane holding the same partial sums, so any lane holds the total."""
        for step in tl.static_range(5):
            off = N >> (step + 1)
            if off >= 1:
                v = v + tl.gather(v, tl.broadcast_to(lane ^ off, v.shape), axis=1)
        return tl.max(v, axis=1, keep_dims=True)

    @triton.jit
    def rounded(x, out_ty: tl.constexpr):
        """float32 to out_ty, rounded to nearest (bfloat16 in integers: the interpreter's cast truncates)."""
        if out_ty == tl.bfloat16:
            x = round_bf16(x)
        return x.to(out_ty)

    # Triton resolves a jitted callee through the caller's module globals
    pdl_open = pdl.triton_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(expf=expf, lanes_sum=lanes_sum, rounded=rounded, pdl_open=pdl_open)

    @triton.jit
    def route_kernel(logits_ptr, value_ptr, index_ptr, T, stride_t, E: tl.constexpr, K: tl.constexpr,
                     K_P2: tl.constexpr, NORM: tl.constexpr, LANES: tl.constexpr, ITERS: tl.constexpr,
                     BLOCK_T: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr):
        """softmax -> top-k -> renormalise -> round, for BLOCK_T rows of E logits.

        softmax repeats softmax_warp_forward's order: a row padded to P = LANES * ITERS (the next power of two)
        lies on LANES lanes, lane l holding elements l, l + LANES, ... ; the max is exact in any order; each
        lane sums its exp(x - max) in that order from 0.0, the lanes are folded by halves (the xor butterfly:
        [0:16] + [16:32], then [0:8] + [8:16], ...), and each element is exp(x - max) / sum, rounded once.
        top-k: K rounds of (row max, lowest column holding it, masked out): largest first, ties to the lower
        expert. renormalisation: the k values summed in the same butterfly order over K_P2 slots (what torch
        2.11's reduce kernel does on a short row: bit-identical on the H200 for k = 2..32), then v / sum."""
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < T
        base = logits_ptr + tl.minimum(rows, T - 1).to(tl.int64)[:, None] * stride_t  # spare rows reread the last
        cols = tl.arange(0, LANES * ITERS)[None, :]
        x = tl.load(base + cols, mask=cols < E, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=1)[:, None]

        lane = tl.arange(0, LANES)[None, :]
        s = tl.zeros([BLOCK_T, LANES], tl.float32)
        for it in tl.static_range(ITERS):  # each lane's own elements, in order (the row is in L1 by now)
            c = it * LANES + lane
            s += expf(tl.load(base + c, mask=c < E, other=float("-inf")).to(tl.float32) - m, INTERPRET)
        s = lanes_sum(s, lane, LANES)
        p = tl.math.div_rn(expf(x - m, INTERPRET), s)  # s: [BLOCK_T, 1]; div_rn: Triton's `/` is approximate
        p = tl.where(cols < E, p, float("-inf"))

        slot = tl.arange(0, K_P2)[None, :]
        top_v = tl.zeros([BLOCK_T, K_P2], tl.float32)
        top_i = tl.zeros([BLOCK_T, K_P2], tl.int32)
        for j in tl.static_range(K):
            v = tl.max(p, axis=1)[:, None]
            i = tl.min(tl.where(p == v, cols, LANES * ITERS), axis=1)[:, None]
            top_v = tl.where(slot == j, v, top_v)
            top_i = tl.where(slot == j, i, top_i)
            p = tl.where(cols == i, float("-inf"), p)

        if NORM:  # a lane per slot; slots past K hold 0.0, which adds nothing
            top_v = tl.math.div_rn(top_v, lanes_sum(top_v, slot, K_P2))

        out = rows.to(tl.int64)[:, None] * K + slot
        mask = row_ok[:, None] & (slot < K)
        tl.store(value_ptr + out, rounded(top_v, value_ptr.dtype.element_ty), mask=mask)
        tl.store(index_ptr + out, top_i.to(tl.int64), mask=mask)

    @triton.jit
    def sum_slots_kernel(w_ptr, r_ptr, out_ptr, H, K: tl.constexpr, BLOCK_H: tl.constexpr, RESIDUAL: tl.constexpr,
                         PDL: tl.constexpr):
        """out[t] = w[t, 0] + w[t, 1] + ... + w[t, K-1] in float32, left to right, rounded once; with RESIDUAL,
        then r[t] + that, rounded again (the decoder layer's `residual + mlp(x)`, as torch's add rounds it)."""
        pdl_open(PDL)
        t = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = h < H
        src = w_ptr + t * K * H + h
        acc = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        for j in tl.static_range(1, K):
            acc += tl.load(src + j * H, mask=mask, other=0.0).to(tl.float32)
        acc = rounded(acc, out_ptr.dtype.element_ty)
        if RESIDUAL:
            acc = rounded(acc.to(tl.float32) + tl.load(r_ptr + t * H + h, mask=mask, other=0.0).to(tl.float32),
                          out_ptr.dtype.element_ty)
        tl.store(out_ptr + t * H + h, acc, mask=mask)

    @triton.jit
    def sum_slots_norm_kernel(w_ptr, r_ptr, out_ptr, nw_ptr, y_ptr, T, eps, H: tl.constexpr, H_P2: tl.constexpr,
                              K: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr):
        """sum_slots_kernel with RESIDUAL for BLOCK_T whole rows, then the next RMSNorm of each row (written to y)
        as fused_ops.rmsnorm_kernel computes it: the same [BLOCK_T, H_P2] tile and warps, so the same reduction."""
        pdl_open(PDL)
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, H_P2)
        mask = (rows < T)[:, None] & (cols < H)[None, :]
        at = rows.to(tl.int64)[:, None] * H + cols[None, :]
        src = w_ptr + rows.to(tl.int64)[:, None] * K * H + cols[None, :]
        acc = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        for j in tl.static_range(1, K):
            acc += tl.load(src + j * H, mask=mask, other=0.0).to(tl.float32)
        out_ty = out_ptr.dtype.element_ty
        acc = rounded(acc, out_ty).to(tl.float32) + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
        out = rounded(acc, out_ty)
        tl.store(out_ptr + at, out, mask=mask)
        xf = out.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) * (1.0 / H) + eps)
        normed = rounded(xf * rstd[:, None], out_ty).to(tl.float32)
        w = tl.load(nw_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
        tl.store(y_ptr + at, (w[None, :] * normed).to(y_ptr.dtype.element_ty), mask=mask)

    return route_kernel, sum_slots_kernel, sum_slots_norm_kernel


def route_fits(logits: Tensor, top_k: int) -> bool:
    """Whether `route_topk` takes these logits: a float dtype, at most MAX_EXPERTS experts, 1 <= k <= MAX_TOP_K."""
    e = logits.shape[-1]
    return logits.dtype in ROUTE_DTYPES and e <= MAX_EXPERTS and 1 <= top_k <= min(e, MAX_TOP_K)


def route_topk(logits: Tensor, top_k: int, norm_topk_prob: bool) -> tuple[Tensor, Tensor]:
    """(top_value [..., k] in logits' dtype, top_index [..., k] int64) of softmax(logits, float32), largest first,
    optionally renormalised to sum to one: the engine's `route` after its F.linear, in one launch, no host sync."""
    assert route_fits(logits, top_k), (logits.dtype, logits.shape, top_k)
    e = logits.shape[-1]
    rows = logits.reshape(-1, e)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    t = rows.shape[0]
    values = torch.empty(t, top_k, dtype=logits.dtype, device=logits.device)
    index = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t:
        p2 = triton.next_power_of_2(e)
        lanes = min(p2, 32)
        block_t = 4  # a warp per row: 2.9 us at 512 x 128 top-8 on the H200 (3.7 with 8 rows on 4 warps)
        route_kernel = _kernels()[0]
        route_kernel[(triton.cdiv(t, block_t),)](
            rows, values, index, t, rows.stride(0), E=e, K=top_k, K_P2=triton.next_power_of_2(top_k),
            NORM=norm_topk_prob, LANES=lanes, ITERS=p2 // lanes, BLOCK_T=block_t, INTERPRET=interpreting(),
            num_warps=4, enable_reflect_ftz=False,  # expf keeps subnormals, as torch's (no -ftz) does
            **pdl.launch_args(logits.device),
        )
    shape = (*logits.shape[:-1], top_k)
    return values.reshape(shape), index.reshape(shape)


def _residual_of(weighted: Tensor, residual: Tensor) -> Tensor:
    """`residual` as the [T, H] contiguous tensor of weighted's dtype that the k-slot sum adds, or a ValueError."""
    t, _, h = weighted.shape
    if residual.shape != (t, h) or residual.dtype != weighted.dtype:
        raise ValueError(f"residual {list(residual.shape)} {residual.dtype}: expected [{t}, {h}] {weighted.dtype}")
    return residual.contiguous()


def sum_slots(weighted: Tensor, residual: Tensor | None = None) -> Tensor:
    """[T, k, H] -> [T, H] in weighted's dtype: the k slots summed in float32 in slot order, rounded once; plus
    `residual` [T, H] (weighted's dtype) when given, rounded once more: `residual + sum` as torch computes it."""
    t, k, h = weighted.shape
    weighted = weighted.contiguous()
    if residual is not None:
        residual = _residual_of(weighted, residual)
    out = torch.empty(t, h, dtype=weighted.dtype, device=weighted.device)
    if t and h:
        block_h = min(1024, triton.next_power_of_2(h))
        sum_slots_kernel = _kernels()[1]
        sum_slots_kernel[(t, triton.cdiv(h, block_h))](weighted, residual, out, h, K=k, BLOCK_H=block_h,
                                                       RESIDUAL=residual is not None, num_warps=4,
                                                       **pdl.launch_args(weighted.device))
    return out


def sum_slots_norm(weighted: Tensor, residual: Tensor, norm_weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(residual + sum_slots(weighted), RMSNorm of that with `norm_weight`, as transformers' RMSNorm rounds): the
    decoder layer's output and the next layer's input norm in one pass (quantbench.engine.fused.layer)."""
    t, k, h = weighted.shape
    weighted, residual = weighted.contiguous(), _residual_of(weighted, residual)
    out = torch.empty(t, h, dtype=weighted.dtype, device=weighted.device)
    normed = torch.empty(t, h, dtype=torch.promote_types(norm_weight.dtype, weighted.dtype), device=weighted.device)
    if t and h:
        h_p2, block_t, warps = norm_tile(h)  # fused_ops.rms_norm's tile and warps: the same reduction order
        _kernels()[2][(triton.cdiv(t, block_t),)](weighted, residual, out, norm_weight, normed, t, float(eps), H=h,
                                                  H_P2=h_p2, K=k, BLOCK_T=block_t, num_warps=warps,
                                                  **pdl.launch_args(weighted.device))
    return out, normed
