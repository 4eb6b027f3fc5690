"""Check and time quantbench's NVFP4 and FP8 grouped-MoE kernels on a CUDA GPU at the Qwen3-30B-A3B layer shape.

    python benchmarks/nvfp4_fp8_gpu.py [--out DIR] [--model-layers 48] [--skip-model]

1. Correctness, on fresh random inputs (128 experts, hidden 2048, moe_intermediate 768, 512 tokens routed top-8):
   the fused Triton kernels (NVFP4; FP8 with BF16 and with E4M3 operands) against dequantize + a float32
   matmul; quantbench's NVFP4 quantizer against ModelOpt's NVFP4QTensor, and its activation fake-quant against
   ModelOpt's own Triton kernel (`fp4_fake_quant_block`), when ModelOpt is importable; FP8 dense `_scaled_mm`
   against its emulation. Outputs are poisoned with NaN before each kernel run.
2. Speed (triton.testing.do_bench, median ms): each projection, block-size variants, a whole GroupedMoE layer
   per format, and (unless --skip-model) one 512-token decision forward of the whole random-weight model
   (BF16 transformers grouped_mm, quantbench BF16, NVFP4 packed W4A4 / W4A16, FP8), from Python and replayed
   as a CUDA graph; weights memory measured from the tensors and torch.cuda.memory_allocated.
Writes `nvfp4_fp8_gpu.json` and `nvfp4_fp8_gpu.md` to --out (default $OUT or .), prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe import fp8, nvfp4, nvfp4_numbers  # noqa: E402
from quantbench.engine.moe.engine import DenseExperts, GroupedMoE, _grouped_matmul  # noqa: E402

E, H, INTER, TOKENS, TOP_K = 128, 2048, 768, 512, 8
DEV = "cuda"
ROWS: list[dict] = []
CHECKS: list[dict] = []


def allocated_gib() -> float:
    return torch.cuda.memory_allocated() / 2**30 if DEV == "cuda" else float("nan")


def empty_cache() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm()).item()


def check(name: str, err: float, limit: float) -> None:
    ok = err == err and err <= limit
    CHECKS.append({"check": name, "rel_err": err, "limit": limit, "ok": ok})
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {err:.2e} (limit {limit:.0e})", flush=True)


def bench(name: str, fn, bytes_moved: int | None = None, rep: int = 200, **extra) -> float:
    if DEV == "cpu":  # --smoke: run the code path once, time nothing
        fn()
        return float("nan")
    # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
    from triton.testing import do_bench

    ms = do_bench(fn, warmup=25, rep=rep, return_mode="median")
    row = {"what": name, "ms": round(ms, 4), **extra}
    if bytes_moved:
        row["GB/s"] = round(bytes_moved / ms / 1e6, 1)
    ROWS.append(row)
    print(f"{name}: {ms:.4f} ms {extra}", flush=True)
    return ms


def poison() -> None:
    """Fill the allocator's free blocks with NaN so that an output the kernel leaves unwritten shows."""
    if DEV == "cpu":
        return
    free = torch.cuda.mem_get_info()[0]
    junk = torch.full((min(free // 8, 2 << 30) // 2,), float("nan"), dtype=torch.bfloat16, device=DEV)
    del junk


def routing(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """512 tokens, each to 8 distinct random experts: expert-sorted row -> token map and int32 offsets."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    index = torch.rand(TOKENS, E, device=DEV, generator=g).topk(TOP_K, dim=-1).indices
    experts, perm = index.reshape(-1).sort()
    offsets = torch.cumsum(torch.bincount(experts, minlength=E), 0, dtype=torch.int32)
    return perm // TOP_K, offsets, experts


def ref_grouped(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """float32 reference: each row times its expert's dequantized weight."""
    out = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=torch.float32)
    for e in range(w.shape[0]):
        rows = (experts == e).nonzero().flatten()
        if rows.numel():
            out[rows] = x[rows].float() @ w[e].float().T
    return out


def kernels() -> dict:
    torch.manual_seed(0)
    _, offsets, experts = routing(1)
    s = offsets[-1].item()
    w_gu = torch.randn(E, 2 * INTER, H, device=DEV, dtype=torch.bfloat16) * 0.02
    w_d = torch.randn(E, H, INTER, device=DEV, dtype=torch.bfloat16) * 0.02
    sizes = {}

    # quantbench's NVFP4 quantizer against ModelOpt's, on the real-shape weights
    gu = nvfp4.Nvfp4Experts.from_weights(w_gu)
    dn = nvfp4.Nvfp4Experts.from_weights(w_d)
    try:
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

        q, bs, gs = NVFP4QTensor.quantize(w_gu[5].clone(), 16)
        same = torch.equal(q._quantized_data, gu.packed[5]) and torch.equal(bs.view(torch.uint8), gu.block_scale[5].view(torch.uint8))
        check("nvfp4 quantize == ModelOpt NVFP4QTensor (expert 5, bit-identical)", 0.0 if same else 1.0, 0.0)
        if DEV != "cuda":
            raise ImportError("ModelOpt's fake-quant kernel needs CUDA")
        from modelopt.torch.kernels.quantization.gemm.fp4_kernel_hopper import fp4_fake_quant_block

        xa = torch.randn(TOKENS, H, device=DEV, dtype=torch.bfloat16) * 3
        amax = xa.float().abs().amax() * 0.8
        theirs = fp4_fake_quant_block(xa, amax)
        mine = nvfp4_numbers.fake_quantize_activations(xa, nvfp4_numbers.global_scale_of(amax))
        frac = (theirs != mine).float().mean().item()
        check("nvfp4 activation fake-quant (torch) vs ModelOpt fp4_fake_quant_block (fraction of elements differing)", frac, 1e-4)
        fused = nvfp4.fake_quantize_activations_fused(xa, nvfp4_numbers.global_scale_of(amax).reshape(1))
        frac = (theirs != fused).float().mean().item()
        check("nvfp4 activation fake-quant (fused Triton) vs ModelOpt fp4_fake_quant_block (fraction differing)", frac, 1e-4)
    except Exception as e:  # not importable here, or failing: say so, go on with the rest
        print(f"ModelOpt reference skipped: {type(e).__name__}: {e}", flush=True)

    for name, fmt, wq, k in (("nvfp4 gate_up", gu, w_gu, H), ("nvfp4 down", dn, w_d, INTER)):
        for seed in (2, 3):
            x = torch.randn(s, k, device=DEV, dtype=torch.bfloat16)
            poison()
            y = nvfp4.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale, offsets)
            ref = ref_grouped(x, fmt.dequantize(torch.bfloat16), experts)
            check(f"{name} fused vs dequant+fp32 (inputs seed {seed})", rel(y, ref), 5e-3)
        sizes[name] = fmt.nbytes()
        sizes[name.replace("nvfp4", "bf16")] = wq.numel() * 2

    f_gu = fp8.Fp8Experts.from_weights(w_gu, input_scale=torch.tensor([4.0 / 448], device=DEV))
    f_dn = fp8.Fp8Experts.from_weights(w_d, input_scale=torch.tensor([1.0 / 448], device=DEV))
    for name, fmt, k in (("fp8 gate_up", f_gu, H), ("fp8 down", f_dn, INTER)):
        x = torch.randn(s, k, device=DEV, dtype=torch.bfloat16)
        xq = fmt.quantize_input(x, offsets)
        ref = ref_grouped(xq, fmt.dequantize(torch.bfloat16), experts)
        poison()
        check(f"{name} fused bf16-operand vs dequant+fp32", rel(fp8.fp8_grouped_mm(xq, fmt.weight, fmt.scale, offsets), ref), 5e-3)
        poison()
        native = fp8.fp8_grouped_mm(xq, fmt.weight, fmt.scale, offsets, input_scale=fmt.input_scale)
        check(f"{name} fused E4M3-operand (native) vs dequant+fp32", rel(native, ref), 1e-2)
        sizes[name] = fmt.nbytes()
    # the engine's fused steps on the native path (gather + SwiGLU, routing weights + scatter), in the configurations
    # the engine picks at ~32 rows per expert and in the large-batch ones, against the unfused reference
    if DEV != "cpu":  # the tuned tiles need the real shape's K
        tokens = s // 8
        x = torch.randn(tokens, H, device=DEV, dtype=torch.bfloat16)
        row_index = torch.randint(0, tokens, (s,), device=DEV, dtype=torch.int32)
        g, u = ref_grouped(f_gu.quantize_input(x[row_index], offsets), f_gu.dequantize(torch.bfloat16), experts).chunk(2, -1)
        ref_h = torch.nn.functional.silu(g) * u
        h = torch.randn(s, INTER, device=DEV, dtype=torch.bfloat16)
        rs, dest = torch.rand(s, device=DEV).bfloat16(), torch.randperm(s, device=DEV).int()
        ref_y = torch.empty(s, H, device=DEV)
        ref_y[dest.long()] = ref_grouped(f_dn.quantize_input(h, offsets), f_dn.dequantize(torch.bfloat16), experts) * rs.float()[:, None]
        for bucket in ("mid", "large"):
            cfg_gu, cfg_dn = fp8.TUNED[(2 * INTER, H, bucket)], fp8.TUNED[(H, INTER, bucket)]
            poison()
            got = fp8.fp8_grouped_mm(x, f_gu.weight, f_gu.scale, offsets, input_scale=f_gu.input_scale, config=cfg_gu,
                                     row_index=row_index, swiglu=True)
            check(f"fp8 gate_up gather+SwiGLU native, {bucket} config, vs unfused dequant+fp32", rel(got, ref_h), 1e-2)
            poison()
            got = fp8.fp8_grouped_mm(h, f_dn.weight, f_dn.scale, offsets, input_scale=f_dn.input_scale, config=cfg_dn,
                                     row_scale=rs, row_dest=dest)
            check(f"fp8 down routing weights+scatter native, {bucket} config, vs unfused dequant+fp32", rel(got, ref_y), 1e-2)
            # E4M3 codes between the projections (one input scale each): the same bits as bf16 h, in both kernels
            h_bf16 = fp8.fp8_grouped_mm(x, f_gu.weight, f_gu.scale, offsets, input_scale=f_gu.input_scale,
                                        config=cfg_gu, row_index=row_index, swiglu=True)
            h_codes = fp8.fp8_grouped_mm(fp8.fp8_codes(x, f_gu.input_scale[:1]), f_gu.weight, f_gu.scale, offsets,
                                         input_scale=f_gu.input_scale, config=cfg_gu, row_index=row_index, swiglu=True,
                                         out_scale=f_dn.input_scale[:1])
            same = torch.equal(h_codes.view(torch.uint8), fp8.fp8_codes(h_bf16, f_dn.input_scale[:1]).view(torch.uint8))
            check(f"fp8 gate_up E4M3 codes in and out, {bucket} config, vs codes of its bf16 output (mismatches)",
                  0.0 if same else 1.0, 0.5)
            y_bf16, y_codes = (fp8.fp8_grouped_mm(v, f_dn.weight, f_dn.scale, offsets, input_scale=f_dn.input_scale,
                                                  config=cfg_dn, row_scale=rs, row_dest=dest) for v in (h_bf16, h_codes))
            check(f"fp8 down from E4M3 codes vs from bf16 h, {bucket} config (max |diff|)",
                  float((y_bf16.float() - y_codes.float()).abs().max()), 1e-30)

    if DEV != "cpu":  # the same fused steps in the NVFP4 kernel (weights only: x as given), both orientations
        g, u = ref_grouped(x[row_index], gu.dequantize(torch.bfloat16), experts).chunk(2, -1)
        ref_h = torch.nn.functional.silu(g) * u
        ref_y = torch.empty(s, H, device=DEV)
        ref_y[dest.long()] = ref_grouped(h, dn.dequantize(torch.bfloat16), experts) * rs.float()[:, None]
        for swap in (False, True):
            cfg = nvfp4.pick_config(s, E, 2 * INTER, H) if not swap else dict(
                BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3, SWAP_AB=True)
            poison()
            got = nvfp4.nvfp4_grouped_mm(x, gu.packed, gu.block_scale, gu.global_scale, offsets, cfg,
                                         row_index=row_index, swiglu=True)
            check(f"nvfp4 gate_up gather+SwiGLU, SWAP_AB={swap}, vs unfused dequant+fp32", rel(got, ref_h), 5e-3)
            poison()
            got = nvfp4.nvfp4_grouped_mm(h, dn.packed, dn.block_scale, dn.global_scale, offsets, cfg,
                                         row_scale=rs, row_dest=dest)
            check(f"nvfp4 down routing weights+scatter, SWAP_AB={swap}, vs unfused dequant+fp32", rel(got, ref_y), 5e-3)

    w, sc = fp8.quantize(torch.randn(1, 4096, 2048, device=DEV) * 0.02)
    lin = fp8.Fp8Linear(w[0], sc[0, :1], torch.tensor(3.0 / 448, device=DEV), None)
    x = torch.randn(TOKENS, 2048, device=DEV, dtype=torch.bfloat16)
    emul = torch.nn.functional.linear(fp8.fake_quantize_activations(x, lin.input_scale), fp8.dequantize(lin.weight, lin.scale, x.dtype))
    try:
        check("fp8 dense torch._scaled_mm vs emulation", rel(lin(x), emul), 1e-2)
        bench("fp8 dense 512x2048 -> 4096 torch._scaled_mm", lambda: lin(x))
    except RuntimeError as e:
        print(f"_scaled_mm failed: {e}", flush=True)
        CHECKS.append({"check": "fp8 dense torch._scaled_mm", "error": str(e)[:300], "ok": False})
    bench("fp8 dense 512x2048 -> 4096 emulated", lambda: torch.nn.functional.linear(
        fp8.fake_quantize_activations(x, lin.input_scale), fp8.dequantize(lin.weight, lin.scale, x.dtype)))

    # -- per projection speed ----------------------------------------------------------------------------------------
    x_gu = torch.randn(s, H, device=DEV, dtype=torch.bfloat16)
    x_d = torch.randn(s, INTER, device=DEV, dtype=torch.bfloat16)
    wt_gu, wt_d = w_gu.transpose(-2, -1), w_d.transpose(-2, -1)
    bench("bf16 torch._grouped_mm gate_up", lambda: _grouped_matmul(x_gu, wt_gu, offsets), sizes["bf16 gate_up"])
    bench("bf16 torch._grouped_mm down", lambda: _grouped_matmul(x_d, wt_d, offsets), sizes["bf16 down"])
    configs = [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
               {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
               {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4},
               {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}]
    for cfg in configs:
        label = "M{BLOCK_M} N{BLOCK_N} K{BLOCK_K} w{num_warps} s{num_stages}".format(**cfg)
        try:
            bench(f"nvfp4 fused gate_up [{label}]", lambda c=cfg: nvfp4.nvfp4_grouped_mm(
                x_gu, gu.packed, gu.block_scale, gu.global_scale, offsets, config=c), sizes["nvfp4 gate_up"])
            bench(f"nvfp4 fused down [{label}]", lambda c=cfg: nvfp4.nvfp4_grouped_mm(
                x_d, dn.packed, dn.block_scale, dn.global_scale, offsets, config=c), sizes["nvfp4 down"])
        except Exception as e:  # a config the compiler refuses (shared memory): record and go on
            print(f"config {label} failed: {e}", flush=True)
    bench("nvfp4 dequant(all)+grouped_mm gate_up", lambda: _grouped_matmul(
        x_gu, gu.dequantize(torch.bfloat16).transpose(-2, -1), offsets))
    s_in = torch.tensor([3 / 2688], device=DEV)
    bench("nvfp4 activation fake-quant 4096x2048 fused Triton", lambda: nvfp4.fake_quantize_activations_fused(x_gu, s_in))
    bench("nvfp4 activation fake-quant 4096x2048 torch", lambda: nvfp4_numbers.fake_quantize_activations(x_gu, s_in))
    bench("fp8 activation fake-quant 4096x2048 torch", lambda: fp8.fake_quantize_activations(x_gu, f_gu.input_scale))
    bench("fp8 fused gate_up (bf16 operands)", lambda: fp8.fp8_grouped_mm(x_gu, f_gu.weight, f_gu.scale, offsets),
          sizes["fp8 gate_up"])
    bench("fp8 fused gate_up (E4M3 operands)", lambda: fp8.fp8_grouped_mm(
        x_gu, f_gu.weight, f_gu.scale, offsets, input_scale=f_gu.input_scale), sizes["fp8 gate_up"])
    bench("fp8 fused down (E4M3 operands)", lambda: fp8.fp8_grouped_mm(
        x_d, f_dn.weight, f_dn.scale, offsets, input_scale=f_dn.input_scale), sizes["fp8 down"])

    # -- one whole MoE layer per format (route, sort, both projections, activation quant, scatter) ------------------
    router = torch.nn.Linear(H, E, bias=False, device=DEV, dtype=torch.bfloat16)
    hidden = torch.randn(TOKENS, H, device=DEV, dtype=torch.bfloat16)
    layers = {
        "bf16 (DenseExperts)": GroupedMoE(router, DenseExperts(w_gu), DenseExperts(w_d), top_k=8, norm_topk_prob=True),
        "nvfp4 packed w4a4": GroupedMoE(router, nvfp4.Nvfp4Experts(gu.packed, gu.block_scale, gu.global_scale, torch.tensor([3 / 2688], device=DEV)),
                                        nvfp4.Nvfp4Experts(dn.packed, dn.block_scale, dn.global_scale, torch.tensor([1 / 2688], device=DEV)),
                                        top_k=8, norm_topk_prob=True),
        "nvfp4 packed w4a16": GroupedMoE(router, gu, dn, top_k=8, norm_topk_prob=True),
        "nvfp4 unpacked w4a16": GroupedMoE(router, gu.unpacked(torch.bfloat16), dn.unpacked(torch.bfloat16), top_k=8, norm_topk_prob=True),
        "fp8 w8a8": GroupedMoE(router, f_gu, f_dn, top_k=8, norm_topk_prob=True),
    }
    with torch.inference_mode():
        fused = layers["nvfp4 packed w4a4"](hidden)
        layers["nvfp4 packed w4a4"].kernel = "grouped_mm"
        check("nvfp4 w4a4 layer: fused kernel vs dequant+grouped_mm", rel(fused, layers["nvfp4 packed w4a4"](hidden)), 5e-3)
        layers["nvfp4 packed w4a4"].kernel = "auto"
        for name, layer in layers.items():
            layer(hidden)
            bench(f"MoE layer {name}", lambda m=layer: m(hidden), kernel=layer.kernel_path,
                  experts_MiB=round((layer.gate_up.nbytes() + layer.down.nbytes()) / 2**20, 1))
    return sizes


def whole_model(layers: int) -> None:
    """One 512-token decision forward (batch 1, logits of the last token) of the random-weight 30B-A3B shape."""
    from quantbench.engine.moe.engine import install_grouped_moe
    from quantbench.models.build import moe_config, new_model
    from quantbench.models.families import moe_layout
    from quantbench.models.families.qwen3_moe.family import SHAPES as SYNTHETIC_SHAPES

    dims = dict(SYNTHETIC_SHAPES["qwen3-30b-a3b"], num_hidden_layers=layers)
    t0 = time.perf_counter()
    model = new_model(moe_config(dims, pad_token_id=0, eos_token_id=1, bos_token_id=None), DEV, torch.bfloat16, 0).eval()
    print(f"built {layers}-layer model in {time.perf_counter() - t0:.1f} s; {allocated_gib():.1f} GiB", flush=True)
    ids = torch.randint(0, 151936, (1, 512), device=DEV)

    def forward():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    def run(name: str, graph: bool = True) -> None:
        with torch.inference_mode():
            forward()
            ms = bench(f"model {layers}L 512-token decision: {name}", forward, rep=800,
                       weights_GiB=round(allocated_gib(), 2))
            if not graph or DEV != "cuda":
                return
            try:
                static = torch.cuda.Stream()
                static.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(static):
                    for _ in range(3):
                        forward()
                torch.cuda.current_stream().wait_stream(static)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    forward()
                bench(f"model {layers}L 512-token decision: {name} (CUDA graph replay)", g.replay, rep=500,
                      python_ms=round(ms, 2))
                del g
            except Exception as e:
                print(f"graph capture failed for {name}: {e}", flush=True)
                ROWS.append({"what": f"graph {name}", "error": str(e)[:200]})

    model.set_experts_implementation("grouped_mm")
    run("bf16 transformers grouped_mm", graph=False)
    # BF16 weights kept in quantbench's engine; each variant is built from them, timed, and dropped
    install_grouped_moe(model, lambda i, ex: (DenseExperts(ex.gate_up_proj.data), DenseExperts(ex.down_proj.data)),
                        layout=moe_layout(model))
    empty_cache()
    run("bf16 quantbench engine")
    moes = [m for m in model.modules() if isinstance(m, GroupedMoE)]
    bf16 = [(m.gate_up, m.down) for m in moes]

    def swap(make) -> None:
        for m, (a, b) in zip(moes, bf16, strict=True):
            m.gate_up, m.down = make(a.weight), make(b.weight)
        empty_cache()

    amax = torch.tensor([3.0], device=DEV)
    for acts in (True, False):
        swap(lambda w, a=acts: nvfp4.Nvfp4Experts.from_weights(w, input_scale=nvfp4_numbers.global_scale_of(amax), activations=a))
        experts = sum(m.gate_up.nbytes() + m.down.nbytes() for m in moes)
        ROWS.append({"what": f"model {layers}L nvfp4 packed experts bytes", "GiB": round(experts / 2**30, 2)})
        run(f"nvfp4 packed {'w4a4' if acts else 'w4a16'}")
    swap(lambda w: fp8.Fp8Experts.from_weights(w, input_scale=amax / 448))
    ROWS.append({"what": f"model {layers}L fp8 experts bytes",
                 "GiB": round(sum(m.gate_up.nbytes() + m.down.nbytes() for m in moes) / 2**30, 2)})
    run("fp8 w8a8 (E4M3 operands)")
    ROWS.append({"what": f"model {layers}L bf16 experts bytes",
                 "GiB": round(sum(a.nbytes() + b.nbytes() for a, b in bf16) / 2**30, 2)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--model-layers", type=int, default=48)
    parser.add_argument("--skip-model", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = parser.parse_args()
    if args.smoke:
        global DEV, E, H, INTER, TOKENS
        DEV, E, H, INTER, TOKENS = "cpu", 8, 256, 128, 32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0) if DEV == "cuda" else None
    meta = {"gpu": props.name if props else "cpu (smoke)", "cc": f"{props.major}.{props.minor}" if props else "-",
            "torch": torch.__version__,
            "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M")}
    print(meta, flush=True)
    sizes = {}
    try:
        sizes = kernels()
    except Exception:
        traceback.print_exc()
    write(out, meta, sizes)
    if not args.skip_model:
        try:
            whole_model(args.model_layers)
        except Exception:
            traceback.print_exc()
    write(out, meta, sizes)


def write(out: Path, meta: dict, sizes: dict) -> None:
    (out / "nvfp4_fp8_gpu.json").write_text(json.dumps({"meta": meta, "checks": CHECKS, "rows": ROWS,
                                                         "bytes_per_layer": sizes}, indent=1))
    lines = [f"# NVFP4 / FP8 kernels on {meta['gpu']} (cc {meta['cc']}), torch {meta['torch']}, triton {meta['triton']}",
             "", "| check | rel err | limit | ok |", "|---|---|---|---|"]
    lines += [f"| {c['check']} | {c.get('rel_err', c.get('error'))} | {c.get('limit', '')} | {c['ok']} |" for c in CHECKS]
    lines += ["", "| what | ms | details |", "|---|---|---|"]
    lines += [f"| {r['what']} | {r.get('ms', '')} | {', '.join(f'{k}={v}' for k, v in r.items() if k not in ('what', 'ms'))} |"
              for r in ROWS]
    lines += ["", f"bytes per layer: {sizes}"]
    (out / "nvfp4_fp8_gpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
