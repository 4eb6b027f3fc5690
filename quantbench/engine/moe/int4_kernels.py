"""The Triton kernels of the INT4 format (quantbench.engine.moe.int4): the fused grouped GEMM, which unpacks the
int4 words in registers inside the K loop so that no BF16 copy of the weights is ever written to memory, its block
sizes (TUNED, pick_config; on sm_90 the Gluon kernel of int4_wgmma instead), and a one-pass dequantize kernel (the
GPU fallback). They read the 128-row block layout described in int4.py's module doc; this module owns its
constants (FUSED_K_BLOCK), so that the format imports the kernels and never the other way round.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from quantbench.engine import pdl
from quantbench.engine.moe import gluon_common, int4_wgmma
from quantbench.engine.triton_common import rows_bucket, tl, triton

if triton is not None:  # the M-tile helpers every grouped kernel shares (Triton resolves them in these globals)
    from quantbench.engine.triton_common import expert_tile, tile_rows

FUSED_KERNEL = "triton-fused-int4"
FUSED_K_BLOCK = 128  # the layout the kernel reads: 8 slices of 16 rows per block


def fused_supported(k: int, group_size: int, k_block: int = FUSED_K_BLOCK) -> bool:
    """The kernel reads the 128-row block layout; a group never straddles one of its 16-row slices."""
    if k_block != FUSED_K_BLOCK or k % FUSED_K_BLOCK:
        return False
    return group_size % FUSED_K_BLOCK == 0 if group_size >= FUSED_K_BLOCK else group_size % 16 == 0


# Block sizes measured best on an H200 (benchmarks/moe_int4.py sweep, 2026-11-29) per (N, K, swiglu, rows-per-
# expert bucket); other shapes use the heuristic below. At the Qwen3-30B-A3B shape, 512 tokens: gate_up + SwiGLU
# 188 us with gate and up in one K loop (216 us as two loops; benchmarks/int4_lab.py, 2026-11-30), down + routing
# weights 128 us (scaling after the dot, in a second accumulator: 268 + 144 us; the first version, x @ W with 8
# redundant word loads: 426 + 235 us).
# At 16,384 tokens ("large", ~1,024 rows per expert; benchmarks/kernel_sweep.py, 2026-11-30) the down projection
# runs best in the plain orientation with 128 x 128 tiles (1,597 us against 2,272 with the mid configuration), and
# gate_up + SwiGLU is faster as dequantize + torch._grouped_mm (2,390 us) than fused (2,918 us at best): from
# DEQUANT_FROM_ROWS[(N, K)] rows per expert the format declines its fused kernel and the engine dequantizes.
_H200_BEST = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SWAP_AB": True, "EVICT": False}
TUNED: dict[tuple[int, int, bool, str], dict[str, Any]] = {
    (1536, 2048, True, "mid"): _H200_BEST,
    (2048, 768, False, "mid"): dict(_H200_BEST, num_stages=2),
    (2048, 768, False, "large"): dict(_H200_BEST, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, SWAP_AB=False),
}
# That comparison was the Triton kernel's. The Gluon kernel (int4_wgmma) beats dequantize + grouped_mm where it
# was measured against it (H200, `benchmarks/kernel_sweep.py --tokens 2048,8192 --formats int4`, 2026-12-02):
# gate_up 300.7 against 729.5 us at 128 rows per expert, 975.5 against 1,407.9 us at 512. From 2026-12-02 to
# 2026-12-03 it still dequantized from 1,024 rows per expert, where the two had not been compared: a pass of 32
# decisions of 512 tokens (1,024 rows per expert) then took 261.7 ms at the 30B shape, 2.33x the 112.3 ms of 16
# (`quantbench run --concurrency 32 / 16`, H200). Measured since (benchmarks/dequant_threshold.py, docs/
# BENCHMARKS.md), the Gluon kernel wins at 512 to 2,048 rows per expert: on sm_90 the engine never dequantizes.
DEQUANT_FROM_ROWS: dict[tuple[str, int, int], int] = {("triton", 1536, 2048): 512}


def dequantize_instead(kernel: str, n: int, k: int, rows: int, experts: int) -> bool:
    """Whether `rows` sorted rows over `experts` experts of an [N, K] projection run faster as one dequantized copy
    + a CUTLASS grouped GEMM than through `kernel` ("gluon" / "triton"): compute-bound, by DEQUANT_FROM_ROWS."""
    threshold = DEQUANT_FROM_ROWS.get((kernel, n, k))
    return threshold is not None and rows >= threshold * experts
# The Gluon kernel's tiles per rows-per-expert bucket (BLOCK_N weight rows, gate and up stacked for SwiGLU, x
# BLOCK_M tokens; one warpgroup; AHEAD blocks of tokens and words copied ahead), measured on an H200 at the
# Qwen3-30B-A3B shape (.dev sweeps recorded in docs/BENCHMARKS.md, 2026-11-30, fifth session):
# - small (128 tokens): 16 x 128, gate_up 76.6 / down 47.6 us (16 x 64: 84.9 / 51.8; Triton: 155.9 / 110.5);
#   the model's 128-token decision 8.1 ms;
# - mid (512 tokens) and large (batch 8 and 32): 64 x 128, on the random-weight model's routing (most of a layer's
#   rows on ~13 experts with 250 to 510 rows, ~20 to 50 experts with 1 to 16); 32 x 128 is faster alone on
#   uniform routing but not in the model (2026-11-30; again 2026-12-03: 2.411 against 2.367 ms for 8 layers).
# Since 2026-12-03 (benchmarks/tile_plans.py on the model's own routing, 8 layers, one H200; docs/BENCHMARKS.md):
# SMALL_M / MID_M give an expert with at most 16 / 32 rows one 16- / 32-token tile instead of a 64-token one,
# in the same launch (gluon_common.tile_map; bit-identical: 2.296 against 2.367 ms for 8 layers at batch 1; a
# launch per tile size was slower, 2.562); SCALED multiplies the group's scale into the weights (one rounding per
# weight, as dequantize() rounds; no partial sum per block, 166 registers instead of 234) so that with AHEAD 1
# three programs fit on an SM instead of two: 2.181 ms with both (-7.9%), 11.085 against 11.565 ms at batch 8, and
# the 48-layer decision through `quantbench run` 11.0 against 11.8 ms on one machine.
# Since 2026-12-03 (benchmarks/batch_tiles.py, batches of 8 and 16 decisions, 8 layers, one H200): large takes
# 128-token tiles (each dequantized weight feeds twice the tokens; same bits: a token tile does not change any
# output's sum order): 10.56 against 11.06 ms at batch 8, 20.12 against 21.03 at batch 16 (-4.3%); 8 warps (two
# warpgroups) lost or crashed ptxas, 256 weight rows did not compile.
# short-k: mid and large below gluon_common.PLAN_MIN_K inputs keep the tiles before (the fixture, K 256).
# Since 2026-12-04 (benchmarks/tile_probe.sh, one H200): mid caps the registers at 128 (ptxas: 145 / 166 without;
# with the cap no spill in a K loop, 8 bytes stored around one), so four programs fit an SM instead of three, as
# their 56 / 52 KB of shared memory allow: the 48-layer decision 10.86 against 11.10 ms p50, the same answers bit
# for bit. 64 weight rows a program (five programs an SM) lost at every batch: 28% more instructions a weight.
WGMMA_TILES: dict[str, dict[str, Any]] = {
    "small": dict(BLOCK_M=16, BLOCK_N=128, AHEAD=2),
    "mid": dict(BLOCK_M=64, BLOCK_N=128, AHEAD=1, SCALED=2, SMALL_M=16, MID_M=32, maxnreg=128),
    "large": dict(BLOCK_M=128, BLOCK_N=128, AHEAD=1, SCALED=2, SMALL_M=16, MID_M=32),
    "short-k": dict(BLOCK_M=64, BLOCK_N=128, AHEAD=2),
}


def pick_config(rows: int, experts: int, n: int, k: int, group_size: int, swiglu: bool = False,
                device: torch.device | None = None) -> dict[str, Any]:
    """Block sizes for `rows` sorted rows over `experts` experts (a batch-1 decision of 512 tokens at top-8 of
    128 experts gives each expert about 32 rows: the "mid" bucket). The weights take the tensor core's M side
    (SWAP_AB): a token tile of 16..64 rows is then a legal, full MMA N. On an sm_90 `device` it is the Gluon
    kernel's tile (int4_wgmma; faster than this file's Triton kernel in every bucket measured)."""
    bucket = rows_bucket(rows, experts)
    if device is not None and int4_wgmma.available(device, group_size, k):
        return dict(gluon_common.tiles_for("int4", gluon_common.plan_bucket(bucket, k), WGMMA_TILES), KERNEL="gluon")
    tuned = TUNED.get((n, k, swiglu, bucket))
    if tuned:
        return dict(tuned)
    return dict(_H200_BEST, BLOCK_M=16 if bucket == "small" else 64)


@functools.cache
def _kernel() -> Any:
    @triton.jit
    def dequant_slice(q, j: tl.constexpr, s, c):
        """Rows of nibble j of the words q, as float32 s * (q - z) (c = (z + 128) s). No int->float conversion:
        the code sits in the mantissa of 128.0 (0x43000000 | q << 16 is the float 128 + q) and one FMA takes the
        bias and zero point off exactly: (128 + q) s - (128 + z) s."""
        v = ((((q >> (4 * j)) & 0xF) << 16) | 0x43000000).to(tl.float32, bitcast=True)
        return v * s[None, :] - c[None, :]

    @triton.jit
    def mma(w, x, acc, SWAP_AB: tl.constexpr):
        if SWAP_AB:  # weights as the MMA's M side (x^T as B): small token tiles still fill the tensor core
            return tl.dot(tl.trans(w), x, acc)
        else:
            return tl.dot(x, w, acc)

    @triton.jit
    def int4_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e, cols, cmask, HALF,
                  stride_qe, stride_qk, stride_se, stride_sg,
                  K: tl.constexpr, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  SWAP_AB: tl.constexpr, EVICT: tl.constexpr, SWIGLU: tl.constexpr):
        """x[rows] @ W[e][:, cols] as float32 [BLOCK_M, BLOCK_N] (or its transpose when SWAP_AB). SWIGLU:
        silu(x @ W[:, cols]) * (x @ W[:, HALF + cols]) from one K loop, each x slice feeding both dots: two
        independent accumulator chains (Triton waits for every tensor-core dot before the next; measured on the
        H200, one loop for both takes gate_up + SwiGLU from 216 to 188 us)."""
        KB: tl.constexpr = 128  # rows per packed block (FUSED_K_BLOCK)
        SUB: tl.constexpr = 16  # rows per nibble slice
        sub = tl.arange(0, SUB)
        q_ptrs = qw_ptr + e * stride_qe + sub[:, None] * stride_qk + cols[None, :]
        sz_off = e * stride_se + cols
        if SWAP_AB:
            x_ptrs = x_ptr + x_rows[None, :] + sub[:, None]
            xmask = rmask[None, :]
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            x_ptrs = x_ptr + x_rows[:, None] + sub[None, :]
            xmask = rmask[:, None]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros_like(acc)
        for kb in range(0, K, KB):
            # one load of the block's 16 x BLOCK_N words; nibble j holds rows kb + 16j .. kb + 16j + 15
            # (EVICT: weights stream through once; keep x, re-read by every column block, in L2)
            if EVICT:
                q = tl.load(q_ptrs + (kb // 8) * stride_qk, mask=cmask[None, :], other=0, eviction_policy="evict_first")
            else:
                q = tl.load(q_ptrs + (kb // 8) * stride_qk, mask=cmask[None, :], other=0)
            if SWIGLU:
                qu = tl.load(q_ptrs + HALF + (kb // 8) * stride_qk, mask=cmask[None, :], other=0)
            for j in tl.static_range(8):
                if j == 0 or G < KB:  # a group spans whole 16-row slices (fused_supported)
                    g_off = sz_off + ((kb + j * SUB) // G) * stride_sg
                    s = tl.load(s_ptr + g_off, mask=cmask, other=0.0).to(tl.float32)
                    c = (tl.load(z_ptr + g_off, mask=cmask, other=0).to(tl.float32) + 128.0) * s
                    if SWIGLU:
                        su = tl.load(s_ptr + g_off + HALF, mask=cmask, other=0.0).to(tl.float32)
                        cu = (tl.load(z_ptr + g_off + HALF, mask=cmask, other=0).to(tl.float32) + 128.0) * su
                x = tl.load(x_ptrs + kb + j * SUB, mask=xmask, other=0.0)
                # W = s * (q - z) rounded to x's dtype, as dequantize() writes it, straight into the accumulator
                acc = mma(dequant_slice(q, j, s, c).to(x.dtype), x, acc, SWAP_AB)
                if SWIGLU:
                    up = mma(dequant_slice(qu, j, su, cu).to(x.dtype), x, up, SWAP_AB)
        if SWIGLU:
            acc = acc * tl.sigmoid(acc) * up
        return acc

    # Triton resolves a jitted callee through the caller's module globals, not through this closure.
    globals().update(dequant_slice=dequant_slice, mma=mma, int4_tile=int4_tile)
    pdl_open = pdl.triton_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(pdl_open=pdl_open)

    @triton.jit
    def int4_grouped_mm_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_qe, stride_qk, stride_se, stride_sg, stride_ym,
        K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr, G: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr, EVICT: tl.constexpr,
        GATHER: tl.constexpr, SWIGLU: tl.constexpr, ROW_SCALE: tl.constexpr, SCATTER: tl.constexpr,
        PDL: tl.constexpr,
    ):
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        # Axis 0 walks N so that programs running side by side share one M tile of x (it stays in L2).
        pid_n = tl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, tl.program_id(1), E, E_P2, BLOCK_M)
        if e >= E:  # a spare M tile past the last expert's rows
            return
        rows, rmask, x_rows = tile_rows(rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N_OUT
        e64 = e.to(tl.int64)
        # SWIGLU: gate columns c and up columns HALF + c in one program: silu(gate) * up, half the output
        out = int4_tile(x_ptr, qw_ptr, s_ptr, z_ptr, x_rows, rmask, e64, cols, cmask, HALF, stride_qe, stride_qk,
                        stride_se, stride_sg, K, G, BLOCK_M, BLOCK_N, SWAP_AB, EVICT, SWIGLU)
        if ROW_SCALE:  # the routing weight of each (token, expert) row
            rs = tl.load(rowscale_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
            if SWAP_AB:
                out = out * rs[None, :]
            else:
                out = out * rs[:, None]
        if SCATTER:  # sorted row r is written to row row_dest[r] of y: results land in the caller's order
            y_rows = tl.load(rowdest_ptr + rows, mask=rmask, other=0).to(tl.int64)
        else:
            y_rows = rows.to(tl.int64)
        if SWAP_AB:
            y_ptrs = y_ptr + y_rows[None, :] * stride_ym + cols[:, None]
            tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=rmask[None, :] & cmask[:, None])
        else:
            y_ptrs = y_ptr + y_rows[:, None] * stride_ym + cols[None, :]
            tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])

    return int4_grouped_mm_kernel


def int4_grouped_mm(
    x: Tensor,
    qweight: Tensor,
    scales: Tensor,
    zeros: Tensor,
    offsets: Tensor,
    group_size: int,
    config: dict[str, Any] | None = None,
    out: Tensor | None = None,
    *,
    row_index: Tensor | None = None,
    swiglu: bool = False,
    row_scale: Tensor | None = None,
    row_dest: Tensor | None = None,
) -> Tensor:
    """y[r] = x[r] @ W[e(r)].T for rows sorted by expert (offsets: cumulative row counts, int32); W int4 in the
    128-row block layout. Rows past offsets[-1] are not written. `out` ([S, N], x's dtype) receives the result.
    row_index [S]: read x[row_index[r]] (x unsorted). swiglu: silu(x @ Wg.T) * (x @ Wu.T) for W = [Wg; Wu],
    [S, N/2]. row_scale [S]: multiply row r of the result by row_scale[r]. row_dest [S]: write row r of the
    result to row row_dest[r] of y (a permutation of 0..S-1)."""
    k = x.shape[1]
    s_rows = x.shape[0] if row_index is None else row_index.shape[0]
    e, _, n = qweight.shape
    if not fused_supported(k, group_size):
        raise ValueError(f"int4 fused kernel: K={k}, group size {group_size} unsupported (see fused_supported)")
    n_out = n // 2 if swiglu else n
    x = x.contiguous()
    y = torch.empty(s_rows, n_out, dtype=x.dtype, device=x.device) if out is None else out
    if s_rows == 0:
        return y
    cfg = dict(config or pick_config(s_rows, e, n, k, group_size, swiglu, x.device))
    if cfg.pop("KERNEL", "triton") == "gluon":
        if not int4_wgmma.available(x.device, group_size, k):
            raise ValueError(f"int4 kernel: the Gluon wgmma kernel needs an sm_90 GPU and 128-row groups ({x.device}, "
                             f"group size {group_size}); pass a Triton configuration or none")
        int4_grouped_mm.last_compiled = int4_wgmma.launch(
            x, qweight, scales, zeros, y, offsets, cfg, row_index=row_index, swiglu=swiglu,
            row_scale=row_scale, row_dest=row_dest)
        return y
    cfg.setdefault("SWAP_AB", False)
    cfg.setdefault("EVICT", False)
    # enough M tiles for any split of the rows: each expert wastes at most one partial tile
    grid = (triton.cdiv(n_out, cfg["BLOCK_N"]), triton.cdiv(s_rows, cfg["BLOCK_M"]) + e)
    compiled = _kernel()[grid](
        x, qweight, scales, zeros, y, offsets,
        offsets if row_index is None else row_index, offsets if row_scale is None else row_scale,
        offsets if row_dest is None else row_dest, n_out, n // 2,
        x.stride(0), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1), y.stride(0),
        K=k, E=e, E_P2=triton.next_power_of_2(e), G=group_size,
        GATHER=row_index is not None, SWIGLU=swiglu, ROW_SCALE=row_scale is not None, SCATTER=row_dest is not None,
        **cfg, **pdl.launch_args(x.device),
    )
    int4_grouped_mm.last_compiled = compiled  # registers, spills and assembly, for benchmarks/profile_kernels.py
    return y


@functools.cache
def _dequant_kernel() -> Any:
    pdl_open = pdl.triton_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(pdl_open=pdl_open)

    @triton.jit
    def int4_dequant_kernel(qw_ptr, s_ptr, z_ptr, out_ptr, N, WORDS, stride_qe, stride_se, stride_oe,
                            SUB: tl.constexpr, G: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr,
                            PDL: tl.constexpr):
        pdl_open(PDL)
        e = tl.program_id(2).to(tl.int64)
        words = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (words < WORDS)[:, None] & (cols < N)[None, :]
        q = tl.load(qw_ptr + e * stride_qe + words[:, None] * N + cols[None, :], mask=mask, other=0)
        for j in tl.static_range(8):
            rows = (words // SUB) * (8 * SUB) + j * SUB + words % SUB  # the block layout (module doc)
            sz = e * stride_se + (rows // G)[:, None] * N + cols[None, :]
            s = tl.load(s_ptr + sz, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + sz, mask=mask, other=0).to(tl.float32)
            w = (((q >> (4 * j)) & 0xF).to(tl.float32) - z) * s
            tl.store(out_ptr + e * stride_oe + rows[:, None] * N + cols[None, :], w.to(out_ptr.dtype.element_ty),
                     mask=mask)

    return int4_dequant_kernel


def triton_dequantize(qweight: Tensor, scales: Tensor, zeros: Tensor, group_size: int, k_block: int,
                      out: Tensor) -> Tensor:
    """[E, K, N] weights into `out` in one pass over the int4 words (the GPU fallback's unpacking)."""
    e, words, n = qweight.shape
    grid = (triton.cdiv(words, 16), triton.cdiv(n, 128), e)
    _dequant_kernel()[grid](qweight, scales.contiguous(), zeros.contiguous(), out, n, words, qweight.stride(0),
                            scales.stride(0), out.stride(0), SUB=k_block // 8, G=group_size, BLOCK_W=16, BLOCK_N=128,
                            **pdl.launch_args(qweight.device))
    return out
