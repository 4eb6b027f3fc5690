"""The Triton helper library every grouped kernel (int4, nvfp4, fp8) and the fused ops share, and the one guarded
import of Triton the engine's modules reuse.

Triton is optional: a CPU-only install has none (it is a test extra), and the engine then runs its torch paths. So
`triton` and `tl` are None there, and the jitted helpers below exist only where Triton does: a module whose kernels
call them imports them under `if triton is not None:`, by name, since Triton resolves a jitted callee through the
caller's module globals.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from quantbench.engine import pdl

try:  # Triton is optional: without it (a CPU-only install) the engine dequantizes instead
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_available() -> bool:
    """A GPU and Triton (or Triton's CPU interpreter, which the tests use)."""
    return triton is not None and (torch.cuda.is_available() or interpreting())


def expert_of_rows(offsets: Tensor, rows: int) -> Tensor:
    """For rows sorted by expert (offsets: cumulative row counts), the expert of each row; no host sync."""
    return torch.searchsorted(offsets, torch.arange(rows, device=offsets.device, dtype=offsets.dtype), right=True)


def rows_bucket(rows: int, experts: int) -> str:
    """The rows-per-expert bucket ("small" up to 12, "mid" up to 48, "large") the grouped kernels' tiles are
    chosen by."""
    per_expert = rows / max(1, experts)
    return "small" if per_expert <= 12 else "mid" if per_expert <= 48 else "large"


def norm_tile(n: int) -> tuple[int, int, int]:
    """(N_P2, rows per program, warps) of rmsnorm_kernel for rows of n: also what routing.sum_slots_norm takes, so
    that its norm reduces in the same tile and order (the same bits)."""
    n_p2 = triton.next_power_of_2(n)
    return n_p2, max(1, min(64, 4096 // n_p2)), 4 if n_p2 <= 1024 else 8


def launch_grouped(kernel: Any, name: str, x: Tensor, weights: tuple[Tensor, ...], weight_strides: tuple[int, ...],
                   offsets: Tensor, n: int, pick: Callable[[int], dict], config: dict | None, *,
                   row_index: Tensor | None, swiglu: bool, row_scale: Tensor | None, row_dest: Tensor | None,
                   out_dtype: torch.dtype | None = None, **constexprs: Any) -> Tensor:
    """The host side the nvfp4 and fp8 grouped kernels share: the output, the configuration (`pick(rows)` unless
    given), the grid and the engine's fused steps (row_index / swiglu / row_scale / row_dest, as
    `int4_grouped_mm` takes them). A kernel takes x, its weight tensors, y, offsets, row index, row scale, row
    destination, N_OUT, HALF, x's row stride, its weight strides, y's row stride, then the constexprs."""
    k = x.shape[1]
    s_rows = x.shape[0] if row_index is None else row_index.shape[0]
    e = weights[0].shape[0]
    n_out = n // 2 if swiglu else n
    x = x.contiguous()
    y = torch.empty(s_rows, n_out, dtype=out_dtype or x.dtype, device=x.device)
    if s_rows == 0:
        return y
    cfg = dict(config or pick(s_rows))
    cfg.setdefault("SWAP_AB", False)
    if k % cfg["BLOCK_K"]:
        raise ValueError(f"{name}: K={k} is not a multiple of BLOCK_K={cfg['BLOCK_K']}")
    interpret = interpreting()
    if interpret:
        cfg.pop("num_warps", None), cfg.pop("num_stages", None)
    # enough M tiles for any split of the rows: each expert wastes at most one partial tile
    grid = (triton.cdiv(n_out, cfg["BLOCK_N"]), triton.cdiv(s_rows, cfg["BLOCK_M"]) + e)
    kernel[grid](
        x, *weights, y, offsets,
        offsets if row_index is None else row_index, offsets if row_scale is None else row_scale,
        offsets if row_dest is None else row_dest, n_out, n // 2, x.stride(0), *weight_strides, y.stride(0),
        K=k, E=e, E_P2=triton.next_power_of_2(e), DOT_F32=interpret,
        GATHER=row_index is not None, SWIGLU=swiglu, ROW_SCALE=row_scale is not None, SCATTER=row_dest is not None,
        **constexprs, **cfg, **pdl.launch_args(x.device),
    )
    return y


if triton is not None:
    pdl_open = pdl.triton_open()  # the first statement of each kernel launched with pdl.launch_args

    @triton.jit
    def round_bf16(v):
        """float32 -> the nearest bfloat16 value (ties to even), kept in float32: what a GPU's cast does, spelled
        out for the Triton interpreter, whose casts truncate."""
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def expert_tile(offs_ptr, pid_m, E: tl.constexpr, E_P2: tl.constexpr, BLOCK_M: tl.constexpr):
        """Which expert and rows M tile `pid_m` covers (the tiles of expert e follow those of expert e-1):
        (e, first row, end of the expert's rows); e == E for a spare tile past the last one."""
        eidx = tl.arange(0, E_P2)
        emask = eidx < E
        ends = tl.load(offs_ptr + eidx, mask=emask, other=0)
        starts = tl.load(offs_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
        tiles = tl.where(emask, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
        tile_end = tl.cumsum(tiles, 0)
        e = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
        sel = eidx == e
        first_tile = tl.sum(tl.where(sel, tile_end - tiles, 0), 0)
        row_start = tl.sum(tl.where(sel, starts, 0), 0) + (pid_m - first_tile) * BLOCK_M
        row_end = tl.sum(tl.where(sel, ends, 0), 0)
        return e, row_start, row_end

    @triton.jit
    def mma_nt(w, x, acc, SWAP_AB: tl.constexpr):
        """acc += x @ w.T for a weight tile w [BLOCK_N, BLOCK_K] and a token tile x [BLOCK_M, BLOCK_K], or its
        transpose with SWAP_AB: the weights then take the MMA's M side (64 rows for Hopper's wgmma), so a tile of
        16..64 tokens still runs on wgmma (Triton lowers a dot whose M side is under 64 to mma.sync on sm_90, and
        an FP8 one to fp16 mma.sync, upcasting both operands). Shared by the nvfp4 and fp8 grouped kernels."""
        if SWAP_AB:
            return tl.dot(w, tl.trans(x), acc)
        else:
            return tl.dot(x, tl.trans(w), acc)

    @triton.jit
    def accumulator(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
        """A float32 accumulator for mma_nt: [BLOCK_N, BLOCK_M] with SWAP_AB, else [BLOCK_M, BLOCK_N]."""
        if SWAP_AB:
            return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    @triton.jit
    def e4m3_codes(v, scale):
        """float32 v -> E4M3 codes with `scale`, saturating at ±448: how an FP8 kernel rounds its input, and how
        an epilogue writes codes for the next one (one expression, so both give the same bits)."""
        return tl.minimum(tl.maximum(v / scale, -448.0), 448.0).to(tl.float8e4nv)

    @triton.jit
    def column_vector(v, SWAP_AB: tl.constexpr):
        """A per-output-column vector broadcast against the accumulator ([BLOCK_N, BLOCK_M] with SWAP_AB)."""
        if SWAP_AB:
            return v[:, None]
        else:
            return v[None, :]

    @triton.jit
    def row_vector(v, SWAP_AB: tl.constexpr):
        """A per-row (token) vector broadcast against the accumulator."""
        if SWAP_AB:
            return v[None, :]
        else:
            return v[:, None]

    @triton.jit
    def fused_epilogue(acc, up, y_ptr, rows, rmask, cols, cmask, rowscale_ptr, rowdest_ptr, stride_ym,
                       SWAP_AB: tl.constexpr, SWIGLU: tl.constexpr, ROW_SCALE: tl.constexpr, SCATTER: tl.constexpr,
                       ROUND_BF16: tl.constexpr, codes_scale=1.0, OUT_CODES: tl.constexpr = False):
        """The engine's fused steps after the K loop (quantbench.engine.moe.engine's contract): silu(gate) * up, the
        routing weight of each row, and the store, to row row_dest[r] of y with SCATTER. ROUND_BF16 (a bf16
        model): every intermediate rounded to bfloat16 where the unfused path rounds (the GEMM outputs, silu, the
        product), so that a W4A4 / W8A8 format's next activation rounding sees the values the unfused path and
        ModelOpt's fake-quant forward see (rounding once in float32 moved a W4A4 layer's output by 2.4e-2 on the
        H200, FP4's coarse steps amplifying the last bit). OUT_CODES: y holds E4M3 codes of the (rounded) output
        with `codes_scale`, as the next FP8 projection's kernel would round its input (quantbench.engine.moe.fp8)."""
        if ROUND_BF16:
            acc = round_bf16(acc)
        if SWIGLU:
            if ROUND_BF16:
                u = round_bf16(up)
                out = round_bf16(round_bf16(acc * tl.sigmoid(acc)) * u)
            else:
                out = acc * tl.sigmoid(acc) * up
        else:
            out = acc
        if ROW_SCALE:
            out = out * row_vector(tl.load(rowscale_ptr + rows, mask=rmask, other=0.0).to(tl.float32), SWAP_AB)
        if OUT_CODES:
            out = e4m3_codes(out, codes_scale)
        if SCATTER:
            y_rows = tl.load(rowdest_ptr + rows, mask=rmask, other=0).to(tl.int64)
        else:
            y_rows = rows.to(tl.int64)
        if SWAP_AB:
            tl.store(y_ptr + y_rows[None, :] * stride_ym + cols[:, None], out.to(y_ptr.dtype.element_ty),
                     mask=rmask[None, :] & cmask[:, None])
        else:
            tl.store(y_ptr + y_rows[:, None] * stride_ym + cols[None, :], out.to(y_ptr.dtype.element_ty),
                     mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def tile_rows(rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M: tl.constexpr, GATHER: tl.constexpr):
        """An M tile's sorted rows (from expert_tile), which of them are real, and where each reads x: with GATHER
        sorted row r reads token row_index[r] of the unsorted x (no gathered copy of x), else row r. Shared by the
        int4, fp8 and nvfp4 grouped kernels."""
        rows = row_start + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        if GATHER:
            x_rows = tl.load(rowidx_ptr + rows, mask=rmask, other=0).to(tl.int64) * stride_xm
        else:
            x_rows = rows.to(tl.int64) * stride_xm
        return rows, rmask, x_rows
