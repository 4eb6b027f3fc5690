"""Running GPU kernels' source under Triton's CPU interpreter (a fresh process: TRITON_INTERPRET is read when triton
is imported), and the check every grouped kernel's fused steps share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(code: str) -> None:
    """Run `code` in a fresh interpreter with TRITON_INTERPRET=1 from the repository root; it must print "ok"."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def check_fused_steps(grouped_mm, fmt) -> None:
    """The engine's fused steps against the unfused math on `fmt`'s dequantized weights (5 experts x [48, 64], one
    empty, one partial tile): gate_up with the token gather + SwiGLU, down with the routing weights + the scatter
    back to (token, slot) order, with the weights on the MMA's M side (SWAP_AB) and without.
    `grouped_mm(x, offsets, config, **fused_steps)` runs the format's kernel."""
    # lazy: the interpreted subprocess calls this, with TRITON_INTERPRET set; triton_common imports triton, which
    # reads it once, so the test process that imports this module must not import triton_common
    import torch

    from quantbench.engine.triton_common import expert_of_rows

    counts = torch.tensor([3, 0, 17, 1, 9])
    offsets = torch.cumsum(counts, 0, dtype=torch.int32)
    s, t = int(counts.sum()), 11
    w = fmt.dequantize(torch.bfloat16).float()[expert_of_rows(offsets, s)]
    x, h = torch.randn(t, 64).bfloat16(), torch.randn(s, 64).bfloat16()
    row_index, rs = torch.randint(0, t, (s,), dtype=torch.int32), torch.rand(s).bfloat16()
    dest = torch.randperm(s).int()
    g, u = torch.einsum("sk,snk->sn", x.float()[row_index.long()], w).chunk(2, -1)
    want_h = torch.nn.functional.silu(g) * u
    want_y = torch.empty(s, 48)
    want_y[dest.long()] = torch.einsum("sk,snk->sn", h.float(), w) * rs.float()[:, None]
    for swap in (False, True):
        cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SWAP_AB": swap}
        got_h = grouped_mm(x, offsets, cfg, row_index=row_index, swiglu=True)
        got_y = grouped_mm(h, offsets, cfg, row_scale=rs, row_dest=dest)
        for got, want in ((got_h, want_h), (got_y, want_y)):
            err = ((got.float() - want).norm() / want.norm()).item()
            assert got.shape == want.shape and err < 6e-3, (swap, err)
