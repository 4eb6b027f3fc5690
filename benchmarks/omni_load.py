"""CPU load time of the tiny Qwen3-Omni-MoE checkpoints (tests/omni_tiny.py) per backend: each load in a fresh
process (as a run's child loads), median of --repeat. The variants are made as tests/test_omni_load.py makes them
(auto-round int4, ModelOpt NVFP4 / FP8, experts only).

    python benchmarks/omni_load.py --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOAD = """
import sys, time
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from backends.bf16 import Bf16Backend
from backends.fp8 import Fp8Backend
from backends.int4 import Int4Backend
from backends.nvfp4 import Nvfp4Backend
backends = {"bf16": Bf16Backend, "int4": Int4Backend, "nvfp4": Nvfp4Backend, "fp8": Fp8Backend}
name, model, options = sys.argv[1], sys.argv[2], eval(sys.argv[3])
machine = detect()
t = time.perf_counter()
backends[name]().load(RunSpec(backend=name, model=model, device="cpu", **options), machine)
print(f"{time.perf_counter() - t:.3f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from tests.test_omni_load import autoround_variant, checkpoints, modelopt_variants

    ck, mo = checkpoints(), modelopt_variants()
    cases = [("bf16 full (talker + code2wav not read)", "bf16", ck["full"], {}),
             ("bf16 thinker-only", "bf16", ck["thinker"], {}),
             ("bf16 ModelOpt module names", "bf16", ck["modules"], {}),
             ("int4 fast (grouped-MoE)", "int4", autoround_variant(), {}),
             ("int4 --no-fast-moe", "int4", autoround_variant(), {"fast_moe": False}),
             ("nvfp4 packed", "nvfp4", mo["nvfp4"], {"nvfp4_mode": "packed"}),
             ("nvfp4 unpacked", "nvfp4", mo["nvfp4"], {"nvfp4_mode": "unpacked"}),
             ("fp8", "fp8", mo["fp8"], {})]
    print("| Checkpoint | backend.load s (median) | runs |\n|---|---|---|")
    for label, backend, model, options in cases:
        times = []
        for _ in range(args.repeat):
            done = subprocess.run([sys.executable, "-c", LOAD, backend, str(model), repr(options)], cwd=ROOT,
                                  capture_output=True, text=True, check=True)
            times.append(float(done.stdout.strip().splitlines()[-1]))
        print(f"| {label} | {statistics.median(times):.2f} | {', '.join(f'{t:.2f}' for t in times)} |", flush=True)


if __name__ == "__main__":
    main()
