"""The NVFP4 grouped GEMM for Hopper (sm_90), written in Gluon, as int4_wgmma.py is for INT4.

Why: `nvfp4.py`'s Triton kernel decodes a [BLOCK_N, BLOCK_K] weight tile with whole-tile ops (the two nibbles
joined and reshaped back into K order, the block scales broadcast over 16 columns) and waits for each wgmma
(Triton 3.6 makes a dot asynchronous only when its register operand comes from outside the loop): at the
Qwen3-30B-A3B shape its gate_up took 300.6 µs and its down 158.8 µs per layer on an H200, twice INT4's Gluon
kernel for the same bytes. Here each thread decodes only the A operand elements it holds, the MMAs run
asynchronously (the kernel waits for the slice before only), and the tokens and packed weights are staged through
shared memory by cp.async, AHEAD blocks of 128 columns ahead (int4_wgmma's pipeline).

Weights: ModelOpt stores packed [E, N, K/2] bytes (element 2j in the low nibble of byte j), E4M3 block scales
[E, N, K/16] and a float32 global scale per row (nvfp4.py's docstring). The codes are repacked once, at the first
call on the GPU (`repack`, undone by `unpack`; same bytes in memory), so that each thread's A operand words are
the words it loads and each k pair decodes in about two instructions: the kernel stages a row's 128-column block
as 16 contiguous words (16-byte copies), lane c of a quad loads positions 2c, 2c+1, 2c+8, 2c+9 (the A operand
layout), and the word at position 2c + pos holds, for the four slices 4·(pos % 2) .. +3, the codes of k pair
(16j + 8·(pos // 8) + 2c, +1). In that word slice j's two codes sit where a bfloat16 pair wants them (sign at
bits 15 / 31, the 3-bit magnitude at 8..6 / 24..22: MASK_P) rotated left by 0, 3 or 6 bits (j % 4 = 0, 1, 2),
so a rotation and an AND give them; the fourth pair fills the bits left over (LEFT) in an order from which one
multiply by MUL_D moves every bit into place (the products' bits never meet there). Found by exhaustive search:
four rotations of MASK_P cannot tile a word, three can. The ModelOpt layout (read as stored until 2026-11-30
14:00) needed a 4x4 byte transpose per word over the quad's lanes (two shuffles, two prmt) and six
instructions per k pair (docs/BENCHMARKS.md).

Arithmetic: a code's bits land in a bfloat16 as the value · 2^-126 (E2M1's subnormal 0.5 on bfloat16's subnormal
range); one packed multiply by the block scale · 2^118 (a table made once per program, exact: E4M3 has 4
significant bits) gives value · scale · 2^-8, exact in bfloat16 (at most 6 significant bits). The float32
accumulator is multiplied by the row's global scale · 2^8 after the K loop. So the weights are never rounded
(dequantize() rounds value · scale · global scale to 16 bits): not bit-identical to dequantize + matmul, closer to
a float64 reference. fp16 (two instructions more per pair): the magnitude moved to bits 11..9 (value · 2^-14),
scale · 2^7, · 2^7 after. The epilogue rounds to bfloat16 where the unfused path rounds (fused_epilogue in
nvfp4.py: a W4A4 model's next activation rounding amplifies a last-bit difference).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from quantbench.engine import pdl
from quantbench.engine.moe import gluon_common
from quantbench.engine.moe.nvfp4_numbers import pack_codes, unpack_codes
from quantbench.engine.triton_common import triton

KERNEL = "gluon-wgmma-nvfp4"
K_BLOCK = 128
RING_OVER_BYTES = 16384  # the option RING applies where a program's whole scale table would be larger than this

# Where slice j's two codes sit in their word (see the docstring). A code is sign << 3 | e1 << 2 | e0 << 1 | m;
# bfloat16 wants m, e0, e1, sign at bits 6, 7, 8, 15 (first code of the k pair) and 22, 23, 24, 31 (second).
MASK_P = 0x81C081C0
PAIR_BITS = (6, 7, 8, 15, 22, 23, 24, 31)  # m, e0, e1, sign of the first code, then the second's
ROTATIONS = (0, 3, 6)  # slices j % 4 = 0, 1, 2: PAIR_BITS rotated left by this
LEFT = 0x001B001B  # bits 0, 1, 3, 4, 16, 17, 19, 20: what the three rotations leave
D_BITS = (3, 4, 0, 1, 19, 20, 16, 17)  # slice j % 4 = 3: where each of PAIR_BITS' bits is stored
MUL_D = 0x4108  # (x & LEFT) · MUL_D moves D_BITS onto PAIR_BITS (shifts 3, 8, 14; search-verified)
# fp16: where the pair keeps a itself (the signs at 15 / 31, and bits 2 / 18, where a << 3 puts the signs)
MASK_SIGN_FP16 = 0x80048004


def code_bits(kind: int) -> tuple[int, ...]:
    """The word bits holding m, e0, e1, sign of the k pair's first code, then the second's, for j % 4 = kind."""
    if kind == 3:
        return D_BITS
    return tuple((b + ROTATIONS[kind]) % 32 for b in PAIR_BITS)


def _word_columns() -> list[list[tuple[int, int]]]:
    """For each of a block's 16 word positions: per bit (8 codes x 4 bits, in code_bits order per slice), the
    column of the 128 whose code it holds and the bit of that code."""
    out = []
    for p in range(16):
        c, pos = (p % 8) // 2, p - 2 * ((p % 8) // 2)
        bits = []
        for kind in range(4):
            j = 4 * (pos % 2) + kind
            k0 = 16 * j + 8 * (pos // 8) + 2 * c
            for i, _ in enumerate(code_bits(kind)):
                bits.append((k0 + i // 4, i % 4))
        out.append(bits)
    return out


@functools.cache
def _layout() -> tuple[Tensor, Tensor, Tensor]:
    """(column, code bit, word bit) index tensors [16, 32] of the repacked layout."""
    cols = _word_columns()
    column = torch.tensor([[k for k, _ in w] for w in cols])
    code_bit = torch.tensor([[b for _, b in w] for w in cols], dtype=torch.int32)
    word_bit = torch.tensor([[wb for kind in range(4) for wb in code_bits(kind)]] * 16, dtype=torch.int32)
    return column, code_bit, word_bit


_REPACK_CHUNK = 1 << 20  # packed bytes per step of repack / unpack: bounds their scratch to ~64 MiB


def repack(packed: Tensor) -> Tensor:
    """ModelOpt's packed codes uint8 [E, N, K/2] -> the kernel's layout, same shape and dtype (K a multiple of
    128)."""
    e, n, k2 = packed.shape
    column, code_bit, word_bit = (t.to(packed.device) for t in _layout())
    out = torch.empty_like(packed)
    step = max(1, _REPACK_CHUNK // max(1, n * k2))
    for i in range(0, e, step):
        codes = unpack_codes(packed[i:i + step]).view(-1, n, k2 // 64, 128).to(torch.int32)
        bits = (codes[..., column] >> code_bit) & 1  # [e', N, blocks, 16, 32]
        words = (bits << word_bit).sum(-1, dtype=torch.int64).to(torch.int32)  # disjoint bits: the sum is the OR
        out[i:i + step] = words.view(torch.uint8).reshape(-1, n, k2)
    return out


def unpack(words: Tensor) -> Tensor:
    """repack's inverse: the kernel's layout -> ModelOpt's packed codes."""
    e, n, k2 = words.shape
    column, code_bit, word_bit = (t.to(words.device) for t in _layout())
    out = torch.empty_like(words)
    step = max(1, _REPACK_CHUNK // max(1, n * k2))
    for i in range(0, e, step):
        w = words[i:i + step].contiguous().view(torch.int32).view(-1, n, k2 // 64, 16)
        bits = (w.unsqueeze(-1) >> word_bit) & 1  # [e', N, blocks, 16, 32]
        codes = torch.zeros(*w.shape[:3], 128, dtype=torch.int32, device=words.device)
        codes.index_add_(3, column.reshape(-1), (bits << code_bit).flatten(-2))
        out[i:i + step] = pack_codes(codes.view(-1, n, 2 * k2))
    return out


def decode_asm(j: int, fp16: bool) -> str:
    """PTX for slice j of a k pair: $1 (slices 0-3) or $2 (4-7) is the word holding it (repack's layout); its two
    codes' bits into a bfloat16 pair (rotate + AND, or AND + multiply + AND for j % 4 = 3), for fp16 the
    magnitudes moved 3 bits up (lop3 0xE4: a where MASK_SIGN_FP16 is set, a << 3 elsewhere), then one packed
    multiply by $3 (the block scale, pre-scaled)."""
    src, kind = ("$1", "$2")[j // 4], j % 4
    if kind == 3:
        body = f"and.b32 a, {src}, {LEFT:#x}; mul.lo.u32 a, a, {MUL_D:#x}; and.b32 a, a, {MASK_P:#x}; "
    elif ROTATIONS[kind]:
        body = f"shf.r.wrap.b32 a, {src}, {src}, {ROTATIONS[kind]}; and.b32 a, a, {MASK_P:#x}; "
    else:
        body = f"and.b32 a, {src}, {MASK_P:#x}; "
    if fp16:
        body += f"shl.b32 b, a, 3; lop3.b32 a, a, b, {MASK_SIGN_FP16:#x}, 0xE4; "
    mul = "mul.rn.f16x2" if fp16 else "mul.rn.bf16x2"
    return "{ .reg .b32 a, b; " + body + f"{mul} $0, a, $3; }}"


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


def ring_over_bytes() -> int:
    """RING_OVER_BYTES, for the kernel (a constexpr function: Gluon reads no plain global)."""
    return RING_OVER_BYTES


def available(device: torch.device, k: int) -> bool:
    """On an sm_90 GPU with Gluon importable, K a whole number of 128-column blocks."""
    if device.type != "cuda" or k % K_BLOCK:
        return False
    return gluon_common.sm90(torch.cuda.get_device_capability(device))


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

    decode_asm_c = constexpr_function(decode_asm)  # called at compile time, with constexpr arguments
    scale_mul_c, out_mul_c = constexpr_function(scale_multiplier), constexpr_function(out_multiplier)
    ring_over_c = constexpr_function(ring_over_bytes)
    shared = gluon_common.helpers()
    tile_place, run_tile, weight_columns = shared["tile_place"], shared["run_tile"], shared["weight_columns"]
    token_pointers, copy_block, store_outputs = shared["token_pointers"], shared["copy_block"], shared["store_outputs"]
    # Gluon resolves names (annotations, callees, builtins) through the module's globals, not this closure
    pdl_open = pdl.gluon_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(gl=gl, cp=cp, fence_async_shared=fence_async_shared, warpgroup_mma=warpgroup_mma,
                     warpgroup_mma_wait=warpgroup_mma_wait, decode_asm_c=decode_asm_c,
                     tile_place=tile_place, run_tile=run_tile, weight_columns=weight_columns,
                     token_pointers=token_pointers, copy_block=copy_block, store_outputs=store_outputs,
                     scale_mul_c=scale_mul_c, out_mul_c=out_mul_c, ring_over_c=ring_over_c, pdl_open=pdl_open)

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
    def nvfp4_tile(
        e, row_start, row_end, BLOCK_M: gl.constexpr,
        x_ptr, pw_ptr, bs_ptr, gs_ptr, y_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr, N_OUT, HALF,
        stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge, stride_ym, pid_n,
        K: gl.constexpr, BLOCK_N: gl.constexpr, AHEAD: gl.constexpr, DRAIN: gl.constexpr, RING: gl.constexpr,
        GATHER: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr, SCATTER: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """One program's tile: BLOCK_N weight rows of expert e times its rows row_start .. (at most BLOCK_M; the
        tile's place and size first, as gluon_common.run_tile calls it)."""
        SUB: gl.constexpr = 16
        # block i rewrites block i-2's stage (block i-1's last MMA may still run); DRAIN: block i-1's, after
        # waiting for that MMA at the block's start (int4_wgmma's SCALED 2): a stage less of shared memory
        STAGES: gl.constexpr = AHEAD + 1 if DRAIN else AHEAD + 2
        K16: gl.constexpr = K // 16  # block scales per row
        K16_P2: gl.constexpr = 1 << (K16 - 1).bit_length()  # the table's rows (a layout's shape is a power of 2)
        BLOCKS: gl.constexpr = K // 128
        # RING only where the whole table would be over RING_OVER_BYTES: gate_up's 32 KB (K 2048) keeps it to two
        # programs an SM; down's 16 KB (K 768) leaves room for three with DRAIN, and the ring's stores and index
        # arithmetic in the K loop would only cost it
        USE_RING: gl.constexpr = RING > 0 and K16_P2 * BLOCK_N * 2 > ring_over_c()
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
        # a row's 16 words, 16 B copies; 4-word chunks XOR-ed by the row (2-way bank conflicts at most for the
        # A operand reads, 4-way without)
        w_layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
        w_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=4, order=[1, 0])
        bs_layout: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [num_warps, 1], [1, 0])
        ring_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32, 1], [num_warps, 1], [1, 0])  # a block's 8 a row
        t_shared: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        t_row: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

        e64 = e.to(gl.int64)

        # the tokens: row pointers (gathered when GATHER) for cp.async, zero-filled past the tile's rows
        x_ptrs, rmask_x = token_pointers(x_ptr, rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER, x_layout)
        # three allocations: the barrier pass cannot tell stages of one apart (int4_wgmma)
        x_lo = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)
        x_hi = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 64], x_shared)

        # the packed words (repack's layout): a block's 16 per row of the program's BLOCK_N rows, as stored
        wc, w_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(1, w_layout))
        w_row = (wc + w_up).to(gl.int64)
        pos = gl.arange(0, SUB, layout=gl.SliceLayout(0, w_layout))
        w_ptrs = pw_ptr + e64 * stride_pe + w_row[:, None] * stride_pn + pos[None, :]
        wmask = (wc < N_OUT)[:, None]
        w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, SUB], w_shared)

        # the block scales as scale · 2^SCALE_EXP in the MMA's dtype, a row per 16 columns of K (read per slice in
        # the A operand's row layout through a 1-D view): every block's, once (RING 0), or a ring of RING blocks'
        # (RING > 0: block i + RING - 1's stored at block i, from registers loaded a block before; RING · 2 KB
        # of shared memory instead of K / 16 · 256 B; the same values, so the same bits)
        if USE_RING:
            sc, s_up = weight_columns(pid_n, BLOCK_N, OUT_N, HALF, SWIGLU, gl.SliceLayout(1, ring_layout))
            s_row = (sc + s_up).to(gl.int64)
            s_mask = (sc < N_OUT)[:, None]
            s_ptrs = (bs_ptr + e64 * stride_be + s_row[:, None] * stride_bn
                      + gl.arange(0, 8, layout=gl.SliceLayout(0, ring_layout))[None, :])
            slots = gl.allocate_shared_memory(dtype, [RING, 8, BLOCK_N], t_shared)  # a block's 8 rows a slot
            for b in gl.static_range(RING - 1):
                if b < BLOCKS:
                    bs = gl.load(s_ptrs + b * 8, mask=s_mask, other=0.0)
                    slots.index(b).permute((1, 0)).store((bs.to(gl.float32) * SCALE_MUL).to(dtype))
            s_next = gl.load(s_ptrs + min(RING - 1, BLOCKS - 1) * 8, mask=s_mask, other=0.0)
            rows_of = slots._reinterpret(dtype, [RING * 8, BLOCK_N], t_row)
        else:
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
            if DRAIN:  # block i-1's last MMA, before its stage is rewritten
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            copy_block(x_lo, x_hi, w_smem, (i + AHEAD) % STAGES, x_ptrs, rmask_x, w_ptrs, 1, wmask, (i + AHEAD) * 128,
                       K)
            if USE_RING:
                # block i + RING - 1's scales into the slot block i - 1 read (every thread is past those reads:
                # the barrier after the wait above), before the barrier the words' loads below get (so no
                # barrier of its own); then block i + RING's from global memory, a block ahead of their store
                slots.index((i + RING - 1) % RING).permute((1, 0)).store((s_next.to(gl.float32) * SCALE_MUL).to(dtype))
                s_next = gl.load(s_ptrs + gl.minimum(i + RING, BLOCKS - 1) * 8, mask=s_mask, other=0.0)  # past the
                # last block: the last's again, never stored
                first = (i % RING) * 8
            else:
                first = i * 8
            t = w_smem.index(stage).load(a_layout)  # each lane's words of the block, in the A operand's places
            for j in gl.static_range(8):
                s_i = rows_of.index(first + j).load(gl.SliceLayout(1, a_layout))[:, None]
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

    globals().update(nvfp4_tile=nvfp4_tile)

    @gluon.jit
    def nvfp4_wgmma_kernel(
        x_ptr, pw_ptr, bs_ptr, gs_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge, stride_ym,
        K: gl.constexpr, E: gl.constexpr, E_P2: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, AHEAD: gl.constexpr, DRAIN: gl.constexpr, RING: gl.constexpr,
        SMALL_M: gl.constexpr, MID_M: gl.constexpr, ONLY: gl.constexpr,
        GATHER: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr, SCATTER: gl.constexpr,
        PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        pid_n = gl.program_id(0)
        place = tile_place(offs_ptr, E, E_P2, BLOCK_M, SMALL_M, MID_M, ONLY, num_warps)
        if place[0] >= E:  # a spare M tile past the last expert's rows
            return
        run_tile(nvfp4_tile, place, (x_ptr, pw_ptr, bs_ptr, gs_ptr, y_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
                                     N_OUT, HALF, stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge,
                                     stride_ym, pid_n, K, BLOCK_N, AHEAD, DRAIN, RING, GATHER, SWIGLU, ROW_SCALE, SCATTER,
                                     num_warps),
                 BLOCK_M, SMALL_M, MID_M, ONLY)

    return nvfp4_wgmma_kernel


def launch(x: Tensor, packed: Tensor, block_scale: Tensor, global_scale: Tensor, y: Tensor, offsets: Tensor,
           config: dict[str, Any], *, row_index: Tensor | None, swiglu: bool, row_scale: Tensor | None,
           row_dest: Tensor | None) -> Any:
    """Run the kernel over y's rows; `packed` in repack's layout (nvfp4.nvfp4_grouped_mm checks the arguments
    and calls this). config as int4_wgmma.launch's (SMALL_M / MID_M / SPLIT: a tile size per expert), no SCALED;
    DRAIN: one stage of tokens and words fewer, by waiting for the block before's last MMA at each block's start;
    RING: the block scales of RING blocks in shared memory instead of all K's, where all K's would take more than
    RING_OVER_BYTES (gate_up at the 30B shape)."""
    e, n, _ = packed.shape
    words = packed.view(torch.int32)  # [E, N, K/8]: 8 codes per word
    n_out = n // 2 if swiglu else n
    block_n = config["BLOCK_N"]
    compiled = None
    for kind in gluon_common.kinds(config):
        grid = (triton.cdiv(n_out, block_n // 2 if swiglu else block_n), gluon_common.m_tiles(y.shape[0], e, config, kind))
        compiled = _kernel()[grid](
            x, words, block_scale, global_scale, y, offsets,
            offsets if row_index is None else row_index, offsets if row_scale is None else row_scale,
            offsets if row_dest is None else row_dest, n_out, n // 2,
            x.stride(0), words.stride(0), words.stride(1), block_scale.stride(0), block_scale.stride(1),
            global_scale.stride(0), y.stride(0),
            K=x.shape[1], E=e, E_P2=triton.next_power_of_2(e), BLOCK_M=config["BLOCK_M"], BLOCK_N=block_n,
            AHEAD=config["AHEAD"], DRAIN=int(config.get("DRAIN", 0)), RING=int(config.get("RING", 0)), SMALL_M=config.get("SMALL_M", 0),
            MID_M=config.get("MID_M", 0), ONLY=kind,
            GATHER=row_index is not None, SWIGLU=swiglu, ROW_SCALE=row_scale is not None,
            SCATTER=row_dest is not None, num_warps=config.get("num_warps", 4), **pdl.launch_args(x.device),
        )
    return compiled
