"""The Gluon wgmma NVFP4 kernel (quantbench/moe/nvfp4_wgmma.py) against the Triton one (nvfp4.py), on an H200 at
the Qwen3-30B-A3B shape: the same outputs, then time per projection as the engine calls them.

    python3 benchmarks/nvfp4_wgmma_gpu.py [--tokens 128,512,4096] [--skip-check] [--tiles 64x128x1,16x128x1]

1. Checks, outputs poisoned with NaN: each case through both kernels (gate_up with the token gather and SwiGLU,
   down with the routing weights and the scatter back to (token, slot) order; bf16 and fp16, 3 to 4,096 tokens,
   skewed routing, block scales down to E4M3's subnormals, every Gluon tile), against each other and against a
   float64 reference of the same NVFP4 weights (E2M1 value · block scale · global scale, unrounded).
2. do_bench medians per tile for each projection, against the Triton kernel's production configuration, with the
   ratio and the packed weights' bandwidth.
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
from moe_int4 import SHAPE  # noqa: E402

from quantbench.engine.moe import nvfp4, nvfp4_numbers, nvfp4_wgmma  # noqa: E402

S = SHAPE
GATE_UP, DOWN = (2 * S["inter"], S["hidden"]), (S["hidden"], S["inter"])
TILES = [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=bn, AHEAD=a) for bm in (16, 32, 64) for bn in (64, 128)
         for a in (1, 2)]


def inputs(proj: str, tokens: int, dtype: torch.dtype, skew: bool, seed: int, tiny: bool = False):
    """(weights, offsets, x, kwargs, float64 reference) for one projection as the engine calls it. tiny: weights
    so small that many block scales are E4M3 subnormals (below 2^-6)."""
    torch.manual_seed(seed)
    n, k = GATE_UP if proj == "gate_up" else DOWN
    w = torch.randn(S["experts"], n, k, device="cuda") * 0.02
    if tiny:
        w[:, ::3] *= 1e-3
    fmt = nvfp4.Nvfp4Experts.from_weights(w)
    offsets, x, x_sorted, kw = engine_inputs(proj, tokens, k, S, dtype, skew)

    def ref() -> torch.Tensor:  # E2M1 value · block scale · global scale, unrounded
        values = nvfp4_numbers.decode_e2m1(nvfp4_numbers.unpack_codes(fmt.packed), torch.float64)  # [E, N, K], exact
        scale = fmt.block_scale.double() * fmt.global_scale.double().unsqueeze(-1)
        dense = (values.unflatten(-1, (-1, 16)) * scale.unsqueeze(-1)).flatten(-2)
        return grouped_reference(x_sorted, dense, offsets, proj, kw)

    return fmt, offsets, x, kw, ref


def run(fmt, offsets, x, kw, cfg, poison: bool = False) -> torch.Tensor:
    """The projection through `cfg`'s kernel (the Gluon one on the codes repacked once, as Nvfp4Experts keeps
    them); poison: the Gluon kernel's output filled with NaN first (rows it leaves unwritten stay NaN)."""
    if cfg.get("KERNEL") != "gluon":
        return nvfp4.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale, offsets, cfg, **kw)
    if not hasattr(fmt, "repacked"):
        fmt.repacked = nvfp4_wgmma.repack(fmt.packed)
    if not poison:
        return nvfp4.nvfp4_grouped_mm(x, fmt.repacked, fmt.block_scale, fmt.global_scale, offsets, cfg,
                                      layout="wgmma", **kw)
    rows = kw["row_index"].shape[0] if "row_index" in kw else x.shape[0]
    n = fmt.out_features // 2 if kw.get("swiglu") else fmt.out_features
    y = torch.full((rows, n), float("nan"), dtype=x.dtype, device=x.device)
    nvfp4_wgmma.launch(x.contiguous(), fmt.repacked, fmt.block_scale, fmt.global_scale, y, offsets, cfg,
                       row_index=kw.get("row_index"), swiglu=kw.get("swiglu", False), row_scale=kw.get("row_scale"),
                       row_dest=kw.get("row_dest"))
    return y


def triton_config(proj: str, tokens: int) -> dict:
    n, k = GATE_UP if proj == "gate_up" else DOWN
    return nvfp4.pick_config(tokens * S["top_k"], S["experts"], n, k)  # no device: the Triton kernel's


def check(tiles: list[dict]) -> bool:
    cases = [  # projection, tokens, dtype, skewed routing, tiny weights, Gluon tile (None: pick_config's)
        ("gate_up", 512, torch.bfloat16, False, False, None),
        ("down", 512, torch.bfloat16, False, False, None),
        ("gate_up", 512, torch.float16, False, False, None),
        ("down", 512, torch.float16, False, True, None),
        ("gate_up", 512, torch.bfloat16, False, True, None),
        ("gate_up", 3, torch.bfloat16, False, False, None),
        ("down", 40, torch.bfloat16, True, False, None),
        ("gate_up", 4096, torch.bfloat16, True, False, None),
        ("down", 4096, torch.bfloat16, False, False, None),
    ] + [(p, 512, torch.bfloat16, False, False, t) for p in ("gate_up", "down") for t in tiles]
    ok_all = True
    print(HEADER)
    for i, (proj, tokens, dtype, skew, tiny, tile) in enumerate(cases):
        fmt, offsets, x, kw, ref = inputs(proj, tokens, dtype, skew, seed=i + 1, tiny=tiny)
        cfg = tile or nvfp4.pick_config(tokens * S["top_k"], S["experts"], fmt.out_features, fmt.in_features,
                                        x.device)
        torch.cuda.empty_cache()
        got = run(fmt, offsets, x, kw, cfg, poison=True)
        tri = run(fmt, offsets, x, kw, triton_config(proj, tokens))
        torch.cuda.synchronize()
        name = (f"{proj} {tokens} tok {str(dtype)[6:]} {'skew ' if skew else ''}{'tiny ' if tiny else ''}"
                f"{cfg.get('KERNEL')} M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} A{cfg.get('AHEAD', '-')}")
        ok_all &= judge(name, got, tri, ref())
    return ok_all


def bench(tokens: int, tiles: list[dict]) -> None:
    for proj in ("gate_up", "down"):
        fmt, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, seed=0)
        time_tiles(f"{proj} {tokens} tokens ({tokens * S['top_k'] / S['experts']:.0f} rows per expert)",
                   partial(run, fmt, offsets, x, kw), triton_config(proj, tokens), tiles, fmt.nbytes(),
                   "packed weights")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="128,512,4096")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--tiles", help="BLOCK_MxBLOCK_NxAHEAD[xWARPS],... (default: all of TILES)")
    args = ap.parse_args()
    tiles = parse_tiles(args.tiles, TILES)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    ok = True if args.skip_check else check(tiles)
    for t in (int(v) for v in args.tokens.split(",")):
        bench(t, tiles)
    print("checks:", "all OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
