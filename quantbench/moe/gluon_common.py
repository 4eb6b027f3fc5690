"""Gluon helpers the Hopper grouped kernels share (int4_wgmma, nvfp4_wgmma): which expert and rows an M tile
covers, the weight rows of a program (gate and up stacked for SwiGLU), bfloat16 rounding that no compiler pass
folds away. A Gluon kernel cannot call a Triton function, so these are nvfp4.py's Triton helpers again, with
layouts; `helpers()` returns them for a kernel module's globals (Gluon resolves a callee's name there)."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def helpers() -> dict[str, Any]:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    globals().update(gl=gl)

    @gluon.jit
    def _add(a, b):
        return a + b

    globals().update(_add=_add)

    @gluon.jit
    def expert_tile(offs_ptr, pid_m, E: gl.constexpr, E_P2: gl.constexpr, BLOCK_M: gl.constexpr,
                    num_warps: gl.constexpr):
        """(expert, first row, end of its rows) of M tile pid_m; e == E past the last (nvfp4.expert_tile)."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        eidx = gl.arange(0, E_P2, layout=layout)
        emask = eidx < E
        ends = gl.load(offs_ptr + eidx, mask=emask, other=0)
        starts = gl.load(offs_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
        tiles = gl.where(emask, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
        tile_end = gl.associative_scan(tiles, 0, _add)
        e = gl.sum((tile_end <= pid_m).to(gl.int32), 0)
        sel = eidx == e
        first_tile = gl.sum(gl.where(sel, tile_end - tiles, 0), 0)
        row_start = gl.sum(gl.where(sel, starts, 0), 0) + (pid_m - first_tile) * BLOCK_M
        row_end = gl.sum(gl.where(sel, ends, 0), 0)
        return e, row_start, row_end

    @gluon.jit
    def weight_columns(pid_n, BLOCK_N: gl.constexpr, OUT_N: gl.constexpr, HALF, SWIGLU: gl.constexpr,
                       layout: gl.constexpr):
        """The MMA's BLOCK_N weight rows as (output column, offset to the stored weights' column): with SWIGLU,
        OUT_N gate columns then the same OUT_N up columns, HALF further on."""
        rows = gl.arange(0, BLOCK_N, layout=layout)
        out_cols = pid_n * OUT_N + rows % OUT_N
        if SWIGLU:
            return out_cols, (rows >= OUT_N).to(gl.int32) * HALF
        else:
            return out_cols, 0

    @gluon.jit
    def round_bf16(v):
        """float32 -> the nearest bfloat16 value (ties to even), kept in float32, in integer arithmetic: a cast
        pair f32 -> bf16 -> f32 can be folded away by the compiler (nvfp4.round_bf16, fused_ops)."""
        bits = v.to(gl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(gl.float32, bitcast=True)

    return dict(expert_tile=expert_tile, weight_columns=weight_columns, round_bf16=round_bf16)
