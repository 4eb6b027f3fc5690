"""The NVFP4 grouped GEMM for Hopper (sm_90), written in Gluon, as int4_wgmma.py is for INT4.

Why: `nvfp4.py`'s Triton kernel decodes a [BLOCK_N, BLOCK_K] weight tile with whole-tile ops (the two nibbles
joined and reshaped back into K order, the block scales broadcast over 16 columns) and waits for each wgmma
(Triton 3.6 makes a dot asynchronous only when its register operand comes from outside the loop): at the
Qwen3-30B-A3B shape its gate_up took 300.6 µs and its down 158.8 µs per layer on an H200, twice INT4's Gluon
kernel for the same bytes. Here each thread decodes only the A operand elements it holds, the MMAs run
asynchronously (the kernel waits for the slice before only), and the tokens and packed weights are staged through
shared memory by cp.async, AHEAD blocks of 128 columns ahead (int4_wgmma's pipeline).

Weights as stored by ModelOpt (nvfp4.py's docstring): packed [E, N, K/2] bytes, element 2j in the low nibble of
byte j; E4M3 block scales [E, N, K/16]; a float32 global scale per row. Nothing is repacked in memory. A row's
128-column block is 16 words (word w: columns 8w .. 8w+7). What a thread holds of a 16-column slice s of the MMA
(its 16-column scale group) is columns 2c, 2c+1 of each half (c = lane % 4): byte c of words 2s and 2s + 1.
The words are staged in shared memory even words first (position p holds word 2p, then 2(p - 8) + 1: 4-byte
copies), four lanes load a row's words in the A operand layout (lane c: positions 2c, 2c+1, 2c+8, 2c+9, i.e.
words 4c, 4c+2, 4c+1, 4c+3), and exchange bytes (a 4x4 byte transpose over the quad: two shuffles and two prmt
per word, QUAD_TRANSPOSE_ASM); each lane then has byte c of words 4g, 4g+2 (first half of slices 2g, 2g+1) and
4g+1, 4g+3 (second half) for g = 0..3, in the registers whose k positions they feed.

Arithmetic: a code's bits go straight into a bfloat16 (sign to bit 15, the 3-bit magnitude to bits 8..6: the
value · 2^-126, E2M1's subnormal 0.5 landing on bfloat16's subnormal range) and one packed multiply by the block
scale · 2^118 (a table made once per program, exact: E4M3 has 4 significant bits) gives value · scale · 2^-8,
exact in bfloat16 (at most 6 significant bits). The float32 accumulator is multiplied by the row's global scale
· 2^8 after the K loop. So the weights are never rounded (dequantize() rounds value · scale · global scale to
16 bits): not bit-identical to dequantize + matmul, closer to a float64 reference. fp16: bits 11..9 (value ·
2^-14), scale · 2^7, · 2^7 after. The epilogue rounds to bfloat16 where the unfused path rounds (fused_epilogue
in nvfp4.py: a W4A4 model's next activation rounding amplifies a last-bit difference).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

KERNEL = "gluon-wgmma-nvfp4"
K_BLOCK = 128

# lane c of a quad holds a word whose byte i is for lane i; after this, byte i of its word is lane i's byte c.
# $1: the word, $2 / $3: prmt selectors for the exchanges with lane c ^ 1 and c ^ 2 (quad_selectors)
QUAD_TRANSPOSE_ASM = ("{ .reg .b32 y, z; shfl.sync.bfly.b32 y, $1, 1, 0x1f, -1; prmt.b32 z, $1, y, $2; "
                      "shfl.sync.bfly.b32 y, z, 2, 0x1f, -1; prmt.b32 $0, z, y, $3; }")


def quad_selectors(c: int) -> tuple[int, int]:
    """QUAD_TRANSPOSE_ASM's selectors for lane c of the quad. First exchange (with c ^ 1): keep the bytes for the
    lanes whose low bit is c's, own then partner's, per destination; second (with c ^ 2): the two bytes for c from
    each, in lane order."""
    return (0x3715 if c & 1 else 0x6240), (0x3276 if c & 2 else 0x5410)


def decode_asm(s: int, fp16: bool) -> str:
    """PTX for slice s of a k pair: byte s // 2 of the transposed word $1 (even s) or $2 (odd s) holds the pair's
    two codes (low nibble first: words 4g, 4g+1 hold slice 2g, words 4g+2, 4g+3 slice 2g+1); each code's sign and
    magnitude bits go into a 16-bit float, then one packed multiply by $3 (the block scale, pre-scaled)."""
    src, byte = ("$1", "$2")[s % 2], s // 2
    sign_shift, mag_shift, mag_mask = (12, 9, "0x0E000E00") if fp16 else (12, 6, "0x01C001C0")
    mul = "mul.rn.f16x2" if fp16 else "mul.rn.bf16x2"
    return ("{ .reg .b32 t, a, b; "
            # t · 4097 = t | t << 12 (the high nibble at 16..19), shifted: one multiply each
            f"bfe.u32 t, {src}, {8 * byte}, 8; mul.lo.u32 a, t, {4097 << sign_shift}; "
            f"mul.lo.u32 b, t, {4097 << mag_shift}; and.b32 b, b, {mag_mask}; "
            f"lop3.b32 a, a, 0x80008000, b, 0xEA; {mul} $0, a, $3; }}")


# the 16-bit decoded value is the E2M1 value times 2^-126 (bf16) / 2^-14 (fp16); the scale table holds
# scale · 2^SCALE_EXP, and the accumulator is multiplied by 2^OUT_EXP · global scale
SCALE_EXP = {"bf16": 118, "fp16": 7}
OUT_EXP = {"bf16": 8, "fp16": 7}


def scale_multiplier(fp16: bool) -> float:
    """2^SCALE_EXP: what the kernel's block-scale table is multiplied by."""
    return 2.0 ** SCALE_EXP["fp16" if fp16 else "bf16"]


def out_multiplier(fp16: bool) -> float:
    """2^OUT_EXP: what the accumulator is multiplied by (times the global scale) after the K loop."""
    return 2.0 ** OUT_EXP["fp16" if fp16 else "bf16"]


def available(device: torch.device, k: int) -> bool:
    """On an sm_90 GPU with Gluon importable, K a whole number of 128-column blocks."""
    if device.type != "cuda" or k % K_BLOCK:
        return False
    from quantbench.moe import gluon_common

    return gluon_common.sm90(torch.cuda.get_device_capability(device))


@functools.cache
def _kernel() -> Any:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.runtime.jit import constexpr_function

    from quantbench.moe import gluon_common

    decode_asm_c = constexpr_function(decode_asm)  # called at compile time, with constexpr arguments
    scale_mul_c, out_mul_c = constexpr_function(scale_multiplier), constexpr_function(out_multiplier)
    quad_transpose_asm = gl.constexpr(QUAD_TRANSPOSE_ASM)
    shared = gluon_common.helpers()
    expert_tile, weight_columns = shared["expert_tile"], shared["weight_columns"]
    token_pointers, copy_block, store_outputs = shared["token_pointers"], shared["copy_block"], shared["store_outputs"]
    # Gluon resolves names (annotations, callees, builtins) through the module's globals, not this closure
    globals().update(gl=gl, cp=cp, fence_async_shared=fence_async_shared, warpgroup_mma=warpgroup_mma,
                     warpgroup_mma_wait=warpgroup_mma_wait, decode_asm_c=decode_asm_c,
                     quad_transpose_asm=quad_transpose_asm, expert_tile=expert_tile, weight_columns=weight_columns,
                     token_pointers=token_pointers, copy_block=copy_block, store_outputs=store_outputs,
                     scale_mul_c=scale_mul_c, out_mul_c=out_mul_c)

    @gluon.jit
    def slice_weights(t, s_i, j: gl.constexpr, dtype: gl.constexpr):
        """Slice j's k pair as two 16-bit weights, value · scale · 2^-8 (bf16) or · 2^-7 (fp16), exact."""
        if dtype == gl.float16:
            return gl.inline_asm_elementwise(decode_asm_c(j, True), "=r,r,r,r", [t, s_i], dtype=gl.float16,
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(decode_asm_c(j, False), "=r,r,r,r", [t, s_i], dtype=gl.bfloat16,
                                             is_pure=True, pack=2)

    globals().update(slice_weights=slice_weights)

    @gluon.jit
    def nvfp4_wgmma_kernel(
        x_ptr, pw_ptr, bs_ptr, gs_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge, stride_ym,
        K: gl.constexpr, E: gl.constexpr, E_P2: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, AHEAD: gl.constexpr,
        GATHER: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr, SCATTER: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        SUB: gl.constexpr = 16
        STAGES: gl.constexpr = AHEAD + 2  # block i rewrites block i-2's stage (block i-1's last MMA may still run)
        K16: gl.constexpr = K // 16  # block scales per row
        K16_P2: gl.constexpr = 1 << (K16 - 1).bit_length()  # the table's rows (a layout's shape is a power of 2)
        OUT_N: gl.constexpr = BLOCK_N // 2 if SWIGLU else BLOCK_N  # SWIGLU: gate rows then the same up rows
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        FP16: gl.constexpr = dtype == gl.float16
        SCALE_MUL: gl.constexpr = scale_mul_c(FP16)  # 2^SCALE_EXP: 2^118 (bf16), 2^7 (fp16)
        OUT_MUL: gl.constexpr = out_mul_c(FP16)  # 2^OUT_EXP: 2^8, 2^7
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # 16 B per thread
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # a row's 16 words, 4 B copies (reordered); 4-word chunks XOR-ed by the row (2-way bank conflicts at most
        # for the A operand reads, 4-way without)
        w_layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
        w_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=4, order=[1, 0])
        bs_layout: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [num_warps, 1], [1, 0])
        t_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        t_row: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

        pid_n = gl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, gl.program_id(1), E, E_P2, BLOCK_M, num_warps)
        if e >= E:  # a spare M tile past the last expert's rows
            return
        e64 = e.to(gl.int64)

        # the tokens: row pointers (gathered when GATHER) for cp.async, zero-filled past the tile's rows
        x_ptrs, rmask_x = token_pointers(x_ptr, rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER, x_layout)
        # three allocations: the barrier pass cannot tell stages of one apart (int4_wgmma)
        x_lo = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)
        x_hi = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)

        # the packed words: a block's 16 per row of the program's BLOCK_N rows, position p <- word 2 (p % 8) + p // 8
        wc, w_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(1, w_layout))
        w_row = (wc + w_up).to(gl.int64)
        pos = gl.arange(0, SUB, layout=gl.SliceLayout(0, w_layout))
        w_ptrs = pw_ptr + e64 * stride_pe + w_row[:, None] * stride_pn + (2 * (pos % 8) + pos // 8)[None, :]
        wmask = (wc < N_OUT)[:, None]
        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, SUB], w_shared)

        # every block scale of the program's rows, once: scale · 2^SCALE_EXP in the MMA's dtype, a row per
        # 16 columns of K (read per slice in the A operand's row layout through a 1-D view)
        sc, s_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(1, bs_layout))
        s_row = (sc + s_up).to(gl.int64)
        s_mask = (sc < N_OUT)[:, None]
        table = gl.allocate_shared_memory(dtype, [K16_P2, BLOCK_N], t_shared)
        for q in gl.static_range(K16 // 16):
            cols = q * 16 + gl.arange(0, 16, layout=gl.SliceLayout(0, bs_layout))
            bs = gl.load(bs_ptr + e64 * stride_be + s_row[:, None] * stride_bn + cols[None, :], mask=s_mask,
                         other=0.0)
            table.slice(q * 16, 16, dim=0).permute((1, 0)).store((bs.to(gl.float32) * SCALE_MUL).to(dtype))
        rows_of = table._reinterpret(dtype, [K16_P2, BLOCK_N], t_row)

        # the quad's byte exchange: lane c = (k % 8) // 2 of the A operand's columns
        c = (gl.arange(0, SUB, layout=gl.SliceLayout(0, a_layout)) % 8) // 2
        sel1 = gl.where((c & 1) == 1, 0x3715, 0x6240)[None, :]
        sel2 = gl.where((c & 2) == 2, 0x3276, 0x5410)[None, :]

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        for dd in gl.static_range(AHEAD):
            copy_block(x_lo, x_hi, w_smem, dd, x_ptrs, rmask_x, w_ptrs, 1, wmask, dd * 128, K)
        w_prev = gl.zeros([BLOCK_N, SUB], dtype, layout=a_layout)  # the A operand of the MMA in flight

        for i in range(K // 128):
            stage = i % STAGES
            # block i has landed; fenced for the tensor cores. The compiler's barrier pass puts a barrier after
            # this wait and one before the words' loads (int4_wgmma)
            cp.wait_group(AHEAD - 1)
            fence_async_shared()
            copy_block(x_lo, x_hi, w_smem, (i + AHEAD) % STAGES, x_ptrs, rmask_x, w_ptrs, 1, wmask, (i + AHEAD) * 128,
                       K)
            words = w_smem.index(stage).load(a_layout)
            t = gl.inline_asm_elementwise(quad_transpose_asm, "=r,r,r,r", [words, sel1, sel2], dtype=gl.int32,
                                          is_pure=True, pack=1)
            for j in gl.static_range(8):
                s_i = rows_of.index(i * 8 + j).load(gl.SliceLayout(1, a_layout))[:, None]
                w = slice_weights(t, s_i, j, dtype)
                x_half = x_lo if j < 4 else x_hi
                xs = x_half.index(stage).slice((j % 4) * SUB, SUB, dim=1).permute((1, 0))
                acc = warpgroup_mma(w, xs, acc, is_async=True)
                # wait for the slice before only: its MMA is retired, its registers free; this one runs on
                acc, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, w_prev))
                w_prev = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        cp.wait_group(0)

        # the row's global scale, and 2^OUT_EXP back
        gc, g_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(1, mma))
        gs = gl.load(gs_ptr + e64 * stride_ge + gc + g_up, mask=gc < N_OUT, other=0.0)
        acc = acc * (gs * OUT_MUL)[:, None]

        # round where the unfused path rounds (bf16 models)
        store_outputs(acc, y_ptr, rowscale_ptr, rowdest_ptr, row_start, row_end, pid_n, N_OUT, stride_ym, BLOCK_M,
                      BLOCK_N, SWIGLU, ROW_SCALE, SCATTER, dtype == gl.bfloat16, num_warps)

    return nvfp4_wgmma_kernel


def launch(x: Tensor, packed: Tensor, block_scale: Tensor, global_scale: Tensor, y: Tensor, offsets: Tensor,
           config: dict[str, Any], *, row_index: Tensor | None, swiglu: bool, row_scale: Tensor | None,
           row_dest: Tensor | None) -> Any:
    """Run the kernel over y's rows (nvfp4.nvfp4_grouped_mm checks the arguments and calls this)."""
    import triton

    e, n, _ = packed.shape
    words = packed.view(torch.int32)  # [E, N, K/8]: 8 codes per word
    n_out = n // 2 if swiglu else n
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    grid = (triton.cdiv(n_out, block_n // 2 if swiglu else block_n), triton.cdiv(y.shape[0], block_m) + e)
    return _kernel()[grid](
        x, words, block_scale, global_scale, y, offsets,
        offsets if row_index is None else row_index, offsets if row_scale is None else row_scale,
        offsets if row_dest is None else row_dest, n_out, n // 2,
        x.stride(0), words.stride(0), words.stride(1), block_scale.stride(0), block_scale.stride(1),
        global_scale.stride(0), y.stride(0),
        K=x.shape[1], E=e, E_P2=triton.next_power_of_2(e), BLOCK_M=block_m, BLOCK_N=block_n, AHEAD=config["AHEAD"],
        GATHER=row_index is not None, SWIGLU=swiglu, ROW_SCALE=row_scale is not None, SCATTER=row_dest is not None,
        num_warps=config.get("num_warps", 4),
    )
