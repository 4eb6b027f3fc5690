"""The Gluon INT4 (and NVFP4) grouped kernels' "large" bucket tiles, for batched passes: which tile a server's
batch of 8 or 16 decisions should take (WGMMA_TILES["large"] in quantbench.engine.moe.int4_kernels / .nvfp4).

    python3 benchmarks/batch_tiles.py --out DIR [--layers 8] [--batches 8,16] [--formats int4]

Why: a batch of 16 decisions of 512 tokens routes 65,536 rows over 128 experts (~512 an expert, most of them to a
dozen experts on the random-weight model), the "large" bucket, which took the batch-1 "mid" tile (64 tokens x 128
weight rows, one warpgroup): each dequantized weight then feeds 64 tokens. Wider token tiles (BLOCK_M) and more
weight rows a program (BLOCK_N, two warpgroups) feed more tokens per dequantized weight, at the cost of registers
and shared memory. Issue #32 asks a batch-16 forward ≤ 90 ms at the 30B shape.

On one GPU: builds the real-shape model (--layers, random weights, the format's engine), records each MoE layer's
inputs in one forward of each --batches size, then per candidate (PLANS): both projections over the recorded
layers with outputs poisoned with NaN (every row written; the same bits as the current tile: a token tile's size
does not change any output's sum order), their time per layer (CUDA graph), and the whole --layers forward of each
batch in a CUDA graph (ms, logits against the current tile's). Writes DIR/batch_tiles.json and DIR/best.json (the
fastest valid plan at the largest batch, as QUANTBENCH_WGMMA_TILES takes it) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import tile_plans as tp  # noqa: E402

# Each replaces keys of the "large" bucket's tile (the first: none, the committed tile). BLOCK_M: tokens a program
# (the MMA's N, up to 256); BLOCK_N: weight rows a program (the MMA's M: 64 a warpgroup, so 8 warps for 128+ rows
# split over two warpgroups); AHEAD: blocks copied ahead.
PLANS = {
    "int4": {
        "current": {},
        "m64": {"BLOCK_M": 64},  # the tile before 2026-12-03 evening (the default is now m128)
        "m128": {"BLOCK_M": 128},
        "m128-a2": {"BLOCK_M": 128, "AHEAD": 2},
        "m128-w8": {"BLOCK_M": 128, "num_warps": 8},
        "m128-a2-w8": {"BLOCK_M": 128, "num_warps": 8, "AHEAD": 2},
        "n256-w8": {"BLOCK_N": 256, "num_warps": 8},
        "m128-n256-w8": {"BLOCK_M": 128, "BLOCK_N": 256, "num_warps": 8},
        "m256-w8": {"BLOCK_M": 256, "num_warps": 8},
        # 64 weight rows a program: 142 registers, 76 KB (128 tokens) / 94, 44 KB (64 tokens) at sm_90
        "m128-n64": {"BLOCK_M": 128, "BLOCK_N": 64},
        "m64-n64": {"BLOCK_M": 64, "BLOCK_N": 64},
        # 64 tokens capped at 128 registers: four programs an SM (the 128-token tile: two, by registers and memory)
        "m64-r128": {"BLOCK_M": 64, "maxnreg": 128},
    },
    "nvfp4": {
        "current": {},
        "m128": {"BLOCK_M": 128},
        "m128-w8": {"BLOCK_M": 128, "num_warps": 8},
        "n256-w8": {"BLOCK_N": 256, "num_warps": 8},
        # a stage less of shared memory (nvfp4_wgmma DRAIN), and gate_up's scales in a ring of two blocks (RING)
        "drain": {"DRAIN": 1},
        "drain-ring2": {"DRAIN": 1, "RING": 2},
    },
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--formats", default="int4")
    ap.add_argument("--plans", help="comma-separated plan names (default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    result: dict = {"layers": args.layers, "gpu": torch.cuda.get_device_name(), "batches": batches, "formats": {}}
    best = {}
    with torch.inference_mode():
        for fmt in args.formats.split(","):
            t0 = time.time()
            model = tp.build(fmt, args.layers)
            gen = torch.Generator(device="cuda").manual_seed(0)
            ids = {b: torch.randint(0, 151936, (b, tp.TOKENS), device="cuda", generator=gen) for b in batches}
            inputs = {f"batch{b}": tp.record_inputs(model, i) for b, i in ids.items()}
            case_list = tp.cases(inputs, tp.experts_of(model))
            # tile_plans' runs and timings: both projections per case (down on the same h for every plan), the
            # large bucket's tile with the plan's keys over it (batches of 8 and more are all "large")
            base = tp.run_plan(fmt, {}, case_list, poison=True)
            r: dict = {"checks": {}, "kernel_us": {}, "model_ms": {}}
            names = [n for n in PLANS[fmt] if not args.plans or n in args.plans.split(",") or n == "current"]
            logits0: dict = {}
            for name in names:
                plan = PLANS[fmt][name]
                try:
                    got = base if name == "current" else tp.run_plan(fmt, plan, case_list, poison=True)
                    unwritten = sum(int(t.isnan().any(dim=-1).sum()) for pair in got for t in pair)
                    same = all(torch.equal(a, b) for pa, pb in zip(base, got, strict=True)
                               for a, b in zip(pa, pb, strict=True))
                    r["checks"][name] = {"unwritten_rows": unwritten, "bit_identical": same}
                    r["kernel_us"][name] = {f"batch{b}": {which: tp.time_plan(fmt, plan, case_list, f"batch{b}", which)
                                                          for which in ("gate_up", "down")} for b in batches}
                    if unwritten or not same:
                        raise ValueError(f"not the current tile's outputs: {r['checks'][name]}")
                    saved = dict(tp.TILES[fmt]["large"])
                    tp.TILES[fmt]["large"] = {**saved, **plan}
                    try:
                        row = {}
                        for b, i in ids.items():
                            ms, logits = tp.model_ms(model, i)
                            ref = logits0.setdefault(b, logits)
                            row[f"batch {b}"] = {"ms": ms, "ms_a_decision": ms / b,
                                                 "logits_max_diff": float((logits.float() - ref.float()).abs().max())}
                        r["model_ms"][name] = row
                    finally:
                        tp.TILES[fmt]["large"] = saved
                except Exception as exc:  # a plan that does not compile, fit or agree is reported; the rest run
                    r["checks"].setdefault(name, {})["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"{fmt} {name}: {r['checks'][name]} kernels {r['kernel_us'].get(name)} "
                      f"model {r['model_ms'].get(name)}", flush=True)
                result["formats"][fmt] = r
                (args.out / "batch_tiles.json").write_text(json.dumps(result, indent=1))
            r["seconds"] = time.time() - t0
            top = f"batch {max(batches)}"
            ok = {n: v[top]["ms"] for n, v in r["model_ms"].items()}
            name = min(ok, key=ok.get)
            best[fmt] = {"plan": name, "tiles": {"large": {**tp.TILES[fmt]["large"], **PLANS[fmt][name]}}}
            del model, inputs, case_list, base
            tp._H.clear()
            torch.cuda.empty_cache()
    (args.out / "batch_tiles.json").write_text(json.dumps(result, indent=1))
    (args.out / "best.json").write_text(json.dumps({f: b["tiles"] for f, b in best.items()}))
    for fmt, r in result["formats"].items():
        cur = r["model_ms"].get("current", {})
        print(f"\n{fmt}, {args.layers} layers, per plan: µs a layer (gate_up + down) and the forward in a CUDA graph")
        print(f"{'plan':<16}" + "".join(f"{'b' + str(b) + ' kernels µs':>16}{'b' + str(b) + ' ms':>10}{'ratio':>7}"
                                        for b in batches))
        for name in r["checks"]:
            line = f"{name:<16}"
            for b in batches:
                k = r["kernel_us"].get(name, {}).get(f"batch{b}")
                m = r["model_ms"].get(name, {}).get(f"batch {b}", {}).get("ms")
                c = cur.get(f"batch {b}", {}).get("ms")
                line += f"{(k['gate_up'] + k['down']) if k else float('nan'):>16.1f}"
                line += f"{m if m else float('nan'):>10.2f}{(m / c) if m and c else float('nan'):>7.3f}"
            print(line + ("  " + r["checks"][name]["error"][:80] if "error" in r["checks"][name] else ""))
        print(f"best at batch {max(batches)}: {best[fmt]['plan']}")
    print(f"QUANTBENCH_WGMMA_TILES='{json.dumps({f: b['tiles'] for f, b in best.items()})}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
