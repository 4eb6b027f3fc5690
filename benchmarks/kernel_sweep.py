"""Block sizes and MMA kinds of the fused int4, FP8 and NVFP4 grouped-MoE kernels, against dequantize + torch._grouped_mm
and BF16 torch._grouped_mm, on the H200 at the Qwen3-30B-A3B shape: which path and configuration the engine should
pick per rows-per-expert bucket (TUNED in quantbench.engine.moe.int4_kernels and .fp8, pick_config in .nvfp4).

    python3 benchmarks/kernel_sweep.py --tokens 512,4096,16384 [--formats int4,fp8,nvfp4,fp8codes] [--top 5] [--fine | --near]

Each projection as the engine calls it: gate_up with the token gather and SwiGLU fused, down with the routing
weights and the scatter back to (token, slot) order. Times are triton do_bench medians; "rel diff" is the largest
difference from the format's default configuration, over the largest output. `fp8codes`: the FP8 kernels with
E4M3 codes between them (the tokens rounded once by `fp8_codes`, timed with gate_up; gate_up writing h as codes;
down reading them), as the engine runs FP8 with one input scale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe import fp8, nvfp4  # noqa: E402
from quantbench.engine.moe.engine import _grouped_matmul  # noqa: E402
from quantbench.engine.moe.int4 import rtn_experts  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm  # noqa: E402

E, H, INTER, TOP_K = 128, 2048, 768, 8


def grid(fmt: str, fine: bool | str = False) -> list[dict]:
    """Weights on the MMA's M side (SWAP_AB, Hopper wgmma) and the plain orientation (tokens as M: mma.sync below
    64 rows), over tile sizes, warps and pipeline stages; the ones that spill or overflow shared memory just lose.
    fine (FP8): deeper pipelines and K tiles of 256 around the configurations that won at ~32 rows per expert;
    "near": the tuned tiles of both buckets with their neighbours."""
    if fmt == "nvfp4":  # a few tiles: the earlier kernel's best (plain M64 N128, 8 warps) and the weights-as-M ones
        return [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SWAP_AB=swap, BLOCK_K=128)
                for swap, bm, bn, w, st in ((False, 64, 128, 8, 3), (False, 64, 64, 4, 3), (False, 128, 128, 8, 3),
                                            (True, 64, 64, 4, 3), (True, 32, 64, 4, 3), (True, 64, 64, 4, 2),
                                            (True, 64, 128, 8, 3))]
    if fine == "near" and fmt == "fp8":  # the tuned tiles of both buckets and their neighbours (stages, K, N)
        out = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, SWAP_AB=swap, BLOCK_K=bk)
               for swap, bm, bn, w in ((True, 32, 64, 4), (True, 32, 128, 4), (True, 64, 128, 8),
                                       (False, 128, 128, 8), (False, 128, 256, 8), (False, 64, 256, 8))
               for st in (3, 4) for bk in (128,)]
        return out + [dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=st, SWAP_AB=False, BLOCK_K=256)
                      for st in (2, 3)]
    if fine and fmt == "fp8":
        out = [dict(BLOCK_M=32, BLOCK_N=bn, num_warps=w, num_stages=st, SWAP_AB=True, BLOCK_K=bk)
               for bk in (128, 256) for st in (3, 5) for bn, w in ((64, 4), (128, 4), (128, 8))]
        return out + [dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=st, SWAP_AB=swap, BLOCK_K=bk)
                      for bk in (128, 256) for st in (3, 5) for swap in (True, False)]
    out = []
    for swap in (True, False):
        for bm in (16, 32, 64, 128):
            for bn, warps in ((64, 4), (128, 4), (128, 8)):
                if bm * bn > 128 * 128 or (bm == 128 and warps == 4) or (swap and bm == 128 and bn == 128):
                    continue
                for stages in (3, 4) if bm <= 32 else (2, 3):
                    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, SWAP_AB=swap)
                    if fmt == "fp8":
                        cfg["BLOCK_K"] = 128
                    out.append(cfg)
    return out


def sweep(fmt: str, tokens: int, top: int, fine: bool | str = False) -> None:
    codes = fmt == "fp8codes"
    fmt = "fp8" if codes else fmt
    torch.manual_seed(0)
    rows = tokens * TOP_K
    ids = torch.rand(tokens, E, device="cuda").topk(TOP_K, dim=-1).indices.flatten()
    order = torch.sort(ids).indices
    row_index = (order // TOP_K).int()
    row_dest = torch.empty(rows, device="cuda", dtype=torch.int32)
    row_dest[order] = torch.arange(rows, device="cuda", dtype=torch.int32)
    offsets = torch.cumsum(torch.bincount(ids, minlength=E), 0).to(torch.int32)
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(rows, INTER, device="cuda", dtype=torch.bfloat16)
    scale = torch.rand(rows, device="cuda", dtype=torch.bfloat16)
    w_gu = torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16) * 0.02
    w_dn = torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16) * 0.02
    if fmt == "int4":
        gu, dn = rtn_experts(w_gu), rtn_experts(w_dn)

        def call_gu(cfg):
            return int4_grouped_mm(x, gu.qweight, gu.scales, gu.zeros, offsets, 128, cfg, row_index=row_index,
                                   swiglu=True)

        def call_dn(cfg):
            return int4_grouped_mm(h, dn.qweight, dn.scales, dn.zeros, offsets, 128, cfg, row_scale=scale,
                                   row_dest=row_dest)
    elif fmt == "nvfp4":  # W4A16 here: the kernel alone (the W4A4 activation rounding is a separate kernel)
        gu, dn = nvfp4.Nvfp4Experts.from_weights(w_gu), nvfp4.Nvfp4Experts.from_weights(w_dn)

        def call_gu(cfg):
            return nvfp4.nvfp4_grouped_mm(x, gu.packed, gu.block_scale, gu.global_scale, offsets, cfg,
                                          row_index=row_index, swiglu=True)

        def call_dn(cfg):
            return nvfp4.nvfp4_grouped_mm(h, dn.packed, dn.block_scale, dn.global_scale, offsets, cfg,
                                          row_scale=scale, row_dest=row_dest)
    else:
        in_gu, in_dn = (x.abs().amax().float() / 448).reshape(1), (h.abs().amax().float() / 448).reshape(1)
        gu, dn = (fp8.Fp8Experts.from_weights(w, input_scale=s) for w, s in ((w_gu, in_gu), (w_dn, in_dn)))

        h_in = fp8.fp8_codes(h, in_dn) if codes else h

        def call_gu(cfg):
            x_in = fp8.fp8_codes(x, in_gu) if codes else x
            return fp8.fp8_grouped_mm(x_in, gu.weight, gu.scale, offsets, input_scale=gu.input_scale, config=cfg,
                                      row_index=row_index, swiglu=True, out_scale=in_dn if codes else None)

        def call_dn(cfg):
            return fp8.fp8_grouped_mm(h_in, dn.weight, dn.scale, offsets, input_scale=dn.input_scale, config=cfg,
                                      row_scale=scale, row_dest=row_dest)
    del w_gu, w_dn

    def dequant_gate_up():
        g, u = _grouped_matmul(x[row_index], gu.dequantize(torch.bfloat16).transpose(-2, -1), offsets).chunk(2, -1)
        return torch.nn.functional.silu(g) * u

    def dequant_down():  # row r goes to row row_dest[r]
        y = _grouped_matmul(h, dn.dequantize(torch.bfloat16).transpose(-2, -1), offsets) * scale[:, None]
        return y.index_select(0, torch.argsort(row_dest))

    name = "fp8codes" if codes else fmt
    print(f"# {name}, {tokens} tokens, {rows / E:.0f} rows per expert", flush=True)
    measure(fmt, f"{name} {tokens:6d} gate_up ", call_gu, dequant_gate_up, gu, x[row_index], offsets, top, fine)
    measure(fmt, f"{name} {tokens:6d} down    ", call_dn, dequant_down, dn, h, offsets, top, fine)


def measure(fmt: str, label: str, call, dequant, w, x_sorted, offsets, top: int, fine: bool | str) -> None:
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    ref = call(None).float()
    results = []
    for cfg in grid(fmt, fine):
        try:
            err = float((call(cfg).float() - ref).abs().max() / ref.abs().max())
            results.append((do_bench(lambda c=cfg: call(c), warmup=10, rep=50) * 1e3, err, cfg))
        except Exception as exc:  # a configuration that does not compile or fit is reported, the rest still run
            print(f"  {label} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    for us, err, cfg in sorted(results, key=lambda r: r[0])[:top]:
        print(f"{label} fused {us:8.1f} us  rel diff {err:.1e}  {cfg}", flush=True)
    print(f"{label} fused {do_bench(lambda: call(None), warmup=10, rep=50) * 1e3:8.1f} us  (default configuration)")
    print(f"{label} dequantize + grouped_mm {do_bench(dequant, warmup=10, rep=50) * 1e3:8.1f} us", flush=True)
    wb = w.dequantize(torch.bfloat16).transpose(-2, -1)
    bf16 = do_bench(lambda: _grouped_matmul(x_sorted, wb, offsets), warmup=10, rep=50) * 1e3
    print(f"{label} bf16 grouped_mm, weights already bf16 {bf16:8.1f} us", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=lambda v: [int(t) for t in v.split(",")], default=[512])
    ap.add_argument("--formats", type=lambda v: v.split(","), default=["int4", "fp8"])
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--fine", action="store_true", help="FP8: the finer grid around the mid-bucket winners")
    ap.add_argument("--near", action="store_true", help="FP8: only the tuned tiles of both buckets and neighbours")
    args = ap.parse_args()
    for tokens in args.tokens:
        for fmt in args.formats:
            sweep(fmt, tokens, args.top, "near" if args.near else args.fine)


if __name__ == "__main__":
    main()
