"""Gluon helpers the Hopper grouped kernels share (int4_wgmma, nvfp4_wgmma, w4a8_kernels): which expert and rows an
M tile covers (one tile size, or a size per expert by its rows: tile_map) and the call of a kernel's tile function
with that tile's size (run_tile: each kernel is its tile function behind this one dispatch), the weight rows of a
program (gate and up stacked for SwiGLU), the tokens' row pointers, a block's copies into shared memory, the
engine's fused steps after the K loop, bfloat16 rounding that no compiler pass folds away. A Gluon kernel cannot
call a Triton function, so some are triton_common's Triton helpers again, with layouts; `helpers()` returns them
for a kernel module's globals (Gluon resolves a callee's name there). On the host: the grids (m_tiles), the
launches of a plan (kinds), which tiles a projection takes (plan_bucket, tiles_for) and the name a run records for
them (kernel_name)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

TILES_ENV = "QUANTBENCH_WGMMA_TILES"  # a benchmark's override of the tiles: {"int4": {"mid": {...}}, "nvfp4": ...}


@functools.cache
def sm90(capability: tuple[int, int]) -> bool:
    """A compute capability the Gluon kernels run on (Hopper's wgmma), with Gluon importable."""
    if capability != (9, 0):
        return False
    try:  # lazy: Gluon exists only in recent Triton builds (and Triton only where it is installed)
        from triton.experimental import gluon  # noqa: F401
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


# Below this K (inputs of a projection) the mid and large buckets keep one tile size ("short-k" in a format's
# WGMMA_TILES): the plans were measured faster at the Qwen3-30B-A3B shape (K 2048 and 768), and INT4's was slower
# on the embedded fixture (K 256, two blocks: with one block copied ahead the second is never in flight early):
# 0.79 against 0.68 ms p50 a decision on the H200, 2026-12-03 (docs/BENCHMARKS.md).
PLAN_MIN_K = 768


def plan_bucket(bucket: str, k: int) -> str:
    """The WGMMA_TILES entry a projection with K inputs takes in rows bucket `bucket` (rows_bucket)."""
    return "short-k" if bucket != "small" and k < PLAN_MIN_K else bucket


def tiles_for(fmt: str, bucket: str, defaults: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """defaults[bucket] (a format's WGMMA_TILES), with QUANTBENCH_WGMMA_TILES's entry for (fmt, bucket) merged
    over it: how benchmarks/tile_plans.py runs `quantbench run` with a candidate plan before it is the default."""
    return {**defaults[bucket], **_override(os.environ.get(TILES_ENV, "")).get(fmt, {}).get(bucket, {})}


@functools.cache
def _override(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{TILES_ENV}: not JSON ({exc}); expected {{\"int4\": {{\"mid\": {{\"SMALL_M\": 16}}}}}}") from exc
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{TILES_ENV}: expected an object of formats, each an object of buckets, got {text!r}")
    return value


def kernel_name(base: str, config: dict[str, Any]) -> str:
    """The name a run records for a Gluon kernel with `config`: the base name, then what its plan changes
    (-scaled: other arithmetic; -mixed / -split: a tile size per expert, in one launch / a launch per size)."""
    name = base + ("-scaled" if config.get("SCALED") else "")
    if config.get("SMALL_M"):
        name += "-split" if config.get("SPLIT") else "-mixed"
    return name


def tile_map(counts: list[int], config: dict[str, Any], kind: int = -1) -> list[tuple[int, int, int, int]]:
    """The M tiles the kernels' expert_tile / expert_tile_sized give for rows per expert `counts`, in program order:
    (expert, first row, end of the expert's rows, kind of tile). With SMALL_M (a tile size per expert by its
    rows): an expert with at most SMALL_M rows gets one tile of kind 0 (SMALL_M tokens), one with at most MID_M one
    of kind 1 (MID_M tokens), any other ceil(rows / BLOCK_M) tiles of kind 2; `kind` >= 0 keeps that kind's tiles
    alone (a launch per kind, SPLIT). The host's statement of what the Gluon helpers compute (tests hold m_tiles
    and the engine's plans to it)."""
    small, mid, block = config.get("SMALL_M", 0), config.get("MID_M", 0), config["BLOCK_M"]
    light = max(small, mid)
    tiles, start = [], 0
    for e, rows in enumerate(counts):
        k = 2 if not small or rows > light else 0 if rows <= small else 1
        n = 0 if rows == 0 else 1 if k < 2 else -(-rows // block)
        if kind < 0 or k == kind:
            tiles += [(e, start + t * block, start + rows, k) for t in range(n)]
        start += rows
    return tiles


def m_tiles(rows: int, experts: int, config: dict[str, Any], kind: int) -> int:
    """Grid rows (M tiles) enough for any split of `rows` sorted rows over `experts` experts, for a launch of
    `kind` (-1: every kind; tile_map): each expert wastes at most one partial tile, and a one-tile kind (0, 1)
    has at most one tile per expert that has a row."""
    if kind in (0, 1):
        return min(experts, rows)
    # kind 2 alone: only experts with more rows than a one-tile kind takes have a partial tile
    light = max(config.get("SMALL_M", 0), config.get("MID_M", 0)) if kind == 2 else 0
    return -(-rows // config["BLOCK_M"]) + min(experts, rows // (light + 1))


def kinds(config: dict[str, Any]) -> list[int]:
    """The launches of a configuration: [-1] (one launch; its programs take every kind of tile) unless SPLIT asks
    for a launch per kind of tile (0: SMALL_M rows, 1: MID_M rows, 2: BLOCK_M rows)."""
    if not config.get("SMALL_M") or not config.get("SPLIT"):
        return [-1]
    return [0] + ([1] if config.get("MID_M") else []) + [2]


@functools.cache
def helpers() -> dict[str, Any]:
    # lazy: Gluon exists only in recent Triton builds; called only once sm90() said yes
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    globals().update(gl=gl, cp=cp)

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
    def expert_tile_sized(offs_ptr, pid_m, E: gl.constexpr, E_P2: gl.constexpr, BLOCK_M: gl.constexpr,
                          SMALL_M: gl.constexpr, MID_M: gl.constexpr, ONLY: gl.constexpr, num_warps: gl.constexpr):
        """expert_tile with a tile size per expert: an expert with at most SMALL_M rows gets one tile of kind 0,
        one with at most MID_M rows one of kind 1 (MID_M 0: no such kind), the rest BLOCK_M-row tiles of kind 2.
        ONLY >= 0: the tiles of that kind alone (a launch per kind). (expert, first row, end of its rows, kind);
        e == E past the last tile."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        eidx = gl.arange(0, E_P2, layout=layout)
        emask = eidx < E
        ends = gl.load(offs_ptr + eidx, mask=emask, other=0)
        starts = gl.load(offs_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
        rows = ends - starts
        LIGHT: gl.constexpr = MID_M if MID_M > SMALL_M else SMALL_M  # the most rows a one-tile kind takes
        kind = gl.where(rows <= SMALL_M, 0, gl.where(rows <= LIGHT, 1, 2))
        tiles = gl.where(emask & (rows > 0), gl.where(kind < 2, 1, (rows + BLOCK_M - 1) // BLOCK_M), 0)
        if ONLY >= 0:
            tiles = gl.where(kind == ONLY, tiles, 0)
        tile_end = gl.associative_scan(tiles, 0, _add)
        e = gl.sum((tile_end <= pid_m).to(gl.int32), 0)
        sel = eidx == e
        first_tile = gl.sum(gl.where(sel, tile_end - tiles, 0), 0)
        row_start = gl.sum(gl.where(sel, starts, 0), 0) + (pid_m - first_tile) * BLOCK_M
        row_end = gl.sum(gl.where(sel, ends, 0), 0)
        return e, row_start, row_end, gl.sum(gl.where(sel, kind, 0), 0)

    globals().update(expert_tile=expert_tile, expert_tile_sized=expert_tile_sized)

    @gluon.jit
    def tile_place(offs_ptr, E: gl.constexpr, E_P2: gl.constexpr, BLOCK_M: gl.constexpr, SMALL_M: gl.constexpr,
                   MID_M: gl.constexpr, ONLY: gl.constexpr, num_warps: gl.constexpr):
        """(expert, first row, end of its rows, kind) of program (…, program_id(1))'s M tile: SMALL_M 0, BLOCK_M
        rows for every expert (expert_tile; kind 2), otherwise a size per expert (expert_tile_sized); e == E past
        the last expert's rows."""
        if SMALL_M == 0:
            e, row_start, row_end = expert_tile(offs_ptr, gl.program_id(1), E, E_P2, BLOCK_M, num_warps)
            return e, row_start, row_end, 2
        else:
            return expert_tile_sized(offs_ptr, gl.program_id(1), E, E_P2, BLOCK_M, SMALL_M, MID_M, ONLY, num_warps)

    @gluon.jit
    def run_tile(tile, place, args, BLOCK_M: gl.constexpr, SMALL_M: gl.constexpr, MID_M: gl.constexpr,
                 ONLY: gl.constexpr):
        """`tile(e, row_start, row_end, rows of the tile, *args)` for the M tile at `place` (tile_place's): `tile`
        a kernel's tile function (a Gluon function passed in is a constexpr), `args` its other arguments. With
        SMALL_M each size is a call of its own, so the kernel is compiled once per size (its registers the
        largest's); ONLY >= 0: this launch's kind alone. The kernel returns for a spare tile (e == E) before this:
        a return in here is a branch to the kernel's end, which LLVM lays out otherwise (ISETP.GT against 127 in
        place of ISETP.GE against 128 in the SASS: the same test, not the same machine code)."""
        e, row_start, row_end, kind = place
        if SMALL_M == 0:
            tile(e, row_start, row_end, BLOCK_M, *args)
        elif ONLY == 0:
            tile(e, row_start, row_end, SMALL_M, *args)
        elif ONLY == 1:
            tile(e, row_start, row_end, MID_M, *args)
        elif ONLY == 2:
            tile(e, row_start, row_end, BLOCK_M, *args)
        else:  # every kind in this launch, by a branch per program
            if kind == 0:
                tile(e, row_start, row_end, SMALL_M, *args)
            elif kind == 2:
                tile(e, row_start, row_end, BLOCK_M, *args)
            else:
                if MID_M > 0:
                    tile(e, row_start, row_end, MID_M, *args)

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

    globals().update(round_bf16=round_bf16)

    @gluon.jit
    def token_pointers(x_ptr, rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M: gl.constexpr,
                       GATHER: gl.constexpr, x_layout: gl.constexpr):
        """The pointers to the first 64 columns of the tile's token rows (with GATHER, row r reads token
        row_index[r] of the unsorted x), for cp.async, and the rows that are real (the rest are zero-filled)."""
        xr = row_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
        rmask_x = (xr < row_end)[:, None]
        if GATHER:
            x_rows = gl.load(rowidx_ptr + xr, mask=xr < row_end, other=0).to(gl.int64) * stride_xm
        else:
            x_rows = xr.to(gl.int64) * stride_xm
        x_ptrs = x_ptr + x_rows[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, x_layout))[None, :]
        return x_ptrs, rmask_x

    @gluon.jit
    def copy_block(x_lo, x_hi, w_smem, stage, x_ptrs, rmask_x, w_ptrs, w_step, wmask, kb, K: gl.constexpr):
        """cp.async of block kb's tokens (columns kb .. kb + 127, two 64-column halves) and its weight words (at
        w_ptrs + (kb / 8) · w_step: a word holds 8 of K's columns) into `stage`, one commit group; past K an empty
        group, so that every block has one."""
        ok = kb < K
        cp.async_copy_global_to_shared(x_lo.index(stage), x_ptrs + kb, mask=rmask_x & ok)
        cp.async_copy_global_to_shared(x_hi.index(stage), x_ptrs + kb + 64, mask=rmask_x & ok)
        cp.async_copy_global_to_shared(w_smem.index(stage), w_ptrs + (kb // 8) * w_step, mask=wmask & ok)
        cp.commit_group()

    @gluon.jit
    def store_outputs(acc, y_ptr, rowscale_ptr, rowdest_ptr, row_start, row_end, pid_n, N_OUT, stride_ym,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SWIGLU: gl.constexpr, ROW_SCALE: gl.constexpr,
                      SCATTER: gl.constexpr, ROUND_BF16: gl.constexpr, num_warps: gl.constexpr):
        """The engine's fused steps on the [BLOCK_N weight rows, BLOCK_M tokens] accumulator: silu(gate) * up
        (SWIGLU: gate rows then up rows, meeting through shared memory), the routing weight of each row, the store
        to row row_dest[r] of y (SCATTER). ROUND_BF16: rounded to bfloat16 where the unfused path rounds
        (nvfp4.fused_epilogue: a W4A4 model's next activation rounding amplifies a last-bit difference)."""
        OUT_N: gl.constexpr = BLOCK_N // 2 if SWIGLU else BLOCK_N
        out_layout: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, num_warps], [0, 1])  # columns contiguous
        orows = row_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
        ormask = orows < row_end
        ocols = pid_n * OUT_N + gl.arange(0, OUT_N, layout=gl.SliceLayout(1, out_layout))
        if SWIGLU:
            acc_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M],
                                                 gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0, 1]))
            acc_smem.store(acc)
            gl.thread_barrier()
            gate = acc_smem.slice(0, OUT_N, dim=0).load(out_layout)
            up = acc_smem.slice(OUT_N, OUT_N, dim=0).load(out_layout)
            if ROUND_BF16:
                gate = round_bf16(gate)
                out = round_bf16(round_bf16(gate * (1 / (1 + gl.exp(-gate)))) * round_bf16(up))
            else:
                out = gate * (1 / (1 + gl.exp(-gate))) * up  # tl.sigmoid's expression, as the Triton kernels'
        else:
            out = gl.convert_layout(acc, out_layout)
            if ROUND_BF16:
                out = round_bf16(out)
        if ROW_SCALE:  # the routing weight of each (token, expert) row
            out = out * gl.load(rowscale_ptr + orows, mask=ormask, other=0.0).to(gl.float32)[None, :]
        if SCATTER:  # sorted row r goes to row row_dest[r] of y
            y_rows = gl.load(rowdest_ptr + orows, mask=ormask, other=0).to(gl.int64)
        else:
            y_rows = orows.to(gl.int64)
        y_ptrs = y_ptr + y_rows[None, :] * stride_ym + ocols[:, None]
        gl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=ormask[None, :] & (ocols < N_OUT)[:, None])

    return dict(tile_place=tile_place, run_tile=run_tile, weight_columns=weight_columns, token_pointers=token_pointers,
                copy_block=copy_block, store_outputs=store_outputs)
