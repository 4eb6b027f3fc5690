"""Where a batched forward spends its GPU time, at the Qwen3-30B-A3B shape (random BF16 weights, transformers'
`grouped_mm` experts), run eagerly: per-decision time at batch 1 / 8 / 16 / 32 of 512 tokens, then the CUDA
kernels of one batch-8 and one batch-32 forward by GPU time (torch.profiler).

    python benchmarks/batch_profile.py [--layers 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.moe_int4 import build_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    model = build_model(args.layers, "cuda")
    model.set_experts_implementation("grouped_mm")
    decoder = model.get_decoder()
    with torch.inference_mode():
        for batch in (1, 8, 16, 32):
            ids = torch.randint(0, 3000, (batch, 512), device="cuda")
            for _ in range(2):
                decoder(input_ids=ids, use_cache=False)
            times = []
            for _ in range(5):
                torch.cuda.synchronize()
                t = time.perf_counter()
                decoder(input_ids=ids, use_cache=False)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1e3)
            print(f"{args.layers} layers, batch {batch} x 512: {statistics.median(times):.1f} ms eager", flush=True)
        for batch in (8, 32):
            ids = torch.randint(0, 3000, (batch, 512), device="cuda")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                decoder(input_ids=ids, use_cache=False)
                torch.cuda.synchronize()
            print(f"--- batch {batch}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
