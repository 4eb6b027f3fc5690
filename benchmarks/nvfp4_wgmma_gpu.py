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

from moe_int4 import SHAPE, routed_offsets  # noqa: E402

from quantbench.moe import nvfp4, nvfp4_wgmma  # noqa: E402

S = SHAPE
GATE_UP, DOWN = (2 * S["inter"], S["hidden"]), (S["hidden"], S["inter"])
TILES = [dict(KERNEL="gluon", BLOCK_M=bm, BLOCK_N=bn, AHEAD=a) for bm in (16, 32, 64) for bn in (64, 128)
         for a in (1, 2)]


def inputs(proj: str, tokens: int, dtype: torch.dtype, skew: bool, seed: int, tiny: bool = False):
    """(weights, offsets, x, kwargs, float64 reference) for one projection as the engine calls it. tiny: weights
    so small that many block scales are E4M3 subnormals (below 2^-6)."""
    torch.manual_seed(seed)
    n, k = GATE_UP if proj == "gate_up" else DOWN
    rows = tokens * S["top_k"]
    w = torch.randn(S["experts"], n, k, device="cuda") * 0.02
    if tiny:
        w[:, ::3] *= 1e-3
    fmt = nvfp4.Nvfp4Experts.from_weights(w)
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
        values = nvfp4.decode_e2m1(nvfp4.unpack_codes(fmt.packed), torch.float64)  # [E, N, K], exact
        scale = fmt.block_scale.double() * fmt.global_scale.double().unsqueeze(-1)
        dense = (values.unflatten(-1, (-1, 16)) * scale.unsqueeze(-1)).flatten(-2)
        out = torch.zeros(rows, n, dtype=torch.float64, device="cuda")
        start = 0
        for e, end in enumerate(offsets.tolist()):
            if end > start:
                out[start:end] = x_sorted[start:end].double() @ dense[e].T
            start = end
        if proj == "gate_up":
            gate, up = out.chunk(2, dim=-1)
            return torch.nn.functional.silu(gate) * up
        out = out * kw["row_scale"].double()[:, None]
        return out[torch.argsort(kw["row_dest"].long())]  # row r of the result lands on row row_dest[r]

    return fmt, offsets, x, kw, ref


def run(fmt, offsets, x, kw, cfg, poison: bool = False) -> torch.Tensor:
    """The projection through `cfg`'s kernel; poison: the Gluon kernel's output filled with NaN first (rows it
    leaves unwritten stay NaN)."""
    if not (poison and cfg.get("KERNEL") == "gluon"):
        return nvfp4.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale, offsets, cfg, **kw)
    rows = kw["row_index"].shape[0] if "row_index" in kw else x.shape[0]
    n = fmt.out_features // 2 if kw.get("swiglu") else fmt.out_features
    y = torch.full((rows, n), float("nan"), dtype=x.dtype, device=x.device)
    nvfp4_wgmma.launch(x.contiguous(), fmt.packed, fmt.block_scale, fmt.global_scale, y, offsets, cfg,
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
    print(f"{'case':60s} {'rows':>6s} {'differ':>8s} {'max diff':>9s} {'rel err':>8s} {'ref (triton)':>12s} unwritten")
    for i, (proj, tokens, dtype, skew, tiny, tile) in enumerate(cases):
        fmt, offsets, x, kw, ref = inputs(proj, tokens, dtype, skew, seed=i + 1, tiny=tiny)
        n, k = fmt.out_features, fmt.in_features
        cfg = tile or nvfp4.pick_config(tokens * S["top_k"], S["experts"], n, k, x.device)
        torch.cuda.empty_cache()
        got = run(fmt, offsets, x, kw, cfg, poison=True)
        tri = run(fmt, offsets, x, kw, triton_config(proj, tokens))
        torch.cuda.synchronize()
        r = ref()
        differ = int((got != tri).sum())
        max_diff = float((got.float() - tri.float()).abs().max())
        rel = float((got.double() - r).norm() / r.norm())
        rel_tri = float((tri.double() - r).norm() / r.norm())
        unwritten = int(torch.isnan(got).any(dim=1).sum())
        ok = unwritten == 0 and rel < 1e-2 and rel <= 1.05 * rel_tri + 1e-6
        ok_all &= ok
        name = (f"{proj} {tokens} tok {str(dtype)[6:]} {'skew ' if skew else ''}{'tiny ' if tiny else ''}"
                f"{cfg.get('KERNEL')} M{cfg['BLOCK_M']} N{cfg['BLOCK_N']} A{cfg.get('AHEAD', '-')}")
        print(f"{name:60s} {got.shape[0]:6d} {differ:8d} {max_diff:9.2e} {rel:8.2e} {rel_tri:12.2e} {unwritten} "
              f"{'OK' if ok else 'FAIL'}", flush=True)
    return ok_all


def bench(tokens: int, tiles: list[dict]) -> None:
    from triton.testing import do_bench

    for proj in ("gate_up", "down"):
        fmt, offsets, x, kw, _ = inputs(proj, tokens, torch.bfloat16, False, seed=0)
        call = partial(run, fmt, offsets, x, kw)
        base_cfg = triton_config(proj, tokens)
        base = do_bench(partial(call, base_cfg), warmup=25, rep=100)
        nbytes = fmt.nbytes()
        print(f"{proj} {tokens} tokens ({tokens * S['top_k'] / S['experts']:.0f} rows per expert): Triton "
              f"{base * 1e3:.1f} us ({nbytes / base / 1e6:.0f} GB/s of packed weights)", flush=True)
        for tile in tiles:
            try:
                ms = do_bench(partial(call, tile), warmup=25, rep=100)
            except Exception as e:  # a tile that does not compile or launch
                print(f"    gluon M{tile['BLOCK_M']} N{tile['BLOCK_N']} A{tile['AHEAD']}: {type(e).__name__}: "
                      f"{str(e)[:200]}")
                continue
            print(f"    gluon M{tile['BLOCK_M']:3d} N{tile['BLOCK_N']:3d} ahead {tile['AHEAD']}: {ms * 1e3:8.1f} us  "
                  f"{base / ms:5.2f}x Triton  {nbytes / ms / 1e6:6.0f} GB/s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="128,512,4096")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--tiles", help="BLOCK_MxBLOCK_NxAHEAD,... (default: all of TILES)")
    args = ap.parse_args()
    tiles = TILES if not args.tiles else [
        dict(KERNEL="gluon", BLOCK_M=int(m), BLOCK_N=int(n), AHEAD=int(a))
        for m, n, a in (t.split("x") for t in args.tiles.split(","))]
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    ok = True if args.skip_check else check(tiles)
    for t in (int(v) for v in args.tokens.split(",")):
        bench(t, tiles)
    print("checks:", "all OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
