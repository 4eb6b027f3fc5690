"""Issue #24 on a GPU: the tiny Qwen3-Omni checkpoints answer image, audio, video and text decisions on CUDA (the
text decoder's fused ops and CUDA graphs where they apply) as they do on the CPU, in every local backend.

Skipped without a CUDA GPU (CI has none); run on the H200 with `pytest -s tests/test_omni_gpu.py`, which also prints
each backend's per-decision latency per kind (docs/BENCHMARKS.md). The video is a `frames` list: the device image has
no PyAV for mp4 (tests/test_omni_media.py covers mp4 on the CPU)."""

from __future__ import annotations

import io
import statistics
import time

import numpy as np
import pytest
import torch
from PIL import Image

from backends.bf16 import Bf16Backend
from backends.fp8 import Fp8Backend
from backends.int4 import Int4Backend
from backends.nvfp4 import Nvfp4Backend
from quantbench.protocol import parse_request
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from tests.test_media import audio_bytes, uri
from tests.test_omni_load import autoround_variant, checkpoints, modelopt_variants

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

QUESTIONS = {"action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right",
                                                       "forward": "Move forward"}},
             "ok": {"type": "boolean"}}
# Probabilities on the GPU against the CPU: bf16 kernels of another order of accumulation, the fused ops (bf16
# rounding where transformers rounds), another NVFP4 / FP8 activation path; on a random tiny model a near-tie may
# flip, so the top answer is compared only where the CPU's margin is clear.
TOLERANCE = 0.03
CLEAR_MARGIN = 0.1


def png(seed: int, size: tuple[int, int]) -> bytes:
    pixels = np.random.RandomState(seed).randint(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


STATES = {
    "text": {"observation": "wall ahead, player left"},
    "image": {"observation": "wall ahead", "camera": {"type": "image", "data": uri("image/png", png(1, (120, 90)))}},
    "audio": {"observation": "wall ahead",
              "microphone": {"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 1.0))}},
    "video": {"views": ["replay:", {"type": "video", "frames": [uri("image/png", png(i, (96, 64))) for i in range(4)],
                                    "fps": 2}]},
}


def variant(kind: str):
    return {"full": lambda: checkpoints()["full"], "int4": autoround_variant,
            "nvfp4": lambda: modelopt_variants()["nvfp4"], "fp8": lambda: modelopt_variants()["fp8"]}[kind]()


CASES = {
    "bf16 grouped_mm": (Bf16Backend, "full", {}),
    "bf16 quantbench engine": (Bf16Backend, "full", {"experts_impl": "quantbench"}),
    "int4 fast": (Int4Backend, "int4", {}),
    "int4 --no-fast-moe": (Int4Backend, "int4", {"fast_moe": False}),
    "nvfp4 packed": (Nvfp4Backend, "nvfp4", {"nvfp4_mode": "packed"}),
    "nvfp4 unpacked": (Nvfp4Backend, "nvfp4", {"nvfp4_mode": "unpacked"}),
    "fp8": (Fp8Backend, "fp8", {}),
}


def load_on(case: str, device: str):
    backend, kind, options = CASES[case]
    spec = RunSpec(backend=backend.name, model=str(variant(kind)), device=device, **options)
    return backend().load(spec, detect())


def answers(engine, prepared) -> dict[str, dict[str, float]]:
    return {q: a.probabilities for q, a in engine.forward(prepared).items()}


@pytest.mark.parametrize("case", list(CASES))
def test_the_gpu_answers_every_media_kind_as_the_cpu(case):
    cpu, gpu = load_on(case, "cpu"), load_on(case, "cuda")
    assert gpu.engine.modalities == {"image", "audio", "video"}
    timings = {}
    for kind, state in STATES.items():
        request = parse_request({"state": state, "questions": QUESTIONS})
        ours, ref = answers(gpu.engine, gpu.engine.prepare(request)), answers(cpu.engine, cpu.engine.prepare(request))
        for question, probs in ref.items():
            worst = max(abs(probs[o] - ours[question][o]) for o in probs)
            assert worst <= TOLERANCE, (case, kind, question, probs, ours[question])
            ranked = sorted(probs.values(), reverse=True)
            if ranked[0] - ranked[1] > CLEAR_MARGIN:
                assert max(ours[question], key=ours[question].get) == max(probs, key=probs.get), (case, kind)
        prepared = gpu.engine.prepare(request)
        gpu.engine.warm([prepared])
        times = []
        for _ in range(12):
            started = time.perf_counter()
            gpu.engine.forward(prepared)
            gpu.engine.synchronize()
            times.append((time.perf_counter() - started) * 1e3)
        timings[kind] = statistics.median(times[2:])
    report = gpu.engine.report()
    print(f"\n| {case} | " + " | ".join(f"{timings[k]:.2f}" for k in STATES)
          + f" | fused_ops={report.fused_ops} graphs={report.graphs} kernel={gpu.info.kernel_path} |")
