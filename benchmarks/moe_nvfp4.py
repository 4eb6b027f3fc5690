"""NVFP4 packed vs unpacked vs BF16 on the embedded default model: experts memory and latency per decision.

    python benchmarks/moe_nvfp4.py [--records 40] [--device cpu] [--activations on|off]

Loads the fixture (BF16) and its cached NVFP4 variant (made by ModelOpt on first use) through the backends, times
`engine.forward` on the first N records of the built-in suite (after 3 warm-up decisions), and prints a table
with the experts' bytes (measured from the tensors) and the median / p90 latency, then the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.protocol.suite import load_suite  # noqa: E402
from quantbench.run.backend import get_backend  # noqa: E402
from quantbench.run.machine import detect  # noqa: E402
from quantbench.run.spec import RunSpec  # noqa: E402


def measure(backend: str, records, device: str, **spec) -> dict:
    loaded = get_backend(backend).load(RunSpec(backend=backend, device=device, **spec), detect())
    engine, times = loaded.engine, []
    prepared = [engine.prepare(r.request) for r in records]
    for p in prepared[:3]:
        engine.forward(p)
    for p in prepared:
        start = time.perf_counter()
        engine.forward(p)
        engine.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"variant": loaded.info.variant, "kernel": loaded.info.kernel_path, "format": loaded.info.weight_format,
            "experts_bytes": loaded.info.experts_bytes, "p50_ms": statistics.median(times),
            "p90_ms": times[int(0.9 * (len(times) - 1))]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--activations", default="on", choices=["on", "off"])
    args = parser.parse_args()
    records = load_suite(None).records[: args.records]
    rows = [measure("bf16", records, args.device)]
    for mode in ("packed", "unpacked"):
        rows.append(measure("nvfp4", records, args.device, nvfp4_mode=mode, nvfp4_activations=args.activations))
    bf16, packed, unpacked = rows
    print(f"\n{len(records)} decisions of the built-in suite on {args.device}, NVFP4 activations {args.activations}\n")
    print(f"| {'variant':<15} | {'experts MiB':>11} | {'vs BF16':>7} | {'p50 ms':>7} | {'p90 ms':>7} | kernel")
    print(f"|{'-' * 17}|{'-' * 13}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 30}")
    for r in rows:
        share = r["experts_bytes"] / bf16["experts_bytes"]
        print(f"| {r['variant']:<15} | {r['experts_bytes'] / 2**20:>11.3f} | {share:>7.1%} | {r['p50_ms']:>7.2f} | "
              f"{r['p90_ms']:>7.2f} | {r['kernel']}")
    print(f"\npacked / unpacked: memory {packed['experts_bytes'] / unpacked['experts_bytes']:.3f}, "
          f"p50 latency {packed['p50_ms'] / unpacked['p50_ms']:.3f}; "
          f"packed / bf16 p50 latency {packed['p50_ms'] / bf16['p50_ms']:.3f}")


if __name__ == "__main__":
    main()
