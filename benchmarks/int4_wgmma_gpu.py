"""The Gluon wgmma INT4 kernel (quantbench/moe/int4_wgmma.py) against the Triton one (int4.py), on an H200 at the
Qwen3-30B-A3B shape: the same outputs, then time per projection as the engine calls them.

    python3 benchmarks/int4_wgmma_gpu.py [--tokens 512,4096,16384] [--skip-check] [--tiles 64x128x2,16x128x2]
    ncu --clock-control none -k regex:int4_wgmma -c 2 --section SpeedOfLight --section WarpStateStats \\
        --section Occupancy --section MemoryWorkloadAnalysis python3 benchmarks/int4_wgmma_gpu.py --profile

1. Checks, outputs poisoned with NaN: each case through both kernels (gate_up with the token gather and SwiGLU,
   down with the routing weights and the scatter back to (token, slot) order; symmetric and asymmetric zero
   points, bf16 and fp16, 3 to 4,096 tokens, skewed routing, every Gluon tile), against each other (elements that
   differ, largest difference) and against a float64 reference of the same int4 weights (relative error).
2. do_bench medians per tile for each projection, against the Triton kernel's production configuration, with
   the ratio and the int4 weights' bandwidth.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gluon_vs_triton import HEADER, engine_inputs, grouped_reference, judge, parse_tiles, time_tiles  # noqa: E402
from moe_int4 import SHAPE, random_int4  # noqa: E402

from quantbench.engine.moe.int4_kernels import int4_grouped_mm, pick_config  # noqa: E402

S = SHAPE
GATE_UP, DOWN = (2 * S["inter"], S["hidden"]), (S["hidden"], S["inter"])
# BLOCK_M tokens x BLOCK_N weight rows, AHEAD blocks copied ahead; 8 warps: two warpgroups over the weight rows
TILES = [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=bn, AHEAD=a) for bm in (16, 32, 64) for bn in (64, 128)
         for a in (1, 2)] + [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=256, num_warps=8, AHEAD=2) for bm in (32, 64)]


def inputs(proj: str, tokens: int, dtype: torch.dtype, skew: bool, asym: bool, seed: int):
    """(weights, offsets, x, kwargs, dense-reference) for one projection as the engine calls it."""
    torch.manual_seed(seed)
    n, k = GATE_UP if proj == "gate_up" else DOWN
    w = random_int4(S["experts"], n, k, S["group"], "cuda", sym=not asym)
    offsets, x, x_sorted, kw = engine_inputs(proj, tokens, k, S, dtype, skew)

    def ref() -> torch.Tensor:  # int4.dequantize's torch unpacking: independent of the kernels
        return grouped_reference(x_sorted, w.dequantize(torch.float64, use_triton=False), offsets, proj, kw)

    return w, offsets, x, kw, ref


def run(w, offsets, x, kw, cfg, out_cols: int) -> torch.Tensor:
    rows = kw["row_index"].shape[0] if "row_index" in kw else x.shape[0]
    out = torch.full((rows, out_cols), float("nan"), dtype=x.dtype, device="cuda")
    return int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, S["group"], cfg, out=out, **kw)


def triton_config(proj: str, tokens: int) -> dict:
    n, k = GATE_UP if proj == "gate_up" else DOWN
    return pick_config(tokens * S["top_k"], S["experts"], n, k, S["group"], proj == "gate_up")  # no device: Triton's


def check(tiles: list[dict]) -> bool:
    cases = [  # projection, tokens, dtype, skewed routing, asymmetric zero points, Gluon tile
        ("gate_up", 512, torch.bfloat16, False, False, None),
        ("down", 512, torch.bfloat16, False, False, None),
        ("gate_up", 512, torch.bfloat16, False, True, None),
        ("down", 512, torch.float16, False, True, None),
        ("gate_up", 3, torch.bfloat16, False, False, None),
        ("down", 40, torch.bfloat16, True, False, None),
        ("gate_up", 4096, torch.bfloat16, False, True, None),
        ("down", 4096, torch.bfloat16, True, False, None),
    ] + [(p, 512, torch.bfloat16, False, True, t) for p in ("gate_up", "down") for t in tiles]
    ok_all = True
    print(HEADER)
    for i, (proj, tokens, dtype, skew, asym, tile) in enumerate(cases):
        w, offsets, x, kw, ref = inputs(proj, tokens, dtype, skew, asym, seed=i + 1)
        cols = w.out_features // 2 if proj == "gate_up" else w.out_features
        cfg = tile or pick_config(tokens * S["top_k"], S["experts"], w.out_features, w.in_features, S["group"],
                                  proj == "gate_up", x.device)
        got = run(w, offsets, x, kw, cfg, cols)
        tri = run(w, offsets, x, kw, triton_config(proj, tokens), cols)
        torch.cuda.synchronize()
        name = (f"{proj} {tokens} tok {str(dtype)[6:]} {'skew ' if skew else ''}{'asym ' if asym else 'sym '}"
                f"{cfg.get('KERNEL')} M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} A{cfg.get('AHEAD', '-')}")
        ok_all &= judge(name, got, tri, ref())
    return ok_all


def profile(tokens: int) -> None:
    """Each projection once through the production choice (pick_config on this GPU), for ncu."""
    for proj in ("gate_up", "down"):
        w, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, False, seed=0)
        cfg = pick_config(tokens * S["top_k"], S["experts"], w.out_features, w.in_features, S["group"],
                          proj == "gate_up", x.device)
        print(proj, cfg, flush=True)
        int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, S["group"], cfg, **kw)
    torch.cuda.synchronize()


def bench(tokens: int, tiles: list[dict]) -> None:
    for proj in ("gate_up", "down"):
        w, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, False, seed=0)
        cols = w.out_features // 2 if proj == "gate_up" else w.out_features
        out = torch.empty(kw["row_index"].shape[0] if "row_index" in kw else x.shape[0], cols, dtype=x.dtype,
                          device="cuda")
        call = partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, S["group"], out=out, **kw)
        time_tiles(f"{proj} {tokens} tokens ({tokens * S['top_k'] / S['experts']:.0f} rows per expert)", call,
                   triton_config(proj, tokens), tiles, w.nbytes(), "int4 weights")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one call per projection at the first --tokens (for ncu)")
    ap.add_argument("--tiles", help="BLOCK_MxBLOCK_NxAHEAD[xWARPS],... (default: all of TILES)")
    args = ap.parse_args()
    tiles = parse_tiles(args.tiles, TILES)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if args.profile:
        return profile(int(args.tokens.split(",")[0]))
    ok = True if args.skip_check else check(tiles)
    for t in (int(v) for v in args.tokens.split(",")):
        bench(t, tiles)
    print("checks:", "all OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
