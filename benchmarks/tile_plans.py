"""The Gluon INT4 and NVFP4 grouped kernels' tile plans, on the routing of the real-shape model itself, against
one tile size for every expert (the default before 2026-12-03): which plan the engine should take (WGMMA_TILES in
quantbench.engine.moe.int4_kernels and .nvfp4), measured in one device call.

    python3 benchmarks/tile_plans.py --out DIR [--layers 8] [--formats int4,nvfp4] [--ref FILE]
    python3 benchmarks/tile_plans.py --save-ref FILE          # the committed code (PYTHONPATH), digests only
    python3 benchmarks/tile_plans.py --profile PLAN           # a few launches for ncu (below)

Why the model's routing: the random-weight model sends most of a layer's 4,096 routed rows to about 13 experts
(250 to 480 rows each) and leaves about 30 experts with 1 to 16 rows and the rest with none (CPU check of 4
layers, docs/BENCHMARKS.md), far from the uniform ~32 rows per expert that kernel_sweep.py times. A plan (see
PLANS) replaces the mid and large buckets' tiles: SMALL_M / MID_M give experts with at most that
many rows one tile of that many tokens (gluon_common.tile_map), SPLIT launches each tile size on its own,
SCALED multiplies the group's scale into the int4 weights (one rounding per weight, no per-block partial sum).

What it does, on one GPU:
1. builds the real-shape model (--layers, random weights, quantbench's fused ops, the INT4 engine), runs one
   512-token decision and a batch of 8, and records each MoE layer's inputs (tokens, experts, routing weights);
2. per format and plan, runs both projections over those inputs and over uniform routing, with outputs poisoned
   with NaN: every row written, and bit-identical to the first plan (SCALED: relative error against it and
   against a float64 reference of the int4 weights); with --ref, the first plan's outputs and the recorded inputs
   against the digests the code before the change wrote (--save-ref, its default plan): the same bits as before;
3. times each plan's projections over all recorded layers in a CUDA graph (do_bench_cudagraph, µs per layer);
4. times the whole --layers model's decision forward in a CUDA graph per plan (batch 1 and 8), last-token
   logits against the first plan's;
5. writes DIR/tile_plans.json (every figure) and DIR/best.json (the fastest plan per format at batch 1 in the
   model, as QUANTBENCH_WGMMA_TILES takes it), and prints a table with ratios to the first plan.

ncu: `ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats --section
Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 benchmarks/tile_plans.py
--profile one-size --formats int4 --layers 4` profiles gate_up and down of one layer of the batch-1 decision
(layer 3, whose routing is the model's usual skew) with that plan; a name that is no plan profiles the current
default (benchmarks/tile_plans.sh runs all of it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.model_profile import quantized_engine  # noqa: E402
from benchmarks.moe_int4 import build_model, decision_forward  # noqa: E402
from quantbench.engine import fused  # noqa: E402
from quantbench.engine.moe import engine, int4_kernels, nvfp4  # noqa: E402
from quantbench.engine.moe.align import group_by_expert  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm  # noqa: E402

E, TOP_K, TOKENS = 128, 8, 512
DEVICE = "cuda"  # a CPU dry run of this script's plumbing sets "cpu" (and fakes the kernels)
TILES = {"int4": int4_kernels.WGMMA_TILES, "nvfp4": nvfp4.WGMMA_TILES}
ONE_SIZE = {"BLOCK_M": 64, "BLOCK_N": 128, "SMALL_M": 0, "MID_M": 0, "SPLIT": 0}
# each plan replaces the mid and large buckets' tiles; the first, "one-size", is the default before 2026-12-03,
# the reference of every ratio and bit-identity check
PLANS = {
    "int4": {
        "one-size": {**ONE_SIZE, "AHEAD": 2, "SCALED": 0},
        "mixed16/32": {**ONE_SIZE, "AHEAD": 2, "SCALED": 0, "SMALL_M": 16, "MID_M": 32},
        "split16/32": {**ONE_SIZE, "AHEAD": 2, "SCALED": 0, "SMALL_M": 16, "MID_M": 32, "SPLIT": 1},
        "scaled-a1": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2},
        "scaled-a1+mixed16/32": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 32},
        "tile32": {**ONE_SIZE, "BLOCK_M": 32, "AHEAD": 2, "SCALED": 0},
        # 128-token tiles for the experts with more than MID_M rows (the batch-1 decision's dozen heavy experts)
        "scaled-a1+mixed16/32+m128": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 32, "BLOCK_M": 128},
        "scaled-a1+mixed16/64+m128": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 64, "BLOCK_M": 128},
        # 64 weight rows a program (one wgmma M): 94 / 80 registers and 44 / 42 KB of shared memory at sm_90
        # (compile_sm90), so five programs an SM where 64 x 128 fits three: more warps for a latency-bound loop
        "scaled-a1+mixed16/32+n64": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 32, "BLOCK_N": 64},
        "scaled-a1+mixed16/32+m128n64": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 32,
                                         "BLOCK_M": 128, "BLOCK_N": 64},
        # the committed plan capped at 128 registers (145 / 166 without): four programs an SM instead of three, as
        # its 56 / 52 KB of shared memory allow; ptxas keeps the K loops free of spills (8 bytes stored around one)
        "scaled-a1+mixed16/32+r128": {**ONE_SIZE, "AHEAD": 1, "SCALED": 2, "SMALL_M": 16, "MID_M": 32, "maxnreg": 128},
    },
    "nvfp4": {
        "one-size": {**ONE_SIZE, "AHEAD": 1},
        "mixed16/32": {**ONE_SIZE, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32},
        "split16/32": {**ONE_SIZE, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32, "SPLIT": 1},
        # a stage less (the block before's last MMA waited for at each block's start): 80 / 64 KB of shared memory
        # instead of 104 / 88, so down fits three programs an SM instead of two (gate_up still two)
        "mixed16/32+drain": {**ONE_SIZE, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32, "DRAIN": 1},
        # and gate_up's block scales in a ring of 2 / 4 blocks instead of the whole 32 KB table (nvfp4_wgmma's
        # RING): 52 / 56 KB, three programs an SM instead of two, the K loop 433 / 437 SASS instructions instead
        # of 356 (the scales' conversion moves into it from the program's start); down unchanged
        "mixed16/32+drain+ring2": {**ONE_SIZE, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32, "DRAIN": 1, "RING": 2},
        "mixed16/32+drain+ring4": {**ONE_SIZE, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32, "DRAIN": 1, "RING": 4},
    },
}
BASE = "one-size"


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def digests(results: list, case_list: list) -> list[list[str]]:
    """Digests of (h, y) per case, h in pair order: above 16,384 routed pairs the grouping places an expert's rows in
    the order its atomics run (align.py), so h's sorted order may differ between processes, its rows not."""
    return [[digest(h[g.pair_row.long()]), digest(y)] for (h, y), (*_, g) in zip(results, case_list, strict=True)]


def config_of(fmt: str, plan: dict, rows: int) -> dict:
    bucket = "large" if rows / E > 48 else "mid"  # triton_common.rows_bucket at 128 experts (512 tokens: mid)
    return {**TILES[fmt][bucket], **plan, "KERNEL": "gluon"}


def set_plan(fmt: str, plan: dict) -> dict:
    """Every bucket but small takes `plan` in this process (what QUANTBENCH_WGMMA_TILES does for a run)."""
    saved = {b: dict(c) for b, c in TILES[fmt].items()}
    for bucket in ("mid", "large"):
        TILES[fmt][bucket] = {**saved[bucket], **plan}
    return saved


# -- 1. the model and its MoE inputs ------------------------------------------------------------------------------
def build(fmt: str, layers: int):
    model = build_model(layers, DEVICE)
    model.set_experts_implementation("grouped_mm")
    fused.install(model)
    quantized_engine(model, fmt)
    return model


def record_inputs(model, ids) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(tokens, experts [T, k], routing weights [T, k]) entering each MoE layer in one forward of `ids`."""
    seen, original = [], engine.GroupedMoE.experts_forward

    def spy(self, x, index, weights, *args, **kwargs):
        seen.append((x.detach().clone(), index.detach().clone(), weights.detach().clone()))
        return original(self, x, index, weights, *args, **kwargs)

    engine.GroupedMoE.experts_forward = spy
    try:
        decision_forward(model, ids)
    finally:
        engine.GroupedMoE.experts_forward = original
    return seen


def uniform_inputs(like: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    index = torch.rand(tokens, E, device=DEVICE, generator=gen).topk(TOP_K, dim=-1).indices
    weights = torch.rand(tokens, TOP_K, device=DEVICE, generator=gen).to(like.dtype)
    x = torch.randn(tokens, like.shape[1], device=DEVICE, generator=gen).to(like.dtype) * like.float().std()
    return x, index, weights


def experts_of(model) -> list[tuple]:
    return [(m.gate_up, m.down) for m in model.modules() if isinstance(m, engine.GroupedMoE)]


# -- 2. one projection ------------------------------------------------------------------------------------------
def project(fmt: str, w, x, grouping, which: str, cfg: dict | None, out: torch.Tensor | None = None):
    g = grouping
    if which == "gate_up":
        extra = dict(row_index=g.row_token, swiglu=True)
    else:
        extra = dict(row_scale=g.row_scale, row_dest=g.row_pair)
    if fmt == "int4":
        return int4_grouped_mm(x, w.qweight, w.scales, w.zeros, g.offsets, w.group_size, cfg, out=out, **extra)
    kwargs = dict(layout=w.layout) if hasattr(w, "layout") else {}
    if out is not None:
        kwargs["out"] = out
    return nvfp4.nvfp4_grouped_mm(x, w.packed, w.block_scale, w.global_scale, g.offsets, cfg, **extra, **kwargs)


def cases(inputs: dict, weights: list) -> list[tuple]:
    """(routing name, layer, weights (gate_up, down), x, grouping) for every recorded layer and the uniform ones."""
    out = []
    for name, layers in inputs.items():
        for i, (x, index, rw) in enumerate(layers):
            w = weights[i % len(weights)]
            out.append((name, i, w, x, group_by_expert(index, rw, E)))
    return out


def run_plan(fmt: str, plan: dict, case_list: list, poison: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(h, y) of every case under `plan`: gate_up's output h, then down's y from the first plan's h (so that a
    plan's down is checked on the same input as the first's)."""
    results = []
    for name, _i, (gu, dn), x, g in case_list:
        rows = g.row_token.shape[0]
        cfg = config_of(fmt, plan, rows)
        h_out = torch.full((rows, gu.out_features // 2), float("nan"), dtype=x.dtype, device=DEVICE) if poison else None
        h = project(fmt, gu, x, g, "gate_up", cfg, h_out)
        h_in = case_h(fmt, name, _i, gu, x, g)
        y_out = torch.full((rows, dn.out_features), float("nan"), dtype=x.dtype, device=DEVICE) if poison else None
        y = project(fmt, dn, h_in, g, "down", cfg, y_out)
        results.append((h, y))
    return results


_H: dict = {}


def case_h(fmt, name, i, gu, x, g):
    """The reference plan's gate_up output of a case: down's input for every plan."""
    key = (fmt, name, i)
    if key not in _H:
        _H[key] = project(fmt, gu, x, g, "gate_up", config_of(fmt, PLANS[fmt][BASE], g.row_token.shape[0]))
    return _H[key]


def reference_error(fmt: str, w, x, g, which: str, got: torch.Tensor, h: torch.Tensor | None) -> float:
    """‖got − ref‖ / ‖ref‖ against float64 math on the dequantized-in-float64 weights of the experts hit."""
    rows = g.row_token.shape[0]
    offs = [0] + g.offsets.tolist()
    dense = w.dequantize(torch.float64)
    src = x[g.row_token.long()].double() if which == "gate_up" else h.double()
    ref = torch.zeros(rows, dense.shape[1], dtype=torch.float64, device=DEVICE)
    for e in range(E):
        if offs[e + 1] > offs[e]:
            ref[offs[e]:offs[e + 1]] = src[offs[e]:offs[e + 1]] @ dense[e].transpose(0, 1)
    if which == "gate_up":
        gate, up = ref.chunk(2, dim=-1)
        ref = torch.nn.functional.silu(gate) * up
    else:
        ref = ref * g.row_scale.double()[:, None]
        back = torch.empty_like(ref)
        back[g.row_pair.long()] = ref
        ref = back
    return float((got.double() - ref).norm() / ref.norm())


# -- 3. and 4. timing -------------------------------------------------------------------------------------------
def time_plan(fmt: str, plan: dict, case_list: list, routing: str, which: str) -> float:
    """µs per layer for `which` over every layer of `routing`: median of CUDA-graph replays of all launches (the
    outputs allocated once, outside the graph, which holds many copies of the launches)."""
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench_cudagraph

    sel = []
    for name, i, (gu, dn), x, g in (c for c in case_list if c[0] == routing):
        rows = g.row_token.shape[0]
        cfg = config_of(fmt, plan, rows)
        if which == "gate_up":
            out = torch.empty(rows, gu.out_features // 2, dtype=x.dtype, device=DEVICE)
            sel.append((gu, x, g, cfg, out))
        else:
            out = torch.empty(rows, dn.out_features, dtype=x.dtype, device=DEVICE)
            sel.append((dn, case_h(fmt, name, i, gu, x, g), g, cfg, out))

    def fn():
        for w, x, g, cfg, out in sel:
            project(fmt, w, x, g, which, cfg, out)

    fn()
    return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3 / len(sel)


def model_ms(model, ids) -> tuple[float, torch.Tensor]:
    from triton.testing import do_bench

    for _ in range(2):
        decision_forward(model, ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = decision_forward(model, ids)
    graph.replay()
    ms = do_bench(graph.replay, warmup=50, rep=400, return_mode="median")
    out = logits.clone()
    del graph
    return ms, out


# -- the whole call ---------------------------------------------------------------------------------------------
def save_ref(path: Path, layers: int, formats: list[str]) -> None:
    """Digests of the recorded inputs and of the one-size plan's outputs, from the code on PYTHONPATH."""
    out: dict = {}
    for fmt in formats:
        model = build(fmt, layers)
        inputs = {f"model{t}": record_inputs(model, ids) for t, ids in model_ids()}
        if fmt == formats[0]:
            out["inputs"] = {k: [digest(x) for x, _, _ in v] for k, v in inputs.items()}
        inputs["uniform512"] = [uniform_inputs(inputs["model512"][0][0], TOKENS)]
        case_list = cases(inputs, experts_of(model))
        out[fmt] = digests(run_plan(fmt, PLANS[fmt][BASE], case_list, poison=False), case_list)
        del model
        torch.cuda.empty_cache()
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


def model_ids() -> list[tuple[int, torch.Tensor]]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    return [(TOKENS * b, torch.randint(0, 151936, (b, TOKENS), device=DEVICE, generator=gen)) for b in (1, 8)]


def warm_one(task: tuple[str, str]) -> str:
    """Compile one plan's kernels (both projections) on dummy inputs of the real shapes, in a worker process:
    the binaries land in Triton's on-disk cache, which the timed process then reads."""
    fmt, name = task
    try:
        with torch.inference_mode():
            gen = torch.Generator(device=DEVICE).manual_seed(0)
            experts = []
            for n, k in ((1536, 2048), (2048, 768)):
                w = torch.randn(E, n, k, device=DEVICE, generator=gen, dtype=torch.bfloat16) * 0.02
                experts.append(quantized(fmt, w))
            gu, dn = experts
            if fmt == "nvfp4":  # the Gluon kernel's layout, as after the engine's first call
                for w in (gu, dn):
                    w._relayout("wgmma")
            x = torch.randn(TOKENS, 2048, device=DEVICE, generator=gen, dtype=torch.bfloat16)
            index = torch.rand(TOKENS, E, device=DEVICE, generator=gen).topk(TOP_K, dim=-1).indices
            g = group_by_expert(index, torch.rand(TOKENS, TOP_K, device=DEVICE, generator=gen).to(x.dtype), E)
            cfg = config_of(fmt, PLANS[fmt][name], g.row_token.shape[0])
            h = project(fmt, gu, x, g, "gate_up", cfg)
            project(fmt, dn, h, g, "down", cfg)
            torch.cuda.synchronize()
        return f"{fmt} {name}: compiled"
    except Exception as exc:  # the timed process compiles it itself (and reports what fails)
        return f"{fmt} {name}: {type(exc).__name__}: {str(exc)[:200]}"


def quantized(fmt: str, weight: torch.Tensor):
    from quantbench.engine.moe.int4 import rtn_experts
    from quantbench.engine.moe.nvfp4 import Nvfp4Experts

    if fmt == "int4":
        return rtn_experts(weight)
    return Nvfp4Experts.from_weights(weight, input_scale=torch.full((1,), 8.0 / (6.0 * 448.0), device=weight.device))


def warm(formats: list[str], processes: int) -> None:
    import multiprocessing

    tasks = [(fmt, name) for fmt in formats for name in PLANS[fmt]]
    t = time.time()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for line in pool.imap_unordered(warm_one, tasks):
            print(f"warm: {line}", flush=True)
    print(f"warm: {len(tasks)} plans tried in {time.time() - t:.0f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--formats", default="int4,nvfp4")
    ap.add_argument("--ref", type=Path, help="digests the committed code wrote (--save-ref)")
    ap.add_argument("--save-ref", type=Path)
    ap.add_argument("--profile", help="a plan: run one heavy layer's projections with it (for ncu), nothing else")
    ap.add_argument("--plans", help="comma-separated plan names (default: all)")
    ap.add_argument("--warm", type=int, default=0, help="compile the plans' kernels first in this many processes")
    args = ap.parse_args()
    formats = args.formats.split(",")
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        if args.save_ref:
            return save_ref(args.save_ref, args.layers, formats)
        if args.profile:
            return profile(formats, args.layers, args.profile)
        if args.warm:
            warm(formats, args.warm)
        run_all(args, formats)


def profile(formats: list[str], layers: int, plan_name: str) -> None:
    for fmt in formats:
        model = build(fmt, layers)
        x, index, rw = record_inputs(model, model_ids()[0][1])[min(3, layers - 1)]
        g = group_by_expert(index, rw, E)
        gu, dn = experts_of(model)[min(3, layers - 1)]
        plan = PLANS[fmt].get(plan_name, {})  # not a plan's name: the current default
        cfg = config_of(fmt, plan, g.row_token.shape[0])
        h = project(fmt, gu, x, g, "gate_up", cfg)  # compiled before the profiled range
        project(fmt, dn, h, g, "down", cfg)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()  # ncu --profile-from-start off: these launches alone
        h = project(fmt, gu, x, g, "gate_up", cfg)
        project(fmt, dn, h, g, "down", cfg)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled {fmt} plan {plan_name}: {cfg}")
        del model
        torch.cuda.empty_cache()


def run_all(args, formats: list[str]) -> None:
    from benchmarks.tile_plans_report import report

    args.out.mkdir(parents=True, exist_ok=True)
    ref = json.loads(args.ref.read_text()) if args.ref and args.ref.exists() else None
    result: dict = {"layers": args.layers, "gpu": torch.cuda.get_device_name(), "formats": {}}
    for fmt in formats:
        t0 = time.time()
        model = build(fmt, args.layers)
        ids = model_ids()
        inputs = {f"model{t}": record_inputs(model, i) for t, i in ids}
        r: dict = {"checks": {}, "kernel_us": {}, "model_ms": {}, "rows_per_expert": {}}
        if ref is not None and fmt == formats[0]:
            r["inputs_as_before"] = {k: [digest(x) for x, _, _ in v] == ref["inputs"][k] for k, v in inputs.items()}
        for name, layer in inputs.items():  # rows per expert of each recorded layer (the routing's shape)
            r["rows_per_expert"][name] = [torch.bincount(idx.flatten(), minlength=E).tolist() for _, idx, _ in layer]
        inputs["uniform512"] = [uniform_inputs(inputs["model512"][0][0], TOKENS)]
        case_list = cases(inputs, experts_of(model))
        base = run_plan(fmt, PLANS[fmt][BASE], case_list, poison=True)
        if ref is not None:
            r["base_as_before"] = digests(base, case_list) == ref[fmt]
        names = [n for n in PLANS[fmt] if not args.plans or n in args.plans.split(",") or n == BASE]
        for name in names:
            plan = PLANS[fmt][name]
            try:
                got = base if name == BASE else run_plan(fmt, plan, case_list, poison=True)
                r["checks"][name] = check(fmt, plan, base, got, case_list)
                r["kernel_us"][name] = {f"{routing} {which}": time_plan(fmt, plan, case_list, routing, which)
                                        for routing in ("model512", "model4096", "uniform512")
                                        for which in ("gate_up", "down")}
            except Exception as exc:  # a plan that does not compile or fit is reported; the rest still run
                r["checks"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"{fmt} {name}: {r['checks'][name]} {r['kernel_us'].get(name)}", flush=True)
            result["formats"][fmt] = r  # written as it goes: a call cut short keeps what it measured
            (args.out / "tile_plans.json").write_text(json.dumps(result, indent=1))
        logits0 = {}
        for name in names:
            if not valid(r["checks"][name]):
                continue
            saved = set_plan(fmt, PLANS[fmt][name])
            try:
                row = {}
                for tokens, i in ids:
                    ms, logits = model_ms(model, i)
                    logits0.setdefault(tokens, logits)
                    diff = float((logits.float() - logits0[tokens].float()).abs().max())
                    p, q = logits.float().softmax(-1), logits0[tokens].float().softmax(-1)
                    row[f"batch {tokens // TOKENS}"] = {"ms": ms, "logits_max_diff": diff,
                                                        "tv": float((p - q).abs().sum(-1).max() / 2)}
                r["model_ms"][name] = row
            finally:
                TILES[fmt].update(saved)
            print(f"{fmt} {name} model: {r['model_ms'][name]}", flush=True)
        r["seconds"] = time.time() - t0
        result["formats"][fmt] = r
        del model, inputs, case_list, base
        _H.clear()
        torch.cuda.empty_cache()
        (args.out / "tile_plans.json").write_text(json.dumps(result, indent=1))
    best = {}
    for fmt, r in result["formats"].items():
        ok = {n: v["batch 1"]["ms"] for n, v in r["model_ms"].items()}
        name = min(ok, key=ok.get)
        best[fmt] = {"plan": name, "tiles": {b: {**TILES[fmt][b], **PLANS[fmt][name]} for b in ("mid", "large")}}
    (args.out / "best.json").write_text(json.dumps(best, indent=1))
    print(report(result, PLANS))


def valid(checks: dict) -> bool:
    """A plan the engine could take: it ran, wrote every row, and computed the first plan's bits (SCALED: within
    1e-2 of them, its own arithmetic)."""
    if "error" in checks or checks["unwritten_rows"]:
        return False
    return checks["bit_identical"] or checks.get("rel_diff_vs_base_max", 1.0) < 1e-2


def check(fmt: str, plan: dict, base: list, got: list, case_list: list) -> dict:
    """Every row written (no NaN left), and the same bits as the first plan; SCALED: relative errors."""
    unwritten = sum(int(t.isnan().any(dim=-1).sum()) for pair in got for t in pair)
    same = all(torch.equal(a, b) for pa, pb in zip(base, got, strict=True) for a, b in zip(pa, pb, strict=True))
    # one digest of every output: two plans of the same arithmetic (a schedule's option) must print the same
    outputs = hashlib.sha256("".join(digest(t) for pair in got for t in pair).encode()).hexdigest()[:12]
    out = {"unwritten_rows": unwritten, "bit_identical": same, "outputs": outputs}
    if plan.get("SCALED"):
        diffs = [float((b.float() - a.float()).norm() / a.float().norm()) for pa, pb in zip(base, got, strict=True)
                 for a, b in zip(pa, pb, strict=True)]
        out["rel_diff_vs_base_max"] = max(diffs)
        name, _i, (gu, dn), x, g = case_list[0]  # the first recorded layer, against float64 math
        h = case_h(fmt, name, _i, gu, x, g)
        out["rel_err_vs_float64"] = {
            "base gate_up": reference_error(fmt, gu, x, g, "gate_up", base[0][0], None),
            "plan gate_up": reference_error(fmt, gu, x, g, "gate_up", got[0][0], None),
            "base down": reference_error(fmt, dn, x, g, "down", base[0][1], h),
            "plan down": reference_error(fmt, dn, x, g, "down", got[0][1], h),
        }
    return out


if __name__ == "__main__":
    main()
