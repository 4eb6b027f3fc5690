"""What int4_wgmma_gpu.py and nvfp4_wgmma_gpu.py share: judging a Gluon kernel's output against the Triton
kernel's and a float64 reference, and timing Gluon tiles against the Triton kernel's configuration."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch


def engine_inputs(proj: str, tokens: int, k: int, shape: dict, dtype: torch.dtype, skew: bool):
    """(offsets, x, x_sorted, kwargs) of one projection as the engine calls it: gate_up reads the unsorted tokens
    through the grouping's row index and applies SwiGLU; down takes the grouped rows, multiplies each by its
    routing weight and writes it back to (token, slot) order."""
    from moe_int4 import routed_offsets

    rows = tokens * shape["top_k"]
    offsets = routed_offsets(tokens, shape["experts"], shape["top_k"], "cuda", skew)
    if proj == "gate_up":
        x = torch.randn(tokens, k, device="cuda").to(dtype)
        kw = {"row_index": torch.randint(0, tokens, (rows,), device="cuda", dtype=torch.int32), "swiglu": True}
        return offsets, x, x[kw["row_index"].long()], kw
    x = torch.randn(rows, k, device="cuda").to(dtype)
    kw = {"row_scale": torch.rand(rows, device="cuda").to(dtype), "row_dest": torch.randperm(rows, device="cuda").int()}
    return offsets, x, x, kw


def grouped_reference(x_sorted: torch.Tensor, dense: torch.Tensor, offsets: torch.Tensor, proj: str,
                      kw: dict) -> torch.Tensor:
    """float64 x_sorted @ dense[e].T per expert's rows, then the projection's fused steps (engine_inputs)."""
    from moe_int4 import grouped_float64

    out = grouped_float64(x_sorted, dense, offsets)
    if proj == "gate_up":
        gate, up = out.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    out = out * kw["row_scale"].double()[:, None]
    return out[torch.argsort(kw["row_dest"].long())]  # row r of the result lands on row row_dest[r]


HEADER = f"{'case':60s} {'rows':>6s} {'differ':>8s} {'max diff':>9s} {'rel err':>8s} {'ref (triton)':>12s} unwritten"


def judge(name: str, got: torch.Tensor, tri: torch.Tensor, ref: torch.Tensor) -> bool:
    """Print one case: elements that differ from the Triton kernel's output, the largest difference, both relative
    errors against the float64 reference, rows left unwritten (NaN: the Gluon output was poisoned). OK: every row
    written, relative error under 1e-2 and no worse than the Triton kernel's (5% slack)."""
    differ = int((got != tri).sum())
    max_diff = float((got.float() - tri.float()).abs().max())
    rel = float((got.double() - ref).norm() / ref.norm())
    rel_tri = float((tri.double() - ref).norm() / ref.norm())
    unwritten = int(torch.isnan(got).any(dim=1).sum())
    ok = unwritten == 0 and rel < 1e-2 and rel <= 1.05 * rel_tri + 1e-6
    print(f"{name:60s} {got.shape[0]:6d} {differ:8d} {max_diff:9.2e} {rel:8.2e} {rel_tri:12.2e} {unwritten} "
          f"{'OK' if ok else 'FAIL'}", flush=True)
    return ok


def parse_tiles(spec: str | None, default: list[dict]) -> list[dict]:
    """--tiles "BLOCK_MxBLOCK_NxAHEAD[xWARPS],..." as Gluon configurations (none given: `default`)."""
    if not spec:
        return default
    tiles = []
    for t in spec.split(","):
        m, n, a, *w = (int(v) for v in t.split("x"))
        tiles.append(dict(KERNEL="gluon", BLOCK_M=m, BLOCK_N=n, AHEAD=a, **({"num_warps": w[0]} if w else {})))
    return tiles


def tile_name(tile: dict) -> str:
    return f"M{tile['BLOCK_M']:3d} N{tile['BLOCK_N']:3d} w{tile.get('num_warps', 4)} ahead {tile['AHEAD']}"


def time_tiles(title: str, call: Callable[[dict], object], base_cfg: dict, tiles: list[dict], nbytes: int,
               weights: str) -> None:
    """do_bench medians of call(config) for the Triton configuration and each Gluon tile, with the ratio and the
    weights' bandwidth."""
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    base = do_bench(partial(call, base_cfg), warmup=25, rep=100)
    print(f"{title}: Triton {base_cfg} {base * 1e3:.1f} us ({nbytes / base / 1e6:.0f} GB/s of {weights})", flush=True)
    for tile in tiles:
        try:
            ms = do_bench(partial(call, tile), warmup=25, rep=100)
        except Exception as e:  # a tile that does not compile or launch
            print(f"    gluon {tile_name(tile)}: {type(e).__name__}: {str(e)[:200]}")
            continue
        print(f"    gluon {tile_name(tile)}: {ms * 1e3:8.1f} us  {base / ms:5.2f}x Triton  {nbytes / ms / 1e6:6.0f} GB/s",
              flush=True)
