"""The INT4 gate_up projection at many rows per expert: the Gluon kernel against dequantize + torch._grouped_mm (a
BF16 copy of every expert, then CUTLASS's grouped GEMM), which the engine takes from DEQUANT_FROM_ROWS rows per
expert (quantbench.engine.moe.int4_kernels). Batched passes of 16, 32 and 64 decisions of 512 tokens route 512,
1,024 and 2,048 rows to each of the 128 experts (uniform routing, as the threshold was first measured).

    python3 benchmarks/dequant_threshold.py [--tokens 8192,16384,32768]

Prints µs per call (triton do_bench medians) and the ratio; the outputs of the two paths are compared (relative
difference: the Gluon kernel's weights are (q − z)·s rounded once, as dequantize() writes them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe.align import group_by_expert  # noqa: E402
from quantbench.engine.moe.engine import _grouped_matmul  # noqa: E402
from quantbench.engine.moe.int4 import rtn_experts  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm, pick_config  # noqa: E402

E, H, INTER, TOP_K = 128, 2048, 768, 8


def main() -> int:
    from triton.testing import do_bench

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="8192,16384,32768")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    gu = rtn_experts(torch.randn(E, 2 * INTER, H, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02)
    print(f"{'tokens':>7} {'rows/expert':>11} {'gluon µs':>10} {'dequant+grouped_mm µs':>22} {'ratio':>6} {'rel diff':>9}")
    with torch.inference_mode():
        for tokens in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(tokens, H, device="cuda", generator=gen, dtype=torch.bfloat16)
            index = torch.rand(tokens, E, device="cuda", generator=gen).topk(TOP_K, dim=-1).indices
            g = group_by_expert(index, torch.rand(tokens, TOP_K, device="cuda", generator=gen).bfloat16(), E)
            rows = g.row_token.shape[0]
            cfg = pick_config(rows, E, 2 * INTER, H, 128, True, x.device)

            def gluon(x=x, g=g, cfg=cfg):
                return int4_grouped_mm(x, gu.qweight, gu.scales, gu.zeros, g.offsets, 128, cfg,
                                       row_index=g.row_token, swiglu=True)

            def dequant(x=x, g=g):
                a, b = _grouped_matmul(x[g.row_token.long()], gu.dequantize(torch.bfloat16).transpose(-2, -1),
                                       g.offsets).chunk(2, -1)
                return torch.nn.functional.silu(a) * b

            diff = float((gluon().float() - dequant().float()).norm() / dequant().float().norm())
            t_g, t_d = (do_bench(f, warmup=10, rep=100, return_mode="median") * 1e3 for f in (gluon, dequant))
            print(f"{tokens:7d} {rows // E:11d} {t_g:10.1f} {t_d:22.1f} {t_d / t_g:6.2f} {diff:9.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
