"""Experimental variants of the int4 grouped-MoE kernel, measured against the production kernel on the H200.

    python benchmarks/int4_lab.py [--tokens 512]

Variants of gate_up + SwiGLU (same int4 weights, same routing, 30B-A3B shape), each with its time (triton
do_bench, median) and its largest difference from the production kernel (quantbench.engine.moe.int4):
  prod         as the engine calls it (tokens gathered through the row index), and on pre-gathered rows;
  kdot         the 8 nibble slices of a packed block dequantized as one [128, N] tile: one K=128 dot per block;
  interleaved  gate and up in one K loop: each x slice loaded once feeds two independent dot chains;
  two-accumulator down: even and odd slices into two accumulators (two independent dot chains).
The production kernel waits for each tensor-core dot before the next (TTGIR: a warp_group_dot_wait per dot),
so independent chains are what could overlap them.
Measured and dropped on 2026-11-30 (H200, this file's history): gate_up without the SwiGLU epilogue (one
accumulator, SwiGLU apart): 218.5 us against 215; the K loop split over 2 or 4 programs adding float32 partial
sums: 261-358 us (slower at every block size).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe.int4 import rtn_experts  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm  # noqa: E402

E, H, INTER, TOP_K = 128, 2048, 768, 8


@functools.cache
def lab_kernel():
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    import triton
    import triton.language as tl

    from quantbench.engine.triton_common import expert_tile, tile_rows

    globals().update(expert_tile=expert_tile, tile_rows=tile_rows)

    @triton.jit
    def kdot_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols, cmask, stride_qe, stride_qk, stride_se,
                  stride_sg, K: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One [128, BLOCK_N] dequantized tile and one K=128 dot per packed block (G >= 128)."""
        sub = tl.arange(0, 16)
        shifts = (tl.arange(0, 8) * 4)[:, None, None]
        q_ptrs = qw_ptr + e64 * stride_qe + sub[:, None] * stride_qk + cols[None, :]
        kk = tl.arange(0, 128)
        x_ptrs = x_ptr + x_rows[None, :] + kk[:, None]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kb in range(0, K, 128):
            q = tl.load(q_ptrs + (kb // 8) * stride_qk, mask=cmask[None, :], other=0)
            g = kb // G
            s = tl.load(s_ptr + e64 * stride_se + g * stride_sg + cols, mask=cmask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + e64 * stride_se + g * stride_sg + cols, mask=cmask, other=0).to(tl.float32)
            x = tl.load(x_ptrs + kb, mask=rmask[None, :], other=0.0)
            v = ((((q[None, :, :] >> shifts) & 0xF) << 16) | 0x43000000).to(tl.float32, bitcast=True)
            w = tl.reshape(v * s[None, None, :] - ((z + 128.0) * s)[None, None, :], (128, BLOCK_N)).to(x.dtype)
            acc = tl.dot(tl.trans(w), x, acc)
        return acc

    globals()["kdot_tile"] = kdot_tile

    @triton.jit
    def il_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols, cmask, HALF, stride_qe, stride_qk, stride_se,
                stride_sg, K: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SWIGLU: tl.constexpr, SPLIT_ACC: tl.constexpr):
        """gate and up in one K loop (one x load feeds both dots: two independent accumulator chains), or with
        SPLIT_ACC one projection's even and odd slices into two accumulators."""
        sub = tl.arange(0, 16)
        q_ptrs = qw_ptr + e64 * stride_qe + sub[:, None] * stride_qk + cols[None, :]
        sz = s_ptr + e64 * stride_se + cols
        zz = z_ptr + e64 * stride_se + cols
        x_ptrs = x_ptr + x_rows[None, :] + sub[:, None]
        acc_a = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_b = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kb in range(0, K, 128):
            qa = tl.load(q_ptrs + (kb // 8) * stride_qk, mask=cmask[None, :], other=0)
            if SWIGLU:
                qb = tl.load(q_ptrs + HALF + (kb // 8) * stride_qk, mask=cmask[None, :], other=0)
            for j in tl.static_range(8):
                if j == 0 or G < 128:
                    g = (kb + j * 16) // G
                    sa = tl.load(sz + g * stride_sg, mask=cmask, other=0.0).to(tl.float32)
                    ca = (tl.load(zz + g * stride_sg, mask=cmask, other=0).to(tl.float32) + 128.0) * sa
                    if SWIGLU:
                        sb = tl.load(sz + HALF + g * stride_sg, mask=cmask, other=0.0).to(tl.float32)
                        cb = (tl.load(zz + HALF + g * stride_sg, mask=cmask, other=0).to(tl.float32) + 128.0) * sb
                x = tl.load(x_ptrs + kb + j * 16, mask=rmask[None, :], other=0.0)
                va = ((((qa >> (4 * j)) & 0xF) << 16) | 0x43000000).to(tl.float32, bitcast=True)
                wa = (va * sa[None, :] - ca[None, :]).to(x.dtype)
                if SWIGLU:
                    vb = ((((qb >> (4 * j)) & 0xF) << 16) | 0x43000000).to(tl.float32, bitcast=True)
                    wb = (vb * sb[None, :] - cb[None, :]).to(x.dtype)
                    acc_a = tl.dot(tl.trans(wa), x, acc_a)
                    acc_b = tl.dot(tl.trans(wb), x, acc_b)
                elif SPLIT_ACC and j % 2 == 1:
                    acc_b = tl.dot(tl.trans(wa), x, acc_b)
                else:
                    acc_a = tl.dot(tl.trans(wa), x, acc_a)
        if SWIGLU:
            return acc_a * tl.sigmoid(acc_a) * acc_b
        elif SPLIT_ACC:
            return acc_a + acc_b
        else:
            return acc_a

    globals()["il_tile"] = il_tile

    @triton.jit
    def lab_grouped_kernel(x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, N_OUT, HALF,
                           stride_xm, stride_qe, stride_qk, stride_se, stride_sg, stride_ym,
                           K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr, G: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr, TILE: tl.constexpr,
                           SWIGLU: tl.constexpr, SPLIT_ACC: tl.constexpr, ROW_SCALE: tl.constexpr):
        pid_n = tl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, tl.program_id(1), E, E_P2, BLOCK_M)
        if e >= E:
            return
        rows, rmask, x_rows = tile_rows(rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N_OUT
        e64 = e.to(tl.int64)
        if TILE == "kdot":
            gate = kdot_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols, cmask, stride_qe, stride_qk,
                             stride_se, stride_sg, K, G, BLOCK_M, BLOCK_N)
            up = kdot_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols + HALF, cmask, stride_qe, stride_qk,
                           stride_se, stride_sg, K, G, BLOCK_M, BLOCK_N)
            out = gate * tl.sigmoid(gate) * up
        else:
            out = il_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols, cmask, HALF, stride_qe, stride_qk,
                          stride_se, stride_sg, K, G, BLOCK_M, BLOCK_N, SWIGLU, SPLIT_ACC)
        if ROW_SCALE:
            out = out * tl.load(rowscale_ptr + rows, mask=rmask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + rows[None, :].to(tl.int64) * stride_ym + cols[:, None]
        tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=rmask[None, :] & cmask[:, None])

    return lab_grouped_kernel


def lab_mm(x, w, offsets, cfg, *, tile="il", swiglu=False, split_acc=False, row_index=None, row_scale=None):
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    import triton

    rows = x.shape[0] if row_index is None else row_index.shape[0]
    e, _, n = w.qweight.shape
    n_out = n // 2 if swiglu else n
    y = torch.empty(rows, n_out, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n_out, cfg["BLOCK_N"]), triton.cdiv(rows, cfg["BLOCK_M"]) + e)
    compiled = lab_kernel()[grid](
        x, w.qweight, w.scales, w.zeros, y, offsets, offsets if row_index is None else row_index,
        offsets if row_scale is None else row_scale, n_out, n // 2, x.stride(0), w.qweight.stride(0),
        w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1), y.stride(0), K=x.shape[1], E=e,
        E_P2=triton.next_power_of_2(e), G=w.group_size, GATHER=row_index is not None, TILE=tile, SWIGLU=swiglu,
        SPLIT_ACC=split_acc, ROW_SCALE=row_scale is not None, **cfg)
    lab_mm.last = compiled
    return y


def main() -> None:
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    torch.manual_seed(0)
    t = args.tokens
    rows = t * TOP_K
    ids = torch.rand(t, E, device="cuda").topk(TOP_K, dim=-1).indices.flatten()
    order = torch.sort(ids).indices
    row_index = (order // TOP_K).int()
    offsets = torch.cumsum(torch.bincount(ids, minlength=E), 0).to(torch.int32)
    gu = rtn_experts(torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16) * 0.02)
    dn = rtn_experts(torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16) * 0.02)
    x = torch.randn(t, H, device="cuda", dtype=torch.bfloat16)
    scale = torch.rand(rows, device="cuda", dtype=torch.bfloat16)

    def prod():
        h = int4_grouped_mm(x, gu.qweight, gu.scales, gu.zeros, offsets, 128, row_index=row_index, swiglu=True)
        return int4_grouped_mm(h, dn.qweight, dn.scales, dn.zeros, offsets, 128, row_scale=scale), h

    ref_y, ref_h = prod()
    base = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    gu_kw = dict(row_index=row_index, swiglu=True)
    dn_kw = dict(row_scale=scale)
    variants = [
        ("prod gate_up", ref_h, lambda: int4_grouped_mm(x, gu.qweight, gu.scales, gu.zeros, offsets, 128, **gu_kw)),
        ("prod down", ref_y, lambda: int4_grouped_mm(ref_h, dn.qweight, dn.scales, dn.zeros, offsets, 128, **dn_kw)),
        ("kdot gate_up", ref_h, lambda: lab_mm(x, gu, offsets, base, tile="kdot", **gu_kw)),
    ]
    for cfg in (base, dict(base, num_stages=2), dict(base, num_stages=4), dict(base, BLOCK_N=128, num_warps=8),
                dict(base, BLOCK_M=32)):
        variants.append((f"interleaved gate_up {cfg}", ref_h, lambda c=cfg: lab_mm(x, gu, offsets, c, **gu_kw)))
    for cfg in (dict(base, num_stages=2), base, dict(base, BLOCK_N=128, num_warps=8)):
        variants.append((f"two-accumulator down {cfg}", ref_y,
                         lambda c=cfg: lab_mm(ref_h, dn, offsets, c, split_acc=True, **dn_kw)))
    for label, want, call in variants:
        try:
            out = call()
            diff = float((out.float() - want.float()).abs().max() / want.float().abs().max())
            ms = do_bench(call, warmup=25, rep=200)
            k = getattr(lab_mm, "last", None) if "prod" not in label else None
            res = f" regs {k.n_regs} smem {k.metadata.shared}" if k is not None else ""
            print(f"{label:72s} {ms * 1e3:7.1f} us  max rel diff {diff:.1e}{res}", flush=True)
        except Exception as exc:  # a variant that fails to compile is reported, the others still run
            print(f"{label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


if __name__ == "__main__":
    main()
