"""Where one 512-token decision spends its GPU time, kernel by kernel, at the Qwen3-30B-A3B shape (random weights).

    python benchmarks/model_profile.py [--layers 8] [--tokens 512] [--batch 1] [--formats bf16,int4,fp8,nvfp4]

For BF16 (transformers `grouped_mm` experts) with transformers' RMSNorm / rotary ops and with quantbench's fused
ones, and for INT4 (quantbench's grouped-MoE engine, with the expert-grouping kernels and with the sort path): the
CUDA-graph replay time of the decision forward, the kernels of one eager forward (torch.profiler), each with its
calls and GPU time per layer, and their sum; and how far the outputs move between the paths. `fp8` and `nvfp4`
profile those formats' engines (experts quantized in memory from the same weights, one fixed input scale
per projection: right for timing, not for quality). Kernel time is what a CUDA-graph replay cannot hide: launch overhead goes,
the kernels stay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_int4 import build_model, decision_forward  # noqa: E402
from quantbench.engine import fused  # noqa: E402
from quantbench.engine.moe import engine, install_grouped_moe  # noqa: E402
from quantbench.engine.moe.engine import triton_available  # noqa: E402
from quantbench.engine.moe.int4 import rtn_experts  # noqa: E402
from quantbench.models.families import moe_layout  # noqa: E402


def graph_ms(model, ids) -> float:
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    for _ in range(3):
        decision_forward(model, ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decision_forward(model, ids)
    ms = do_bench(graph.replay, warmup=50, rep=500)
    del graph
    return ms


def kernel_table(model, ids, layers: int, label: str, rows: int) -> None:
    decision_forward(model, ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decision_forward(model, ids)
        torch.cuda.synchronize()
    # a kernel's row has self device time; an operator's row only counts its kernels' (not self) time
    per = {ev.key: (ev.count, ev.self_device_time_total) for ev in prof.key_averages() if ev.self_device_time_total > 0}
    total = sum(t for _, t in per.values())
    print(f"--- {label}: {len(per)} kernels, {sum(c for c, _ in per.values()) / layers:.0f} launches and "
          f"{total / layers:.1f} us of GPU time per layer ({total / 1e3:.2f} ms per forward)")
    for name, (calls, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:rows]:
        print(f"  {us / layers:8.1f} us {calls / layers:5.1f}x  {name[:110]}")


def compare(label: str, a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.float(), b.float()
    print(f"{label}: last-token logits max |diff| {float((a - b).abs().max()):.3g} (of max |logit| "
          f"{float(a.abs().max()):.3g}), same top token: {bool((a.argmax(-1) == b.argmax(-1)).all())}", flush=True)


def quantized_engine(model, fmt: str) -> None:
    """Swap every MoE block for quantbench's engine over `fmt` experts quantized from the model's own weights."""
    from quantbench.engine.moe.fp8 import E4M3_MAX, Fp8Experts
    from quantbench.engine.moe.nvfp4 import Nvfp4Experts

    def make(weight):
        if fmt == "int4":
            return rtn_experts(weight)
        amax = torch.full((1,), 8.0, device=weight.device)  # a fixed activation range: timing, not quality
        if fmt == "fp8":
            return Fp8Experts.from_weights(weight, input_scale=amax / E4M3_MAX)
        return Nvfp4Experts.from_weights(weight, input_scale=amax / (6.0 * 448.0))

    install_grouped_moe(model, lambda i, ex: (make(ex.gate_up_proj.data), make(ex.down_proj.data)),
                        layout=moe_layout(model))
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1, help="decisions per forward (32: the throughput goal's batch)")
    ap.add_argument("--rows", type=int, default=30, help="kernels listed per table")
    ap.add_argument("--formats", default="bf16,int4", help="comma-separated: bf16 (transformers, with and without "
                    "the fused ops), int4 (also the sort path), fp8, nvfp4 (quantbench's engine, fused ops)")
    args = ap.parse_args()
    formats = args.formats.split(",")
    ids = torch.randint(0, 151936, (args.batch, args.tokens), device="cuda")
    with torch.inference_mode():
        for fmt in formats:
            model = build_model(args.layers, "cuda")
            model.set_experts_implementation("grouped_mm")
            if fmt == "bf16":
                plain = decision_forward(model, ids)
                print(f"BF16 transformers grouped_mm, {args.layers} layers: CUDA graph {graph_ms(model, ids):.2f} ms",
                      flush=True)
                kernel_table(model, ids, args.layers, "BF16 transformers grouped_mm", args.rows)
            print(f"fused ops: {fused.install(model)}")
            if fmt == "bf16":
                compare("BF16 fused ops vs transformers' ops", plain, decision_forward(model, ids))
                print(f"BF16 + fused ops: CUDA graph {graph_ms(model, ids):.2f} ms", flush=True)
                kernel_table(model, ids, args.layers, "BF16 transformers grouped_mm + fused ops", args.rows)
                continue
            quantized_engine(model, fmt)
            grouped = decision_forward(model, ids)
            label = f"{fmt.upper()} grouped-MoE + fused ops"
            print(f"{label}: CUDA graph {graph_ms(model, ids):.2f} ms", flush=True)
            kernel_table(model, ids, args.layers, label, args.rows)
            if fmt == "int4":
                engine.triton_available = lambda: False  # the sort path the engine takes without Triton
                compare("INT4 sort path vs expert-grouping kernels", grouped, decision_forward(model, ids))
                print(f"INT4 sort path + fused ops: CUDA graph {graph_ms(model, ids):.2f} ms", flush=True)
                engine.triton_available = triton_available
            if fmt == "fp8":  # h handed to down as bf16 (each kernel rounding its own input) instead of E4M3 codes
                codes_scale, engine.GroupedMoE._codes_scale = engine.GroupedMoE._codes_scale, lambda self, x: None
                compare("FP8 bf16 h vs E4M3 codes between the projections", grouped, decision_forward(model, ids))
                print(f"FP8 without codes between the projections: CUDA graph {graph_ms(model, ids):.2f} ms", flush=True)
                engine.GroupedMoE._codes_scale = codes_scale
            del model, grouped
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
