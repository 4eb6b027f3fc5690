"""Speed of the INT4 grouped-MoE engine (quantbench.engine.moe), against auto-round's per-expert path and BF16.

    python benchmarks/moe_int4.py cpu [--records 40] [--dtype bfloat16] [--chunks 24,18]
        The embedded default model's INT4 variant on the CPU: per-decision latency of the fast path and of
        auto-round's per-expert path, same process, same requests (the built-in suite), printed as a ratio,
        and BF16 on the same requests (no dequantization: the ceiling of any int4 path).

    python benchmarks/moe_int4.py gpu [--layers 48] [--tokens 512] [--out DIR]
        CUDA, at the Qwen3-30B-A3B shape with random weights (RTN int4 in memory, no auto-round needed):
        1. the fused kernel (Gluon on sm_90 where no configuration is given, else Triton) against a float64
           reference of the same int4 weights, on fresh random inputs,
           with poisoned outputs, for both projections and several routings;
        2. a sweep of block sizes per projection;
        3. one MoE layer: fused int4 vs dequantize+grouped_mm vs BF16 grouped_mm (eager and CUDA graph);
        4. the whole model, one decision of `--tokens` tokens at batch 1: BF16 grouped_mm vs int4 fused, eager
           and CUDA-graph replay, and the experts' bytes in memory.
        Writes moe_int4_gpu.json and moe_int4_gpu.md to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe import (  # noqa: E402
    DenseExperts,
    GroupedMoE,
    experts_nbytes,
    install_grouped_moe,
    int4,
    int4_kernels,
)
from quantbench.engine.moe.int4 import Int4Experts, rtn_experts  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm, pick_config  # noqa: E402
from quantbench.engine.triton_common import rows_bucket  # noqa: E402
from quantbench.models.families import moe_layout  # noqa: E402

SHAPE = {"hidden": 2048, "inter": 768, "experts": 128, "top_k": 8, "group": 128}


# -- CPU: fast vs per-expert on the fixture --------------------------------------------------------------------
def _median_ms(engine, requests, rounds: int = 1) -> list[float]:
    """Median model time per decision over `requests`, once per round (after a 3-decision warm-up)."""
    prepared = [engine.prepare(r) for r in requests]
    for p in prepared[:3]:
        engine.forward(p)
    medians = []
    for _ in range(rounds):
        times = []
        for p in prepared:
            t = time.perf_counter()
            engine.forward(p)
            times.append((time.perf_counter() - t) * 1e3)
        medians.append(statistics.median(times))
    return medians


def bench_cpu(records: int, dtype: str, chunks: list[int] | None = None) -> None:
    """Fast vs per-expert, and BF16 with no dequantization at all: the most any int4 path could gain. With
    `chunks` (exponents), the fast path alone, its CPU dequantization chunk switched between alternating rounds
    in one process (a noisy machine moves separate runs more than the change)."""
    from types import SimpleNamespace

    from backends.bf16 import Bf16Backend
    from backends.int4 import Int4Backend
    from quantbench.protocol.suite import load_suite
    from quantbench.run.spec import RunSpec

    requests = [r.request for r in load_suite(None).records[:records]]
    machine = SimpleNamespace(has_gpu=False, gpu_name=None)
    if chunks:
        loaded = Int4Backend().load(RunSpec(backend="int4", device="cpu", dtype=dtype), machine)
        by_chunk: dict[int, list[float]] = {c: [] for c in chunks}
        for _ in range(4):
            for c in chunks:
                int4._DEQUANT_CHUNK = 1 << c
                by_chunk[c] += _median_ms(loaded.engine, requests)
        for c, medians in by_chunk.items():
            print(f"dequant chunk 2^{c}: medians per round {' / '.join(f'{m:.2f}' for m in medians)} ms, "
                  f"mean {statistics.mean(medians):.2f} ms/decision")
        return
    results = {}
    for name, backend, spec in (
        ("fast", Int4Backend(), RunSpec(backend="int4", device="cpu", dtype=dtype, fast_moe=True)),
        ("per-expert", Int4Backend(), RunSpec(backend="int4", device="cpu", dtype=dtype, fast_moe=False)),
        ("bf16", Bf16Backend(), RunSpec(backend="bf16", device="cpu", dtype=dtype)),
    ):
        loaded = backend.load(spec, machine)
        [results[name]] = _median_ms(loaded.engine, requests)
        print(f"{loaded.info.kernel_path:55s} median {results[name]:8.2f} ms/decision "
              f"(n={len(requests)}, experts {loaded.info.experts_bytes / 2**20:.2f} MiB)")
    print(f"fast path speed-up over the per-expert path: {results['per-expert'] / results['fast']:.2f}x; "
          f"the most any int4 path could reach (BF16, no dequantization): "
          f"{results['per-expert'] / results['bf16']:.2f}x ({dtype}, {torch.get_num_threads()} threads)")


# -- GPU --------------------------------------------------------------------------------------------------------
def random_int4(e: int, n: int, k: int, g: int, device: str, sym: bool) -> Int4Experts:
    qweight = torch.randint(-(2**31), 2**31 - 1, (e, k // 8, n), dtype=torch.int32, device=device)
    scales = (torch.randn(e, k // g, n, device=device) * 0.02).half()  # negative scales included, as AutoRound's
    zeros = (torch.full((e, k // g, n), 8, dtype=torch.uint8, device=device) if sym
             else torch.randint(0, 16, (e, k // g, n), dtype=torch.uint8, device=device))
    return Int4Experts(qweight, scales, zeros, g, sym, k_block=128)


def routed_offsets(tokens: int, e: int, top_k: int, device: str, skew: bool = False) -> torch.Tensor:
    if skew:  # every token on the same few experts; most experts get no rows
        ids = torch.randint(0, 3, (tokens * top_k,), device=device)
    else:
        ids = torch.rand(tokens, e, device=device).topk(top_k, dim=-1).indices.flatten()
    return torch.cumsum(torch.bincount(ids, minlength=e), 0).to(torch.int32)


def grouped_float64(x: torch.Tensor, dense: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x[r] @ dense[e(r)].T in float64 for rows sorted by expert (offsets: cumulative row counts)."""
    out = torch.zeros(x.shape[0], dense.shape[1], dtype=torch.float64, device=x.device)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            out[start:end] = x[start:end].double() @ dense[e].T
        start = end
    return out


def reference(x: torch.Tensor, w: Int4Experts, offsets: torch.Tensor) -> torch.Tensor:
    # [E, N, K] dequantized by torch unpacking: independent of the kernels
    return grouped_float64(x, w.dequantize(torch.float64, use_triton=False), offsets)


def check_kernel(device: str, log: list[str]) -> list[dict]:
    """Every kernel variant the engine or the sweep can run, on fresh random inputs, outputs poisoned with NaN."""
    s = SHAPE
    rows = []
    gu, dn = (2 * s["inter"], s["hidden"]), (s["hidden"], s["inter"])
    swap = {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SWAP_AB": True, "EVICT": True}
    cases = [  # name, (N, K), tokens, skewed routing, dtype, asymmetric, config, fused extras
        ("gate_up", gu, 512, False, torch.bfloat16, False, None, ""),
        ("down", dn, 512, False, torch.bfloat16, False, None, ""),
        ("gate_up asym", gu, 512, False, torch.bfloat16, True, None, ""),
        ("down fp16", dn, 512, False, torch.float16, False, None, ""),
        ("gate_up 3 tokens", gu, 3, False, torch.bfloat16, False, None, ""),
        ("down skewed", dn, 512, True, torch.bfloat16, False, None, ""),
        ("gate_up 4096 tokens", gu, 4096, False, torch.bfloat16, False, None, ""),
        ("gate_up swap-AB", gu, 512, False, torch.bfloat16, True, swap, ""),
        ("gate_up gather+swiglu", gu, 512, False, torch.bfloat16, True, None, "gather+swiglu"),
        ("gate_up g+s swap-AB", gu, 512, False, torch.bfloat16, False, swap, "gather+swiglu"),
        ("down row_scale", dn, 512, False, torch.bfloat16, False, None, "row_scale"),
        ("down row_scale swap-AB", dn, 40, True, torch.bfloat16, True, swap, "row_scale"),
        ("gate_up g+s BM64 asym", gu, 512, False, torch.bfloat16, True, dict(swap, BLOCK_M=64), "gather+swiglu"),
        ("down fp16 skewed BM64", dn, 512, True, torch.float16, False, dict(swap, BLOCK_M=64), ""),
    ]
    for name, (n, k), tokens, skew, dtype, asym, cfg, extra in cases:
        torch.manual_seed(len(rows) + 1)
        w = random_int4(s["experts"], n, k, s["group"], device, sym=not asym)
        offsets = routed_offsets(tokens, s["experts"], s["top_k"], device, skew)
        r = tokens * s["top_k"]
        x = torch.randn(r, k, device=device).to(dtype)
        kw: dict = {}
        if "gather" in extra:
            kw["row_index"] = torch.randint(0, tokens, (r,), device=device, dtype=torch.int32)
            kw["swiglu"] = True
            x_in = torch.randn(tokens, k, device=device).to(dtype)
            x = x_in[kw["row_index"].long()]
        else:
            x_in = x
        if "row_scale" in extra:
            kw["row_scale"] = torch.rand(r, device=device)
        out = torch.full((r, n // 2 if "swiglu" in extra else n), float("nan"), dtype=dtype, device=device)
        int4_grouped_mm(x_in, w.qweight, w.scales, w.zeros, offsets, s["group"], cfg, out=out, **kw)
        torch.cuda.synchronize()
        ref = reference(x, w, offsets)
        if "swiglu" in extra:
            gate, up = ref.chunk(2, dim=-1)
            ref = torch.nn.functional.silu(gate) * up
        if "row_scale" in extra:
            ref = ref * kw["row_scale"].double()[:, None]
        rel = float((out.double() - ref).norm() / ref.norm())
        unwritten = int(torch.isnan(out).any(dim=1).sum())
        deq_equal = torch.equal(w.dequantize(torch.float32), w.dequantize(torch.float32, use_triton=False))
        ok = unwritten == 0 and rel < 1e-2 and deq_equal
        rows.append({"case": name, "rows": r, "rel_err": rel, "unwritten_rows": unwritten, "ok": ok})
        log.append(f"check {name:24s} rows={r:6d} rel={rel:.2e} unwritten={unwritten} "
                   f"triton-dequant==torch {deq_equal} {'OK' if ok else 'FAIL'}")
    return rows


def sweep(device: str, tokens: int, log: list[str]) -> dict[str, dict]:
    """Block sizes for the two calls the engine makes (gate_up with gather + SwiGLU, down with the routing
    weights), at `tokens` tokens; the best goes into int4_kernels.TUNED for the layer and model runs that follow."""
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    s = SHAPE
    best = {}
    # SWAP_AB (weights on the MMA's M side) won every earlier sweep at these sizes. Measured 2026-11-29 and
    # dropped: one K=128 dot per block (no faster); codes OR-ed into a float's mantissa with the zero point taken
    # off after the dot (no faster); a register cap (maxnreg 96/128: within 1%). ncu showed the kernel
    # latency-bound at 3 blocks per SM (168 registers); scaling the weights before the dot (one accumulator, not
    # two) took gate_up from 268 to 216 us and down from 144 to 128 us.
    configs = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=nw, num_stages=st, SWAP_AB=True, EVICT=False)
               for bm in (32, 64) for bn in (32, 64, 128) for nw, st in ((4, 2), (4, 3), (8, 3))]
    rows = tokens * s["top_k"]
    for name, n, k, swiglu in (("gate_up", 2 * s["inter"], s["hidden"], True), ("down", s["hidden"], s["inter"], False)):
        w = random_int4(s["experts"], n, k, s["group"], device, sym=True)
        offsets = routed_offsets(tokens, s["experts"], s["top_k"], device)
        if swiglu:  # the unsorted tokens, read through the sort's row index
            x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
            kw = {"row_index": torch.randint(0, tokens, (rows,), device=device, dtype=torch.int32), "swiglu": True}
        else:
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
            kw = {"row_scale": torch.rand(rows, device=device, dtype=torch.bfloat16)}
        default = pick_config(rows, s["experts"], n, k, s["group"], swiglu)
        ms_default = do_bench(partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, s["group"], **kw),
                              warmup=20, rep=100)
        timings = []
        for cfg in configs:
            call = partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, s["group"], cfg, **kw)
            try:
                timings.append((do_bench(call, warmup=20, rep=60), cfg))
            except Exception as e:  # a config that does not compile (shared memory) is skipped
                log.append(f"sweep {name} {cfg}: {type(e).__name__}")
        timings.sort(key=lambda t: t[0])
        for _, cfg in timings[:3]:  # do eviction hints help the best few?
            cfg = dict(cfg, EVICT=True)
            call = partial(int4_grouped_mm, x, w.qweight, w.scales, w.zeros, offsets, s["group"], cfg, **kw)
            timings.append((do_bench(call, warmup=20, rep=60), cfg))
        timings.sort(key=lambda t: t[0])
        nbytes = w.nbytes()
        int4_kernels.TUNED[(n, k, swiglu, rows_bucket(rows, s["experts"]))] = timings[0][1]
        best[name] = {"best_ms": timings[0][0], "best": timings[0][1], "default_ms": ms_default, "default": default,
                      "weight_bytes": nbytes, "best_GBps": nbytes / timings[0][0] / 1e6}
        log.append(f"sweep {name}: default {default} {ms_default * 1e3:.1f} us; best {timings[0][1]} "
                   f"{timings[0][0] * 1e3:.1f} us ({nbytes / timings[0][0] / 1e6:.0f} GB/s of int4 weights)")
        for ms, cfg in timings[:6]:
            log.append(f"    {ms * 1e3:7.1f} us  {cfg}")
    return best


class Router(torch.nn.Module):
    def __init__(self, e: int, h: int, device: str):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(e, h, device=device, dtype=torch.bfloat16) * 0.05)


def bench_layer(device: str, tokens: int, log: list[str]) -> dict[str, float]:
    # lazy: transformers takes seconds to import and Triton is optional; only the GPU layer check needs them
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    from triton.testing import do_bench

    s = SHAPE
    torch.manual_seed(0)
    w_gu = torch.randn(s["experts"], 2 * s["inter"], s["hidden"], device=device, dtype=torch.bfloat16) * 0.02
    w_dn = torch.randn(s["experts"], s["hidden"], s["inter"], device=device, dtype=torch.bfloat16) * 0.02
    router = Router(s["experts"], s["hidden"], device)
    kw = dict(top_k=s["top_k"], norm_topk_prob=True)
    q_gu, q_dn = rtn_experts(w_gu), rtn_experts(w_dn)
    layers = {
        "int4 fused": GroupedMoE(router, q_gu, q_dn, **kw),
        "int4 dequant+grouped_mm": GroupedMoE(router, q_gu, q_dn, kernel="grouped_mm", **kw),
        "bf16 (same int4 values) grouped_mm": GroupedMoE(
            router, DenseExperts(q_gu.dequantize(torch.bfloat16)), DenseExperts(q_dn.dequantize(torch.bfloat16)), **kw),
    }
    cfg = Qwen3MoeConfig(hidden_size=s["hidden"], moe_intermediate_size=s["inter"], num_experts=s["experts"],
                         num_experts_per_tok=s["top_k"], norm_topk_prob=True)
    block = Qwen3MoeSparseMoeBlock(cfg).to(device, torch.bfloat16)
    block.gate.weight.data.copy_(router.weight.data)
    block.experts.gate_up_proj.data.copy_(w_gu)
    block.experts.down_proj.data.copy_(w_dn)
    cfg._experts_implementation = "grouped_mm"
    x = torch.randn(1, tokens, s["hidden"], device=device, dtype=torch.bfloat16)
    out = {}
    with torch.inference_mode():
        ref = layers["bf16 (same int4 values) grouped_mm"](x).double()
        for name in ("int4 fused", "int4 dequant+grouped_mm"):
            rel = float((layers[name](x).double() - ref).norm() / ref.norm())
            log.append(f"layer {name} vs bf16 of the same int4 values: rel {rel:.2e}")
            out[f"rel {name}"] = rel
        rel = float((block(x).double() - layers["int4 fused"](x).double()).norm() / ref.norm())
        log.append(f"layer int4 fused vs transformers BF16 block (quantization error included): rel {rel:.2e}")
        for name, layer in [*layers.items(), ("transformers bf16 block grouped_mm", block)]:
            ms = do_bench(lambda layer=layer: layer(x), warmup=50, rep=300)
            out[name] = ms
            log.append(f"layer {name:40s} {ms * 1e3:8.1f} us  ({getattr(layer, 'kernel_path', 'transformers')})")
        for name in ("int4 fused", "bf16 (same int4 values) grouped_mm"):
            layer = layers[name]
            static = x.clone()
            for _ in range(3):
                layer(static)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                layer(static)
            ms = do_bench(graph.replay, warmup=50, rep=300)
            out[f"{name} (CUDA graph)"] = ms
            log.append(f"layer {name + ' (CUDA graph)':40s} {ms * 1e3:8.1f} us")
    return out


def build_model(layers: int, device: str):
    from quantbench.models.build import moe_config, new_model
    from quantbench.models.families.qwen3_moe.family import SHAPES as SYNTHETIC_SHAPES

    config = moe_config(dict(SYNTHETIC_SHAPES["qwen3-30b-a3b"], num_hidden_layers=layers))
    return new_model(config, device, torch.bfloat16, seed=0).eval()


def decision_forward(model, ids):
    hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
    return model.lm_head(hidden[:, -1])


def bench_model(device: str, layers: int, tokens: int, log: list[str]) -> dict[str, float]:
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    out: dict[str, float] = {}
    t = time.perf_counter()
    model = build_model(layers, device)
    model.set_experts_implementation("grouped_mm")
    log.append(f"model: {layers} layers built in {time.perf_counter() - t:.1f} s, "
               f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated")
    ids = torch.randint(0, 151936, (1, tokens), device=device)

    def timed(label: str) -> None:
        with torch.inference_mode():
            for _ in range(3):
                decision_forward(model, ids)
            ms = do_bench(lambda: decision_forward(model, ids), warmup=300, rep=2000)
            out[label] = ms
            log.append(f"model {label:38s} {ms:8.2f} ms/decision")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                decision_forward(model, ids)
            ms = do_bench(graph.replay, warmup=300, rep=2000)
            out[label + " (CUDA graph)"] = ms
            log.append(f"model {label + ' (CUDA graph)':38s} {ms:8.2f} ms/decision")
            del graph

    bf16_experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    timed("bf16 transformers grouped_mm")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    t = time.perf_counter()
    path = install_grouped_moe(model, lambda i, ex: (rtn_experts(ex.gate_up_proj.data), rtn_experts(ex.down_proj.data)),
                               layout=moe_layout(model))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    int4_experts = experts_nbytes(model)
    log.append(f"int4 RTN of every layer in {time.perf_counter() - t:.1f} s; kernel path {path}; experts "
               f"{int4_experts / 2**30:.2f} GiB int4 vs {bf16_experts / 2**30:.2f} GiB bf16 "
               f"({100 * int4_experts / bf16_experts:.1f}%); allocated {before / 2**30:.1f} -> "
               f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    out["experts_bytes_int4"], out["experts_bytes_bf16"] = int4_experts, bf16_experts
    timed("int4 fused (quantbench grouped-moe)")
    for m in model.modules():
        if isinstance(m, GroupedMoE):
            m.kernel = "grouped_mm"
    with torch.inference_mode():
        for _ in range(2):
            decision_forward(model, ids)
        ms = do_bench(lambda: decision_forward(model, ids), warmup=300, rep=2000)
    out["int4 dequant+grouped_mm"] = ms
    log.append(f"model {'int4 dequant+grouped_mm':38s} {ms:8.2f} ms/decision")
    return out


def bench_gpu(layers: int, tokens: int, out_dir: Path, skip_sweep: bool) -> None:
    device = "cuda"
    log: list[str] = [f"{torch.cuda.get_device_name()} torch {torch.__version__}"]

    def flush() -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "moe_int4_gpu.md").write_text("\n".join(log) + "\n")
        print("\n".join(log[-1:]), flush=True)

    result = {"checks": check_kernel(device, log)}
    flush()
    if not all(r["ok"] for r in result["checks"]):
        print("\n".join(log))
        raise SystemExit("kernel check failed")
    if not skip_sweep:
        result["sweep"] = sweep(device, tokens, log)
        flush()
    for key, fn in (("layer", lambda: bench_layer(device, tokens, log)),
                    ("model", lambda: bench_model(device, layers, tokens, log))):
        try:
            result[key] = fn()
        except Exception as e:  # keep what was measured so far: the device time is scarce
            import traceback

            log.append(f"{key} FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
        flush()
    (out_dir / "moe_int4_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    flush()
    print("\n".join(log))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="where", required=True)
    cpu = sub.add_parser("cpu")
    cpu.add_argument("--records", type=int, default=40)
    cpu.add_argument("--dtype", default="bfloat16")
    cpu.add_argument("--chunks", type=lambda v: [int(c) for c in v.split(",")], default=None,
                     help="e.g. 24,18: compare CPU dequantization chunks of 2^24 and 2^18 elements")
    gpu = sub.add_parser("gpu")
    gpu.add_argument("--layers", type=int, default=48)
    gpu.add_argument("--tokens", type=int, default=512)
    gpu.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    gpu.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    if args.where == "cpu":
        bench_cpu(args.records, args.dtype, args.chunks)
    else:
        bench_gpu(args.layers, args.tokens, args.out, args.skip_sweep)


if __name__ == "__main__":
    main()
