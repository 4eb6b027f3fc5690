"""What the int4 grouped-MoE kernel spends its time on, at the Qwen3-30B-A3B shape (one 512-token decision).

    python benchmarks/profile_kernels.py                 # compiled resources + PTX/SASS instruction mix
    ncu --clock-control none -k regex:int4_grouped_mm -c 2 --section SpeedOfLight --section WarpStateStats \\
        --section MemoryWorkloadAnalysis --section Occupancy python benchmarks/profile_kernels.py --once

Prints, per projection (gate_up with gather + SwiGLU, down with the routing weights): registers, spills, shared
memory, which tensor-core instructions the PTX uses (wgmma = Hopper's warpgroup MMA, mma.sync = the older
per-warp MMA), the count of integer->float conversions and barriers, and the kernel time (do_bench, median).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.moe.int4 import rtn_experts  # noqa: E402
from quantbench.engine.moe.int4_kernels import int4_grouped_mm, pick_config  # noqa: E402

E, H, INTER, TOKENS, TOP_K = 128, 2048, 768, 512, 8


def calls():
    torch.manual_seed(0)
    rows = TOKENS * TOP_K
    ids = torch.rand(TOKENS, E, device="cuda").topk(TOP_K, dim=-1).indices.flatten()
    offsets = torch.cumsum(torch.bincount(ids, minlength=E), 0).to(torch.int32)
    gu = rtn_experts(torch.randn(E, 2 * INTER, H, device="cuda", dtype=torch.bfloat16) * 0.02)
    dn = rtn_experts(torch.randn(E, H, INTER, device="cuda", dtype=torch.bfloat16) * 0.02)
    x_tok = torch.randn(TOKENS, H, device="cuda", dtype=torch.bfloat16)
    row_index = torch.randint(0, TOKENS, (rows,), device="cuda", dtype=torch.int32)
    x_d = torch.randn(rows, INTER, device="cuda", dtype=torch.bfloat16)
    scale = torch.rand(rows, device="cuda", dtype=torch.bfloat16)
    return {
        "gate_up (gather+swiglu)": (lambda cfg=None: int4_grouped_mm(x_tok, gu.qweight, gu.scales, gu.zeros, offsets, 128,
                                                                     cfg, row_index=row_index, swiglu=True), gu),
        "down (row_scale)": (lambda cfg=None: int4_grouped_mm(x_d, dn.qweight, dn.scales, dn.zeros, offsets, 128, cfg,
                                                              row_scale=scale), dn),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--once", action="store_true", help="one launch of each kernel (for ncu)")
    args = ap.parse_args()
    for name, (call, w) in calls().items():
        call()
        torch.cuda.synchronize()
        if args.once:
            continue
        # lazy: Triton is optional (not on CPU installs) and takes about 1 s to import; only the GPU runs use it
        from triton.testing import do_bench

        k = int4_grouped_mm.last_compiled
        ptx = k.asm.get("ptx", "")
        sass = k.asm.get("sass", "") if "sass" in k.asm else ""
        mix = {op: len(re.findall(pat, ptx)) for op, pat in {
            "wgmma": r"wgmma\.mma_async", "mma.sync": r"\bmma\.sync", "cvt.rn.f32.s32/u32 (I2F)": r"cvt\.rn\.f32\.[su]32",
            "cvt bf16": r"cvt\.rn\.bf16", "bar.sync": r"\bbar\.sync", "ld.global": r"\bld\.global", "cp.async": r"cp\.async\.",
            "ld.shared": r"\bld\.shared", "st.shared": r"\bst\.shared", "ldmatrix": r"ldmatrix"}.items()}
        ms = do_bench(call, warmup=25, rep=200, return_mode="median")
        print(f"{name}: config {pick_config(TOKENS * TOP_K, E, w.out_features, w.in_features, 128, 'gate' in name)}")
        print(f"  registers {k.n_regs}, spills {k.n_spills}, shared {k.metadata.shared} B, {ms * 1e3:.1f} us, "
              f"{w.nbytes() / ms / 1e6:.0f} GB/s of int4 weights")
        print("  PTX instruction counts (static): " + ", ".join(f"{op} {n}" for op, n in mix.items()))
        ttgir = k.asm.get("ttgir", "")
        print("  TTGIR op counts: " + ", ".join(f"{op} {ttgir.count(op)}" for op in (
            "ttg.convert_layout", "ttg.local_alloc", "ttg.local_load", "ttg.local_store", "ttng.warp_group_dot ",
            "ttng.warp_group_dot_wait", "ttg.async_copy_global_to_local", "ttng.async_tma_copy")))
        waits = re.findall(r"ttng\.warp_group_dot_wait.*?pendings = (\d+)", ttgir)
        print(f"  waits for the tensor-core dots: {len(waits)}, pendings {sorted(set(waits))}")
        for line in ttgir.splitlines():  # the dot operands' layouts: registers (dot_op) or shared memory
            if "ttng.warp_group_dot " in line:
                print("  " + line.strip()[:400])
                break
        if sass:
            print("  SASS: " + ", ".join(f"{op} {len(re.findall(op, sass))}" for op in ("HGMMA", "HMMA", "I2F", "F2F", "BAR")))


if __name__ == "__main__":
    main()
