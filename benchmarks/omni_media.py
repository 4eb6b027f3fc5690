"""CPU figures of media decisions on the tiny Qwen3-Omni-MoE checkpoints (tests/omni_tiny.py) per backend: load
time, and the per-decision latency (p50 of --decisions forwards after --warmup, prepare excluded, as a run times
it) of a text, an image, an audio and a video decision. Each backend in a fresh process (as a run's child loads);
the variants are made as tests/test_omni_load.py makes them (auto-round int4, ModelOpt NVFP4 / FP8, experts only),
the requests are tests/test_omni_media.py's (a 120 x 90 picture, 1 s of audio, a 4-frame 64 x 64 mp4).

    python benchmarks/omni_media.py --decisions 20
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURE = """
import statistics, sys, time
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from backends.bf16 import Bf16Backend
from backends.fp8 import Fp8Backend
from backends.int4 import Int4Backend
from backends.nvfp4 import Nvfp4Backend
from tests.test_omni_media import request
backends = {"bf16": Bf16Backend, "int4": Int4Backend, "nvfp4": Nvfp4Backend, "fp8": Fp8Backend}
name, model, options, warmup, decisions = sys.argv[1], sys.argv[2], eval(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t = time.perf_counter()
engine = backends[name]().load(RunSpec(backend=name, model=model, device="cpu", **options), detect()).engine
row = [f"{time.perf_counter() - t:.2f}"]
for kind in ("text", "image", "audio", "video"):
    prepared = engine.prepare(request(kind))
    times = []
    for i in range(warmup + decisions):
        t = time.perf_counter()
        engine.forward(prepared)
        times.append((time.perf_counter() - t) * 1e3)
    row.append(f"{statistics.median(times[warmup:]):.1f} ({len(prepared.rows[0])})")
print(" | ".join(row))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--decisions", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.test_omni_load import autoround_variant, checkpoints, modelopt_variants

    ck, mo = checkpoints(), modelopt_variants()
    cases = [("bf16 (full checkpoint)", "bf16", ck["full"], {}),
             ("int4 fast (grouped-MoE)", "int4", autoround_variant(), {}),
             ("int4 --no-fast-moe", "int4", autoround_variant(), {"fast_moe": False}),
             ("nvfp4 packed", "nvfp4", mo["nvfp4"], {"nvfp4_mode": "packed"}),
             ("nvfp4 unpacked", "nvfp4", mo["nvfp4"], {"nvfp4_mode": "unpacked"}),
             ("fp8", "fp8", mo["fp8"], {})]
    print("| Backend | load s | text ms p50 (tokens) | image ms p50 (tokens) | audio ms p50 (tokens) | "
          "video ms p50 (tokens) |\n|---|---|---|---|---|---|")
    for label, backend, model, options in cases:
        done = subprocess.run([sys.executable, "-c", MEASURE, backend, str(model), repr(options), str(args.warmup),
                               str(args.decisions)], cwd=ROOT, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{label}: {done.stderr[-2000:]}")
        print(f"| {label} | {done.stdout.strip().splitlines()[-1]} |", flush=True)


if __name__ == "__main__":
    main()
