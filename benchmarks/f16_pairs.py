"""The INT4 Gluon kernel's fp16 two-nibble unpacking (int4_wgmma.F16_PAIRS) against its unpacking today, on an H200
at the Qwen3-30B-A3B shape: the same weights and routing through the committed tile with bf16 tokens, fp16 tokens,
and fp16 tokens with F16_PAIRS; outputs compared bit for bit (F16_PAIRS must equal the fp16 path) and against a
float64 reference of the int4 weights, then do_bench medians.

    python3 benchmarks/f16_pairs.py [--tokens 512,4096]

Why: ncu (docs/BENCHMARKS.md, fifteenth session) found the kernel bound by issuing its unpacking; fp16 holds two
nibbles a half-word, so four of a word's eight slices need no shift (the K loop: 390 SASS instructions a block
instead of 420, benchmarks/compile_sm90.py). Not wired into the engine: a bf16 model's tokens would have to be
written in fp16 first.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from int4_wgmma_gpu import S, inputs, run  # noqa: E402

from quantbench.engine.moe.int4_kernels import int4_grouped_mm, pick_config  # noqa: E402


def case(proj: str, tokens: int, skew: bool) -> list[str]:
    from triton.testing import do_bench  # lazy: GPU only

    rows_out = []
    outs = {}
    for dtype, pairs in ((torch.bfloat16, False), (torch.float16, False), (torch.float16, True)):
        w, offsets, x, kw, ref = inputs(proj, tokens, dtype, skew, True, seed=7)
        cols = w.out_features // 2 if proj == "gate_up" else w.out_features
        cfg = pick_config(tokens * S["top_k"], S["experts"], w.out_features, w.in_features, S["group"],
                          proj == "gate_up", x.device)
        cfg = dict(cfg, F16_PAIRS=pairs)
        got = run(w, offsets, x, kw, cfg, cols)
        torch.cuda.synchronize()
        r = ref()
        rel = float((got.double() - r).norm() / r.norm())
        out = torch.empty_like(got)
        ms = do_bench(partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, S["group"], cfg, out=out,
                              **kw), warmup=25, rep=200)
        name = f"{str(dtype)[6:]}{' +F16_PAIRS' if pairs else ''}"
        outs[name] = got
        rows_out.append((name, ms * 1e3, rel, int(torch.isnan(got).any(dim=1).sum())))
    same = torch.equal(outs["float16"], outs["float16 +F16_PAIRS"])
    base = rows_out[0][1]
    lines = [f"{proj} {tokens} tokens{' skewed' if skew else ''}: fp16 vs fp16 +F16_PAIRS bit-identical: {same}"]
    lines += [f"  {n:22s} {us:8.1f} us  x{us / base:.3f} of bf16  rel err {rel:.2e}  unwritten rows {bad}"
              for n, us, rel, bad in rows_out]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="512,4096")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for tokens in (int(t) for t in args.tokens.split(",")):
        for skew in (False, True):
            for proj in ("gate_up", "down"):
                print("\n".join(case(proj, tokens, skew)), flush=True)


if __name__ == "__main__":
    main()
