"""The INT4 grouped GEMM for Hopper (sm_90), written in Gluon: asynchronous MMAs on exact 16-bit codes.

Why a second kernel: `int4_kernels.py`'s Triton kernel unpacks each 16-row slice of int4 words in registers and
hands it to a wgmma as its A operand. Triton 3.6 makes a wgmma asynchronous only when a register operand is defined
outside the loop, so it waits for every one of them (`warp_group_dot_wait {pendings = 0}` after each of the 256
dots of a gate_up program: `benchmarks/compile_sm90.py`). Gluon (Triton's lower-level language, same compiler)
lets the kernel say when to wait: each slice's MMA is issued asynchronously and the kernel waits only for the
slice before, keeping that slice's registers alive until then.

Arithmetic: per 128-row block (one quantization group: available()) the MMAs add up (q − z)·x, with q − z
exact in bf16 / fp16 (|q − z| < 16), into a float32 partial sum; the block's scale multiplies that sum, in
float32, into the accumulator. Unpacking is then three instructions for two weights (a shift, an OR into the
mantissa of 128 or 1024, a packed subtraction of 128 + z or 1024 + z) instead of an FMA and a rounding per
weight. The weights are never rounded to 16 bits, so the result is closer to a float64 reference than
dequantize + matmul's (relative error 1.66e-3 against 2.90e-3, bf16, H200) and not bit-identical to it.

Layout read: the 128-row block layout of `int4.py` (word r of a block holds rows r, 16 + r, …, 112 + r in nibbles
0..7), groups of 128 rows (available()), as stored; nothing is repacked. The weights are the MMA's M side (64 rows
per warpgroup; with SwiGLU a program's 64 rows are 32 gate columns then the same 32 up columns, one accumulator
instead of two) and the tokens its N side (a tile of 16..64 rows). Same inputs, outputs and fused steps as
`int4_kernels.int4_grouped_mm` (token gather, SwiGLU, routing weights, scatter).

Memory: per block (128 rows of K) a program copies the tokens' 128 columns and its 16 × BLOCK_N int4 words into
shared memory by cp.async, AHEAD blocks before it computes them (one commit group per block, AHEAD + 1 stages);
every group's scales and zero points go to shared memory once, at the start. Each thread then reads the words of
the A operand elements it holds (the pair of words of its k pair recombined with one prmt, no shuffle); the
words' rows are XOR-swizzled so that those reads are free of bank conflicts. Before (session 6 of the H200 work)
the words went from global memory straight into registers one block ahead: 255 registers and a spill at the
64 × 128 tile, and one block of latency cover; staged, 234 registers, no spill, and 1.25x faster (docs/
BENCHMARKS.md).

Two options of the tile (gluon_common.tile_map; WGMMA_TILES in int4_kernels says which the engine takes):
- SMALL_M / MID_M: an expert with at most that many rows gets one tile of that many tokens instead of BLOCK_M, in
  the same launch (a branch per program, gluon_common.run_tile; the kernel is compiled for every size, its
  registers the largest's). The random-weight 30B model sends most rows to ~13 experts and 1 to 16 rows to ~20 to
  50 others, whose 64-token tiles were three quarters padding. Same arithmetic per row: bit-identical outputs.
  SPLIT (a launch per size) was slower on the H200.
- SCALED: the weights are (q − z) · s in the MMA's dtype, rounded once (fp16: the scale as stored, so exactly the
  weight dequantize() writes; bf16: the fp16 scale rounded to bf16 first, then the product: at most about one
  bf16 step from dequantize()'s), and the MMAs run on across blocks into one accumulator: no float32 partial sum
  and no wait for every MMA of a block (166 registers instead of 234 at 64 x 128), so with AHEAD 1 three programs
  fit on an SM instead of two. Relative error against a float64 reference of the int4 weights 3.4e-3 (gate_up,
  bf16) against 1.66e-3 exact; the fixture's answers against the exact kernel: 436 of 436 the same, mean TV 0.0001
  (H200, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from quantbench.engine import pdl
from quantbench.engine.moe import gluon_common
from quantbench.engine.triton_common import triton

KERNEL = "gluon-wgmma-int4"
K_BLOCK = 128  # the packed block (int4_kernels.FUSED_K_BLOCK)


def available(device: torch.device, group_size: int, k: int) -> bool:
    """On an sm_90 GPU, with Gluon importable, for groups of 128 rows (one per packed block: the kernel reads one
    scale and zero point per block; the size checked on a GPU) and K a whole number of them."""
    if device.type != "cuda" or group_size != K_BLOCK or k % K_BLOCK:
        return False
    return gluon_common.sm90(torch.cuda.get_device_capability(device))


# word_halves: $2, $3 = words r, r+1 of a k pair -> $0 = their low 16 bits (word r's low), $1 = their high 16 bits
WORD_HALVES_ASM = "prmt.b32 $0, $2, $3, 0x5410; prmt.b32 $1, $2, $3, 0x7632;"


def scaled_asm(j: int, fp16: bool) -> str:
    """pair_asm's slice j times the group's scale ($4: the pair's scale, twice), rounded once: (q − z) · s.
    (Self-contained: a constexpr function may not call another plain function.)"""
    src, shift = ("$1", "$2")[j // 4], 4 * (j % 4)
    magic, op = ("0x64006400", "f16x2") if fp16 else ("0x43004300", "bf16x2")
    move = f"shr.b32 t, {src}, {shift}; " if shift else f"mov.b32 t, {src}; "
    return ("{ .reg .b32 t; " + move + f"lop3.b32 t, t, 0x000F000F, {magic}, 0xEA; sub.rn.{op} t, t, $3; "
            f"mul.rn.{op} $0, t, $4; }}")


def pair_asm(j: int, fp16: bool) -> str:
    """PTX for slice j of a k pair: nibble j of words r and r+1 (from word_halves' a for j < 4, b after) into the
    two 16-bit halves, OR-ed with the exponent of 128 (bf16) / 1024 (fp16), minus (128 + z) / (1024 + z)."""
    src, shift = ("$1", "$2")[j // 4], 4 * (j % 4)
    magic, sub = ("0x64006400", "sub.rn.f16x2") if fp16 else ("0x43004300", "sub.rn.bf16x2")
    move = f"shr.b32 t, {src}, {shift}; " if shift else f"mov.b32 t, {src}; "
    return "{ .reg .b32 t; " + move + f"lop3.b32 t, t, 0x000F000F, {magic}, 0xEA; {sub} $0, t, $3; }}"


@functools.cache
def _kernel() -> Any:
    # lazy: Gluon exists only in recent Triton builds and the kernel runs only on sm_90 (gluon_common.sm90)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.runtime.jit import constexpr_function

    pair_asm_c = constexpr_function(pair_asm)  # called at compile time, with constexpr arguments
    scaled_asm_c = constexpr_function(scaled_asm)
    word_halves_asm = gl.constexpr(WORD_HALVES_ASM)
    # Gluon resolves names (annotations, callees, builtins) through the module's globals, not this closure.
    pdl_open = pdl.gluon_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(gl=gl, cp=cp, fence_async_shared=fence_async_shared, warpgroup_mma=warpgroup_mma,
                     warpgroup_mma_wait=warpgroup_mma_wait, pair_asm_c=pair_asm_c,
                     word_halves_asm=word_halves_asm, pdl_open=pdl_open)

    shared = gluon_common.helpers()
    tile_place, run_tile, weight_columns = shared["tile_place"], shared["run_tile"], shared["weight_columns"]
    token_pointers, copy_block, store_outputs = shared["token_pointers"], shared["copy_block"], shared["store_outputs"]
    globals().update(tile_place=tile_place, run_tile=run_tile, weight_columns=weight_columns,
                     token_pointers=token_pointers, scaled_asm_c=scaled_asm_c,
                     copy_block=copy_block, store_outputs=store_outputs)

    @gluon.jit
    def word_halves(q):
        """Words (r, r+1) of each thread's k pair -> (a, b) in their places: a holds the low 16 bits of both
        (nibbles 0-3: slices 0-3), b the high 16 bits (slices 4-7), word r's in the low half (prmt)."""
        return gl.inline_asm_elementwise(word_halves_asm, "=r,=r,r,r", [q], dtype=gl.int32, is_pure=True, pack=2)

    @gluon.jit
    def slice_codes(ab, zz, j: gl.constexpr, dtype: gl.constexpr):
        """Slice j's k pair as two 16-bit floats q − z, exact (|q − z| < 16): the nibbles OR-ed into the
        mantissa of 128 (bf16) or 1024 (fp16), then (128 + z) or (1024 + z) subtracted, two at a time."""
        if dtype == gl.float16:
            return gl.inline_asm_elementwise(pair_asm_c(j, True), "=r,r,r,r", [ab, zz], dtype=gl.float16,
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(pair_asm_c(j, False), "=r,r,r,r", [ab, zz], dtype=gl.bfloat16,
                                             is_pure=True, pack=2)

    globals().update(word_halves=word_halves, slice_codes=slice_codes)

    @gluon.jit
    def slice_scaled(ab, zz, ss, j: gl.constexpr, dtype: gl.constexpr):
        """SCALED: slice_codes times the group's scale in the MMA's dtype, (q − z) · s rounded once (fp16: the
        scale as stored, so the weight dequantize() writes; bf16: the scale rounded to bf16 first)."""
        if dtype == gl.float16:
            return gl.inline_asm_elementwise(scaled_asm_c(j, True), "=r,r,r,r,r", [ab, zz, ss], dtype=gl.float16,
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(scaled_asm_c(j, False), "=r,r,r,r,r", [ab, zz, ss],
                                             dtype=gl.bfloat16, is_pure=True, pack=2)

    globals().update(slice_scaled=slice_scaled)

    @gluon.jit
    def int4_tile(
        e, row_start, row_end, BLOCK_M: gl.constexpr,
        x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr, N_OUT, HALF,
        stride_xm, stride_qe, stride_qk, stride_se, stride_sg, stride_ym, pid_n,
        K: gl.constexpr, BLOCK_N: gl.constexpr, AHEAD: gl.constexpr,
        GATHER: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr, SCATTER: gl.constexpr,
        SCALED: gl.constexpr, num_warps: gl.constexpr,
    ):
        """One program's tile: BLOCK_N weight rows of expert e times its rows row_start .. (at most BLOCK_M; the
        tile's place and size first, as gluon_common.run_tile calls it)."""
        KB: gl.constexpr = 128  # rows per packed block, and per quantization group (available())
        SUB: gl.constexpr = 16
        # AHEAD blocks in flight while one is computed; a stage is rewritten one block after its MMAs retired
        # (SCALED 1: two, as the MMAs run on across blocks and block i-1's last may still read its stage;
        # SCALED 2: one, after waiting for that MMA at the block's start)
        STAGES: gl.constexpr = AHEAD + 2 if SCALED == 1 else AHEAD + 1
        GROUPS: gl.constexpr = K // KB
        GROUPS_P2: gl.constexpr = 1 << (GROUPS - 1).bit_length()
        # SWIGLU: the MMA's BLOCK_N rows are OUT_N gate columns then the same OUT_N up columns (one accumulator:
        # half the registers of two, so more programs fit on an SM)
        OUT_N: gl.constexpr = BLOCK_N // 2 if SWIGLU else BLOCK_N
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        ZERO_BIAS: gl.constexpr = 1024.0 if dtype == gl.float16 else 128.0  # the magic of slice_codes
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # 16 B per thread
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # the words: 16 B per thread from global; in shared memory each 4-word chunk of a row XOR-ed by the row,
        # so that the A operand's reads (8 columns x 4 k rows per warp) hit 32 different banks
        W_TN: gl.constexpr = 32 if BLOCK_N >= 128 else BLOCK_N // 4
        w_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // W_TN, W_TN], [num_warps, 1], [1, 0])
        w_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        g_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, num_warps], [1, 0])
        g_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        g_row: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        e64 = e.to(gl.int64)

        # the tokens: row pointers (gathered when GATHER) for cp.async, zero-filled past the tile's rows
        x_ptrs, rmask_x = token_pointers(x_ptr, rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER, x_layout)
        # three allocations: the barrier pass cannot tell stages of one apart, and would put a barrier between
        # copies into the same one
        x_lo = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)  # columns 0..63 of a block
        x_hi = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)  # 64..127

        # the weights: a block's 16 rows of words of the program's BLOCK_N columns
        wc, w_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(0, w_layout))
        w_rows = gl.arange(0, SUB, layout=gl.SliceLayout(1, w_layout))
        w_ptrs = qw_ptr + e64 * stride_qe + w_rows[:, None] * stride_qk + (wc + w_up)[None, :]
        wmask = (wc < N_OUT)[None, :]
        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, SUB, BLOCK_N], w_shared)

        # every group's scales and zero points, once, into shared memory (read per block in the MMA's row layout;
        # stored as one 2-D tensor, read through a 1-D view of the same plain row-major bytes)
        gc, g_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(0, g_layout))
        g = gl.arange(0, GROUPS_P2, layout=gl.SliceLayout(1, g_layout))
        g_off = e64 * stride_se + g[:, None] * stride_sg + (gc + g_up)[None, :]
        g_mask = (g < GROUPS)[:, None] & (gc < N_OUT)[None, :]
        z_all = (gl.load(z_ptr + g_off, mask=g_mask, other=0).to(gl.float32) + ZERO_BIAS).to(dtype)
        z_smem = gl.allocate_shared_memory(dtype, [GROUPS_P2, BLOCK_N], g_shared, z_all)._reinterpret(
            dtype, [GROUPS_P2, BLOCK_N], g_row)
        if SCALED > 0:  # the scales in the MMA's dtype, multiplied into the weights
            s_all = gl.load(s_ptr + g_off, mask=g_mask, other=0.0).to(dtype)
            s_smem = gl.allocate_shared_memory(dtype, [GROUPS_P2, BLOCK_N], g_shared, s_all)._reinterpret(
                dtype, [GROUPS_P2, BLOCK_N], g_row)
        else:  # in float32, multiplied into each block's partial sum
            s_all = gl.load(s_ptr + g_off, mask=g_mask, other=0.0).to(gl.float32)
            s_smem = gl.allocate_shared_memory(gl.float32, [GROUPS_P2, BLOCK_N], g_shared, s_all)._reinterpret(
                gl.float32, [GROUPS_P2, BLOCK_N], g_row)

        # per K block (one group): the MMAs add up (q − z)·x, exact 16-bit weights, into `part`; then
        # acc += s · part, the group's scale in float32 (SCALED: the MMAs add (q − z)·s·x into acc directly)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        part = acc
        for d in gl.static_range(AHEAD):
            copy_block(x_lo, x_hi, w_smem, d, x_ptrs, rmask_x, w_ptrs, stride_qk, wmask, d * KB, K)
        w_prev = gl.zeros([BLOCK_N, SUB], dtype, layout=a_layout)  # the A operand of the MMA in flight

        for i in range(GROUPS):
            stage = i % STAGES
            # block i has landed; fenced for the tensor cores. No explicit barrier: the compiler's barrier pass,
            # which cannot tell stages apart, puts one after this wait (the copies below rewrite memory that
            # block i-1's loads and MMAs read: every warp is past its wait that retired them) and one before the
            # words' loads (they read what other threads' copies wrote); one more here would be a third.
            cp.wait_group(AHEAD - 1)
            fence_async_shared()
            if SCALED == 2:  # block i-1's last MMA, before its stage is rewritten
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            copy_block(x_lo, x_hi, w_smem, (i + AHEAD) % STAGES, x_ptrs, rmask_x, w_ptrs, stride_qk, wmask,
                       (i + AHEAD) * KB, K)
            ab = word_halves(w_smem.index(stage).permute((1, 0)).load(a_layout))
            zz = z_smem.index(i).load(gl.SliceLayout(1, a_layout))
            if SCALED > 0:
                ss = s_smem.index(i).load(gl.SliceLayout(1, a_layout))
                for j in gl.static_range(8):
                    x_half = x_lo if j < 4 else x_hi
                    xs = x_half.index(stage).slice((j % 4) * SUB, SUB, dim=1).permute((1, 0))
                    w = slice_scaled(ab, zz[:, None], ss[:, None], j, dtype)
                    acc = warpgroup_mma(w, xs, acc, is_async=True)
                    acc, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_prev))
                    w_prev = w
            else:
                for j in gl.static_range(8):
                    x_half = x_lo if j < 4 else x_hi
                    xs = x_half.index(stage).slice((j % 4) * SUB, SUB, dim=1).permute((1, 0))
                    w = slice_codes(ab, zz[:, None], j, dtype)
                    part = warpgroup_mma(w, xs, part, use_acc=j > 0, is_async=True)
                    # wait for the slice before only: its MMA is retired, its registers free; this one runs on
                    part, _ = warpgroup_mma_wait(num_outstanding=1, deps=(part, w_prev))
                    w_prev = w
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
                acc = acc + part * s_smem.index(i).load(gl.SliceLayout(1, mma))[:, None]
        if SCALED > 0:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)

        store_outputs(acc, y_ptr, rowscale_ptr, rowdest_ptr, row_start, row_end, pid_n, N_OUT, stride_ym, BLOCK_M,
                      BLOCK_N, SWIGLU, ROW_SCALE, SCATTER, False, num_warps)

    globals().update(int4_tile=int4_tile)

    @gluon.jit
    def int4_wgmma_kernel(
        x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_qe, stride_qk, stride_se, stride_sg, stride_ym,
        K: gl.constexpr, E: gl.constexpr, E_P2: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, AHEAD: gl.constexpr,
        SMALL_M: gl.constexpr, MID_M: gl.constexpr, ONLY: gl.constexpr, SCALED: gl.constexpr,
        GATHER: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr, SCATTER: gl.constexpr,
        PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        pid_n = gl.program_id(0)
        place = tile_place(offs_ptr, E, E_P2, BLOCK_M, SMALL_M, MID_M, ONLY, num_warps)
        if place[0] >= E:  # a spare M tile past the last expert's rows
            return
        run_tile(int4_tile, place, (x_ptr, qw_ptr, s_ptr, z_ptr, y_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr, N_OUT,
                                    HALF, stride_xm, stride_qe, stride_qk, stride_se, stride_sg, stride_ym, pid_n, K,
                                    BLOCK_N, AHEAD, GATHER, SWIGLU, ROW_SCALE, SCATTER, SCALED, num_warps),
                 BLOCK_M, SMALL_M, MID_M, ONLY)

    return int4_wgmma_kernel


def launch(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, y: Tensor, offsets: Tensor,
           config: dict[str, Any], *, row_index: Tensor | None, swiglu: bool, row_scale: Tensor | None,
           row_dest: Tensor | None) -> Any:
    """Run the kernel over y's rows (int4_kernels.int4_grouped_mm checks the arguments, available() included, and calls
    this). config: BLOCK_M tokens x BLOCK_N weight rows, AHEAD; optional SMALL_M / MID_M (a tile size per expert:
    gluon_common.tile_map), SPLIT (a launch per kind of tile), SCALED (the scale multiplied into the weights),
    maxnreg (ptxas's register cap: more programs an SM where registers are what limits them)."""
    e, _, n = qweight.shape
    s_rows = y.shape[0]
    n_out = n // 2 if swiglu else n
    block_n = config["BLOCK_N"]
    compiled = None
    for kind in gluon_common.kinds(config):
        grid = (triton.cdiv(n_out, block_n // 2 if swiglu else block_n), gluon_common.m_tiles(s_rows, e, config, kind))
        compiled = _kernel()[grid](
            x, qweight, scales, zeros, y, offsets,
            offsets if row_index is None else row_index, offsets if row_scale is None else row_scale,
            offsets if row_dest is None else row_dest, n_out, n // 2,
            x.stride(0), qweight.stride(0), qweight.stride(1), scales.stride(0), scales.stride(1), y.stride(0),
            K=x.shape[1], E=e, E_P2=triton.next_power_of_2(e), BLOCK_M=config["BLOCK_M"], BLOCK_N=block_n,
            AHEAD=config["AHEAD"], SMALL_M=config.get("SMALL_M", 0), MID_M=config.get("MID_M", 0), ONLY=kind,
            SCALED=int(config.get("SCALED", 0)),
            GATHER=row_index is not None, SWIGLU=swiglu, ROW_SCALE=row_scale is not None,
            SCATTER=row_dest is not None,
            num_warps=config.get("num_warps", 4),  # one warpgroup: a 128-row tile is two MMAs per slice
            **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {}),  # registers a thread, at most
            **pdl.launch_args(x.device),
        )
    return compiled
