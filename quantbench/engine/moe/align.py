"""Group the routed (token, expert) pairs by expert on the GPU with small Triton kernels instead of a sort.

The engine needs, for S = tokens × top-k routed pairs: `offsets` (cumulative rows per expert, int32), and for
each row r of the expert-grouped order the token it reads (`row_token`), its routing weight (`row_scale`) and the
pair it came from (`row_pair`); for each pair i its row (`pair_row`, to put results back in pair order).
`torch.sort` of 4,096 expert ids took 34 µs per layer on the H200, more than all of this together
(benchmarks/model_profile.py).

Up to ONE_LAUNCH_PAIRS pairs (a 2,048-token decision at top-8) it is one launch of `group_kernel`: each program
histograms all the pairs' experts (for the offsets) and those before its own block (for where its rows start),
and places its block's pairs in pair order within each expert, as a stable sort would. An earlier version did it
all in one program with global atomics: 14 µs per layer at 512 tokens on the H200 (in a 275 µs layer). Above
that, for batches, three steps: one kernel counts the pairs per expert, torch.cumsum makes the offsets, one kernel
places each pair at its expert's next free row (an atomic counter per expert).

In the three-step path the rows of one expert land in whichever order the atomics run, which changes nothing
computed: each row of a grouped GEMM depends only on its own inputs, and results are summed back per token in
pair order. (The CPU keeps
the engine's sort path: there a sort is cheap and the interpreter-run tests cover these kernels.)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
from torch import Tensor

from quantbench.engine import pdl
from quantbench.engine.triton_common import tl, triton


class Grouping(NamedTuple):
    offsets: Tensor  # [E] int32: end row of each expert's rows
    row_token: Tensor  # [S] int32: the token row r reads
    row_scale: Tensor  # [S]: the routing weight of row r
    row_pair: Tensor  # [S] int32: the (token, slot) pair row r holds, as token * top_k + slot
    pair_row: Tensor  # [S] int32: the row of pair i


@functools.cache
def triton_available() -> bool:
    """Triton importable and a CUDA device to run it on (every grouped kernel's precondition)."""
    return triton is not None and torch.cuda.is_available()


@functools.cache
def _kernels() -> tuple[Any, Any]:
    pdl_open = pdl.triton_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(pdl_open=pdl_open)  # Triton resolves a jitted callee through the module's globals

    @triton.jit
    def count_kernel(ids_ptr, counts_ptr, S, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < S
        e = tl.load(ids_ptr + i, mask=mask, other=0)
        tl.atomic_add(counts_ptr + e, 1, mask=mask, sem="relaxed")

    @triton.jit
    def place_kernel(ids_ptr, w_ptr, counts_ptr, cursor_ptr, offs_ptr, row_token_ptr, row_scale_ptr, row_pair_ptr,
                     pair_row_ptr, S, TOP_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        pdl_open(PDL)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < S
        e = tl.load(ids_ptr + i, mask=mask, other=0)
        start = tl.load(offs_ptr + e, mask=mask, other=0) - tl.load(counts_ptr + e, mask=mask, other=0)
        row = start + tl.atomic_add(cursor_ptr + e, 1, mask=mask, sem="relaxed")
        tl.store(row_token_ptr + row, (i // TOP_K).to(tl.int32), mask=mask)
        tl.store(row_scale_ptr + row, tl.load(w_ptr + i, mask=mask, other=0.0), mask=mask)
        tl.store(row_pair_ptr + row, i.to(tl.int32), mask=mask)
        tl.store(pair_row_ptr + i, row.to(tl.int32), mask=mask)

    @triton.jit
    def group_kernel(ids_ptr, w_ptr, offs_ptr, row_token_ptr, row_scale_ptr, row_pair_ptr, pair_row_ptr, S,
                     E: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
                     SCAN: tl.constexpr, CHUNKS: tl.constexpr, PDL: tl.constexpr):
        """Each program places the BLOCK pairs from pid * BLOCK on, in pair order within each expert (what a
        stable sort gives). It histograms every pair's expert (CHUNKS chunks of SCAN, in shared memory: no
        global atomics) for the offsets, and the pairs before its own for where its first row of each expert
        lies; a pair's rank among its block's pairs of the same expert is a cumulative sum of their one-hot
        rows. Every program reads all S ids (16 KB at 512 tokens, from L2): the price of needing no second
        launch to learn what the others counted."""
        pdl_open(PDL)
        pid = tl.program_id(0)
        first = pid * BLOCK
        bins = tl.arange(0, E_P2)
        before = tl.zeros((E_P2,), dtype=tl.int32)
        total = tl.zeros((E_P2,), dtype=tl.int32)
        for c in range(CHUNKS):
            i = c * SCAN + tl.arange(0, SCAN)
            e = tl.load(ids_ptr + i, mask=i < S, other=0).to(tl.int32)
            total += tl.histogram(e, E_P2, mask=i < S)
            before += tl.histogram(e, E_P2, mask=i < first)
        ends = tl.cumsum(total, 0)
        if pid == 0:
            tl.store(offs_ptr + bins, ends, mask=bins < E)
        i = first + tl.arange(0, BLOCK)
        mask = i < S
        e = tl.load(ids_ptr + i, mask=mask, other=0).to(tl.int32)
        onehot = ((e[:, None] == bins[None, :]) & mask[:, None]).to(tl.int32)  # [BLOCK, E_P2]
        rank = tl.cumsum(onehot, 0) - 1  # among this block's pairs of the same expert
        start = ends - total + before  # this block's first row of each expert
        row = tl.sum(onehot * (rank + start[None, :]), axis=1)
        tl.store(row_token_ptr + row, (i // TOP_K).to(tl.int32), mask=mask)
        tl.store(row_scale_ptr + row, tl.load(w_ptr + i, mask=mask, other=0.0), mask=mask)
        tl.store(row_pair_ptr + row, i.to(tl.int32), mask=mask)
        tl.store(pair_row_ptr + i, row.to(tl.int32), mask=mask)

    return count_kernel, place_kernel, group_kernel


ONE_LAUNCH_PAIRS = 16384  # above, three launches (at batch 32: 131,072 pairs, read whole by every program)


def group_by_expert(top_k_index: Tensor, top_k_weights: Tensor, num_experts: int) -> Grouping:
    """The expert-grouped order of `top_k_index` [T, k] (with `top_k_weights` [T, k]), without host sync."""
    t, k = top_k_index.shape
    s = t * k
    ids = top_k_index.reshape(-1)
    weights = top_k_weights.reshape(-1).contiguous()
    out = [torch.empty(s, dtype=torch.int32, device=ids.device) for _ in range(3)]
    row_scale = torch.empty(s, dtype=weights.dtype, device=ids.device)
    count_kernel, place_kernel, group_kernel = _kernels()
    if 0 < s <= ONE_LAUNCH_PAIRS:
        offsets = torch.empty(num_experts, dtype=torch.int32, device=ids.device)
        e_p2 = triton.next_power_of_2(num_experts)
        block = max(16, 8192 // e_p2)  # the one-hot [BLOCK, E_P2] stays at 64 registers a thread
        scan = 1024
        group_kernel[(triton.cdiv(s, block),)](ids, weights, offsets, out[0], row_scale, out[1], out[2], s,
                                               E=num_experts, E_P2=e_p2, TOP_K=k, BLOCK=block, SCAN=scan,
                                               CHUNKS=triton.next_power_of_2(triton.cdiv(s, scan)), num_warps=4,
                                               **pdl.launch_args(ids.device))
        return Grouping(offsets, out[0], row_scale, out[1], out[2])
    scratch = torch.zeros(2, num_experts, dtype=torch.int32, device=ids.device)  # counts, cursors
    counts, cursor = scratch[0], scratch[1]
    block = 1024
    grid = (triton.cdiv(s, block),)
    if s:
        count_kernel[grid](ids, counts, s, BLOCK=block, **pdl.launch_args(ids.device))
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    if s:
        place_kernel[grid](ids, weights, counts, cursor, offsets, out[0], row_scale, out[1], out[2], s, TOP_K=k,
                           BLOCK=block, **pdl.launch_args(ids.device))
    return Grouping(offsets, out[0], row_scale, out[1], out[2])
