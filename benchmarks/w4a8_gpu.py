"""W4A8 (int4 weight codes x int8 activations, integer MMAs) against the W4A16 Gluon kernel, on the real-shape
model's own routing, in one device call: is it right, and is it faster?

    python3 benchmarks/w4a8_gpu.py --out DIR [--layers 8] [--batches 1,16] [--plans m64,m128-w8]

On one GPU (quantbench.engine.moe.w4a8_kernels, quantbench.engine.moe.w4a8):
1. builds the real-shape model (--layers, random weights, the INT4 engine: tile_plans.build) and records each MoE
   layer's inputs in one forward of each --batches size (512-token decisions);
2. checks: the activation codes of the Triton kernel against w4a8.quantize_rows (torch), equal; per plan, both
   projections with float32 outputs poisoned with NaN (every row written) against a float64 evaluation of the W4A8
   formula on the same codes (relative error), the same bits for every plan (a tile does not change any sum's
   order), and the relative difference from the W4A16 kernel's output (what int8 activations change);
3. times per plan both projections over all recorded layers in a CUDA graph, the activations' quantization included
   (µs per layer, and the quantization alone), beside the W4A16 kernels on the same inputs;
4. times the --layers model's forward per batch in a CUDA graph, W4A16 against W4A8 (the default plan and the
   fastest one), with the last-token logits' difference;
5. writes DIR/w4a8.json and prints a table with ratios to W4A16.
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
from quantbench.engine.moe import w4a8, w4a8_kernels  # noqa: E402

# Each a whole tile plan for every bucket (w4a8_kernels.TILES' keys); the first is the committed default
PLANS: dict[str, dict | None] = {
    "default": None,
    "m16": {"BLOCK_M": 16, "BLOCK_N": 128, "AHEAD": 2},
    "m32": {"BLOCK_M": 32, "BLOCK_N": 128, "AHEAD": 2},
    "m64": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 2},
    "m64-a1": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 1},
    "m64-pipe": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 2, "PIPE": 1},
    "m64-w8": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 2, "num_warps": 8},
    "m64-mixed": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 2, "SMALL_M": 16, "MID_M": 32},
    "m64-w8-mixed": {"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 2, "num_warps": 8, "SMALL_M": 16, "MID_M": 32},
    "m128-w8": {"BLOCK_M": 128, "BLOCK_N": 128, "AHEAD": 2, "num_warps": 8},
    "m128-w8-a1": {"BLOCK_M": 128, "BLOCK_N": 128, "AHEAD": 1, "num_warps": 8},
    "m128-w8-mixed": {"BLOCK_M": 128, "BLOCK_N": 128, "AHEAD": 2, "num_warps": 8, "SMALL_M": 16, "MID_M": 32},
}


def w4a8_of(experts) -> list[tuple]:
    """(gate_up, down) W4A8 experts made from each layer's INT4 experts (same codes, packed for the kernel)."""
    return [(w4a8.Int4W4A8Experts.from_int4(gu), w4a8.Int4W4A8Experts.from_int4(dn)) for gu, dn in experts]


def project(w, x, g, which: str, cfg: dict | None, out: torch.Tensor) -> torch.Tensor:
    """One W4A8 projection as the engine runs it: the activations quantized (the tokens, before the gather, for
    gate_up), then the kernel."""
    xq, sx, sxs = w4a8_kernels.quantize_rows(x, w4a8.TINY)
    if which == "gate_up":
        extra = dict(row_index=g.row_token, swiglu=True, row_scale=None, row_dest=None)
    else:
        extra = dict(row_index=None, swiglu=False, row_scale=g.row_scale, row_dest=g.row_pair)
    w4a8_kernels.launch(xq, sx, sxs, w.packed, w.scales, w.zeros, out, g.offsets, cfg, **extra)
    return out


def reference(w, x, g, which: str) -> torch.Tensor:
    """The W4A8 formula in float64 on the torch codes (w4a8.reference_grouped_mm; x in float64, so nothing is
    rounded back to bf16), with the projection's fused steps."""
    if which == "gate_up":
        extra = dict(row_index=g.row_token, act="swiglu")
    else:
        extra = dict(row_scale=g.row_scale, row_dest=g.row_pair)
    return w4a8.reference_grouped_mm(x.double(), w.packed, w.scales, w.zeros, g.offsets, **extra)


def warm_one(name: str) -> str:
    """Compile one plan's kernels (both projections) on random codes of the real shapes, in a worker process: the
    binaries land in Triton's on-disk cache, which the timed process then reads."""
    from quantbench.engine.moe.align import group_by_expert
    from quantbench.engine.moe.int4 import rtn_experts

    try:
        with torch.inference_mode():
            gen = torch.Generator(device="cuda").manual_seed(0)
            ws = [w4a8.Int4W4A8Experts.from_int4(rtn_experts(
                torch.randn(tp.E, n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02))
                for n, k in ((1536, 2048), (2048, 768))]
            x = torch.randn(tp.TOKENS, 2048, device="cuda", generator=gen, dtype=torch.bfloat16)
            index = torch.rand(tp.TOKENS, tp.E, device="cuda", generator=gen).topk(tp.TOP_K, dim=-1).indices
            g = group_by_expert(index, torch.rand(tp.TOKENS, tp.TOP_K, device="cuda", generator=gen).to(x.dtype), tp.E)
            rows = g.row_token.shape[0]
            for dtype in (torch.float32, torch.bfloat16):
                h = project(ws[0], x, g, "gate_up", PLANS[name], torch.empty(rows, 768, dtype=dtype, device="cuda"))
                project(ws[1], h.to(torch.bfloat16), g, "down", PLANS[name],
                        torch.empty(rows, 2048, dtype=dtype, device="cuda"))
            torch.cuda.synchronize()
        return f"{name}: compiled"
    except Exception as exc:  # the timed process compiles it itself (and reports what fails)
        return f"{name}: {type(exc).__name__}: {str(exc)[:300]}"


def warm(names: list[str]) -> None:
    import multiprocessing

    t = time.time()
    with multiprocessing.get_context("spawn").Pool(min(len(names), 12)) as pool:
        for line in pool.imap_unordered(warm_one, names):
            print(f"warm: {line}", flush=True)
    print(f"warm: {len(names)} plans in {time.time() - t:.0f} s", flush=True)


def time_cases(fn_list) -> float:
    from triton.testing import do_bench_cudagraph

    def fn():
        for f in fn_list:
            f()

    fn()
    return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3 / len(fn_list)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--plans", help="comma-separated plan names (default: all)")
    ap.add_argument("--check-layers", type=int, default=2, help="layers checked against float64 (slow)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    names = [n for n in PLANS if not args.plans or n in args.plans.split(",") or n == "default"]
    torch.backends.cuda.matmul.allow_tf32 = False
    warm(names)
    res: dict = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "batches": batches, "checks": {},
                 "kernel_us": {}, "quantize_us": {}, "w4a16_us": {}, "model_ms": {}}
    t0 = time.time()
    with torch.inference_mode():
        model = tp.build("int4", args.layers)
        gen = torch.Generator(device="cuda").manual_seed(0)
        ids = {b: torch.randint(0, 151936, (b, tp.TOKENS), device="cuda", generator=gen) for b in batches}
        inputs = {f"batch{b}": tp.record_inputs(model, i) for b, i in ids.items()}
        int4_experts = tp.experts_of(model)
        case_list = tp.cases(inputs, int4_experts)
        ours = w4a8_of(int4_experts)
        print(f"model built, inputs recorded: {time.time() - t0:.0f} s", flush=True)

        # 2. codes, then each plan against float64 and against the first plan's bits
        codes_equal = all(torch.equal(w4a8_kernels.quantize_rows(x, w4a8.TINY)[0], w4a8.quantize_rows(x)[0])
                          for _n, _i, _w, x, _g in case_list)
        res["checks"]["codes_equal_torch"] = codes_equal
        first: list | None = None
        for name in names:
            plan = PLANS[name]
            try:
                outs, errs, vs16 = [], [], []
                for cname, i, (gu, _dn), x, g in case_list:
                    wg, wd = ours[i % len(ours)]
                    rows = g.row_token.shape[0]
                    h16 = tp.case_h("int4", cname, i, gu, x, g)  # the W4A16 kernel's gate_up output
                    h = project(wg, x, g, "gate_up", plan,
                                torch.full((rows, wg.out_features // 2), float("nan"), device="cuda"))
                    y = project(wd, h16, g, "down", plan,
                                torch.full((rows, wd.out_features), float("nan"), device="cuda"))
                    outs += [h, y]
                    vs16.append(float((h - h16.float()).norm() / h16.float().norm()))
                    if i < args.check_layers and name == names[0]:
                        for got, ref in ((h, reference(wg, x, g, "gate_up")), (y, reference(wd, h16, g, "down"))):
                            errs.append(float((got.double() - ref).norm() / ref.norm()))
                unwritten = sum(int(t.isnan().any(dim=-1).sum()) for t in outs)
                same = first is None or all(torch.equal(a, b) for a, b in zip(first, outs, strict=True))
                first = first or outs
                res["checks"][name] = {"unwritten_rows": unwritten, "bit_identical_to_first": same,
                                       "max_rel_err_vs_float64": max(errs) if errs else None,
                                       "gate_up_rel_diff_vs_w4a16": max(vs16)}
                us = {}
                for b in batches:
                    sel = [c for c in case_list if c[0] == f"batch{b}"]
                    for which in ("gate_up", "down"):
                        fns = []
                        for cname, i, (gu, _dn), x, g in sel:
                            wg, wd = ours[i % len(ours)]
                            rows = g.row_token.shape[0]
                            w, inp = (wg, x) if which == "gate_up" else (wd, tp.case_h("int4", cname, i, gu, x, g))
                            o = torch.empty(rows, w.out_features // 2 if which == "gate_up" else w.out_features,
                                            dtype=x.dtype, device="cuda")
                            fns.append(lambda w=w, inp=inp, g=g, o=o, which=which, plan=plan: project(w, inp, g, which, plan, o))
                        us[f"batch{b} {which}"] = time_cases(fns)
                res["kernel_us"][name] = us
            except Exception as exc:  # a plan that does not compile or fit is reported; the rest run
                res["checks"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            print(f"{name}: {res['checks'][name]} {res['kernel_us'].get(name)}", flush=True)
            (args.out / "w4a8.json").write_text(json.dumps(res, indent=1))

        # the quantization alone, and the W4A16 kernels on the same inputs
        for b in batches:
            sel = [c for c in case_list if c[0] == f"batch{b}"]
            res["quantize_us"][f"batch{b} gate_up"] = time_cases(
                [lambda x=x: w4a8_kernels.quantize_rows(x, w4a8.TINY) for _c, _i, _w, x, _g in sel])
            hs = [tp.case_h("int4", c, i, w[0], x, g) for c, i, w, x, g in sel]
            res["quantize_us"][f"batch{b} down"] = time_cases([lambda h=h: w4a8_kernels.quantize_rows(h, w4a8.TINY) for h in hs])
            for which in ("gate_up", "down"):
                res["w4a16_us"][f"batch{b} {which}"] = tp.time_plan("int4", {}, case_list, f"batch{b}", which)

        # 4. the model: W4A16, then W4A8 with the default plan and with the fastest plan at the largest batch
        timed = {n: v for n, v in res["kernel_us"].items()
                 if not res["checks"][n].get("unwritten_rows") and res["checks"][n].get("bit_identical_to_first")}
        top = max(batches)
        best = min(timed, key=lambda n: timed[n][f"batch{top} gate_up"] + timed[n][f"batch{top} down"]) if timed else None
        res["best_plan_at_top_batch"] = best
        logits16 = {}
        for b, i in ids.items():
            ms, logits = tp.model_ms(model, i)
            logits16[b] = logits
            res["model_ms"].setdefault("w4a16", {})[f"batch {b}"] = ms
        swapped = w4a8.install_w4a8(model)
        res["swapped_projections"] = swapped
        saved = {k: dict(v) for k, v in w4a8_kernels.TILES.items()}
        for label, plan in (("w4a8 default", None), (f"w4a8 {best}", PLANS.get(best or ""))):
            if plan is not None:
                for bucket in w4a8_kernels.TILES:
                    w4a8_kernels.TILES[bucket] = dict(plan)
            try:
                for b, i in ids.items():
                    ms, logits = tp.model_ms(model, i)
                    res["model_ms"].setdefault(label, {})[f"batch {b}"] = ms
                    diff = (logits.float() - logits16[b].float())
                    res["model_ms"][label][f"batch {b} logits rel diff"] = float(diff.norm() / logits16[b].float().norm())
            finally:
                w4a8_kernels.TILES.update(saved)
            print(label, res["model_ms"][label], flush=True)
    res["seconds"] = time.time() - t0
    (args.out / "w4a8.json").write_text(json.dumps(res, indent=1))

    print(f"\nW4A8 vs W4A16, {args.layers} layers of the 30B shape, µs a layer (gate_up + down, quantization included)")
    print(f"{'plan':<16}" + "".join(f"{'b' + str(b) + ' µs':>10}{'vs w4a16':>10}" for b in batches))
    ref16 = {b: res["w4a16_us"][f"batch{b} gate_up"] + res["w4a16_us"][f"batch{b} down"] for b in batches}
    print(f"{'w4a16 (current)':<16}" + "".join(f"{ref16[b]:>10.1f}{1.0:>10.3f}" for b in batches))
    for name, us in res["kernel_us"].items():
        line = f"{name:<16}"
        for b in batches:
            t = us[f"batch{b} gate_up"] + us[f"batch{b} down"]
            line += f"{t:>10.1f}{t / ref16[b]:>10.3f}"
        print(line)
    print("quantization alone µs a layer:", {k: round(v, 1) for k, v in res["quantize_us"].items()})
    print("model ms:", json.dumps(res["model_ms"]))
    print("checks:", json.dumps(res["checks"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
