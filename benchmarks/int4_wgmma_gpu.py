"""The Gluon wgmma INT4 kernel (quantbench/moe/int4_wgmma.py) against the Triton one (int4.py), on an H200 at the
Qwen3-30B-A3B shape: the same outputs, then time per projection as the engine calls them.

    python3 benchmarks/int4_wgmma_gpu.py [--tokens 512,4096,16384] [--skip-check]
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

from moe_int4 import SHAPE, random_int4, reference, routed_offsets  # noqa: E402

from quantbench.moe.int4 import int4_grouped_mm, pick_config  # noqa: E402

S = SHAPE
GATE_UP, DOWN = (2 * S["inter"], S["hidden"]), (S["hidden"], S["inter"])
# BLOCK_M tokens x BLOCK_N weight rows, AHEAD blocks copied ahead; 8 warps: two warpgroups over the weight rows
TILES = [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=bn, AHEAD=a) for bm in (16, 32, 64) for bn in (64, 128)
         for a in (1, 2)] + [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=256, num_warps=8, AHEAD=2) for bm in (32, 64)]


def inputs(proj: str, tokens: int, dtype: torch.dtype, skew: bool, asym: bool, seed: int):
    """(weights, offsets, x, kwargs, dense-reference) for one projection as the engine calls it."""
    torch.manual_seed(seed)
    n, k = GATE_UP if proj == "gate_up" else DOWN
    rows = tokens * S["top_k"]
    w = random_int4(S["experts"], n, k, S["group"], "cuda", sym=not asym)
    offsets = routed_offsets(tokens, S["experts"], S["top_k"], "cuda", skew)
    if proj == "gate_up":  # the unsorted tokens, read through the sort's row index
        x = torch.randn(tokens, k, device="cuda").to(dtype)
        kw = {"row_index": torch.randint(0, tokens, (rows,), device="cuda", dtype=torch.int32), "swiglu": True}
        x_sorted = x[kw["row_index"].long()]
    else:
        x = x_sorted = torch.randn(rows, k, device="cuda").to(dtype)
        kw = {"row_scale": torch.rand(rows, device="cuda").to(dtype),
              "row_dest": torch.randperm(rows, device="cuda").int()}

    def ref() -> torch.Tensor:
        out = reference(x_sorted, w, offsets)
        if proj == "gate_up":
            gate, up = out.chunk(2, dim=-1)
            return torch.nn.functional.silu(gate) * up
        out = out * kw["row_scale"].double()[:, None]
        return out[torch.argsort(kw["row_dest"].long())]  # row r of the result lands on row row_dest[r]

    return w, offsets, x, kw, ref


def run(w, offsets, x, kw, cfg, out_cols: int) -> torch.Tensor:
    rows = kw["row_index"].shape[0] if "row_index" in kw else x.shape[0]
    out = torch.full((rows, out_cols), float("nan"), dtype=x.dtype, device="cuda")
    return int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, S["group"], cfg, out=out, **kw)


def triton_config(proj: str, tokens: int) -> dict:
    n, k = GATE_UP if proj == "gate_up" else DOWN
    return pick_config(tokens * S["top_k"], S["experts"], n, k, S["group"], proj == "gate_up")  # no device: Triton's


def check() -> bool:
    cases = [  # projection, tokens, dtype, skewed routing, asymmetric zero points, Gluon tile
        ("gate_up", 512, torch.bfloat16, False, False, None),
        ("down", 512, torch.bfloat16, False, False, None),
        ("gate_up", 512, torch.bfloat16, False, True, None),
        ("down", 512, torch.float16, False, True, None),
        ("gate_up", 3, torch.bfloat16, False, False, None),
        ("down", 40, torch.bfloat16, True, False, None),
        ("gate_up", 4096, torch.bfloat16, False, True, None),
        ("down", 4096, torch.bfloat16, True, False, None),
    ] + [(p, 512, torch.bfloat16, False, True, t) for p in ("gate_up", "down") for t in TILES]
    ok_all = True
    print(f"{'case':58s} {'rows':>6s} {'differ':>8s} {'max diff':>9s} {'rel err':>8s} {'ref (triton)':>12s} unwritten")
    for i, (proj, tokens, dtype, skew, asym, tile) in enumerate(cases):
        w, offsets, x, kw, ref = inputs(proj, tokens, dtype, skew, asym, seed=i + 1)
        cols = w.out_features // 2 if proj == "gate_up" else w.out_features
        cfg = tile or pick_config(tokens * S["top_k"], S["experts"], w.out_features, w.in_features, S["group"],
                                  proj == "gate_up", x.device)
        got = run(w, offsets, x, kw, cfg, cols)
        tri = run(w, offsets, x, kw, triton_config(proj, tokens), cols)
        torch.cuda.synchronize()
        r = ref()
        differ = int((got != tri).sum())
        max_diff = float((got.float() - tri.float()).abs().max())
        rel = float((got.double() - r).norm() / r.norm())
        rel_tri = float((tri.double() - r).norm() / r.norm())
        unwritten = int(torch.isnan(got).any(dim=1).sum())
        ok = unwritten == 0 and rel < 1e-2 and rel <= 1.05 * rel_tri + 1e-6
        ok_all &= ok
        name = (f"{proj} {tokens} tok {str(dtype)[6:]} {'skew ' if skew else ''}{'asym ' if asym else 'sym '}"
                f"{cfg.get('KERNEL')} M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} A{cfg.get('AHEAD', '-')}")
        print(f"{name:58s} {got.shape[0]:6d} {differ:8d} {max_diff:9.2e} {rel:8.2e} {rel_tri:12.2e} {unwritten} "
              f"{'OK' if ok else 'FAIL'}", flush=True)
    return ok_all


def tile_name(tile: dict) -> str:
    return f"M{tile['BLOCK_M']:3d} N{tile['BLOCK_N']:3d} w{tile.get('num_warps', 4)} ahead {tile['AHEAD']}"


def profile(tokens: int) -> None:
    """Each projection once through the production choice (pick_config on this GPU), for ncu."""
    for proj in ("gate_up", "down"):
        w, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, False, seed=0)
        cfg = pick_config(tokens * S["top_k"], S["experts"], w.out_features, w.in_features, S["group"],
                          proj == "gate_up", x.device)
        print(proj, cfg, flush=True)
        int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, S["group"], cfg, **kw)
    torch.cuda.synchronize()


def bench(tokens: int) -> None:
    from triton.testing import do_bench

    for proj in ("gate_up", "down"):
        w, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, False, seed=0)
        cols = w.out_features // 2 if proj == "gate_up" else w.out_features
        out = torch.empty(kw["row_index"].shape[0] if "row_index" in kw else x.shape[0], cols, dtype=x.dtype,
                          device="cuda")
        base_cfg = triton_config(proj, tokens)
        call = partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, S["group"], out=out, **kw)
        base = do_bench(partial(call, base_cfg), warmup=25, rep=100)
        nbytes = w.nbytes()
        print(f"{proj} {tokens} tokens ({tokens * S['top_k'] / S['experts']:.0f} rows per expert): Triton "
              f"{base_cfg} {base * 1e3:.1f} us ({nbytes / base / 1e6:.0f} GB/s of int4 weights)", flush=True)
        for tile in TILES:
            try:
                ms = do_bench(partial(call, tile), warmup=25, rep=100)
            except Exception as e:  # a tile that does not compile or launch
                print(f"    gluon {tile_name(tile)}: {type(e).__name__}: {str(e)[:200]}")
                continue
            print(f"    gluon {tile_name(tile)}: {ms * 1e3:8.1f} us  "
                  f"{base / ms:5.2f}x Triton  {nbytes / ms / 1e6:6.0f} GB/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--profile", action="store_true", help="one call per projection at the first --tokens (for ncu)")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if args.profile:
        return profile(int(args.tokens.split(",")[0]))
    ok = True if args.skip_check else check()
    for t in (int(v) for v in args.tokens.split(",")):
        bench(t)
    print("checks:", "all OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
