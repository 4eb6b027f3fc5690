"""A small store of media decisions for the dashboard's tests and screenshots: a real suite file (pictures as
PNG files beside it, tones as WAV data URIs, moving squares as video frames), and made-up answers from four CPU
runs of one model on it: BF16 (reference), BF16 under the eager kernel (noise floor), a good INT4 and an INT4 whose
vision tower was broken on purpose, which answers pictures and videos wrongly and everything else like INT4.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from PIL import Image

from quantbench.protocol import modality_of
from quantbench.protocol.suite import load_suite
from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store
from tests import dashboard_store as ds

MODEL = "teststore/omni-moe"
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220)}
TEXT_OPTIONS = ["A", "B", "C", "D"]
N = {"text": 60, "image": 24, "audio": 16, "video": 12, "mixed": 4}
VISION_BROKEN = "int4-vision-broken"


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def uri(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def picture(colour: str, big_left: bool) -> Image.Image:
    """A gray 64x64 picture with a large square of `colour` on one side and a small black one on the other."""
    image = Image.new("RGB", (64, 64), (128, 128, 128))
    big, small = ((4, 16, 36, 48), (46, 26, 58, 38)) if big_left else ((28, 16, 60, 48), (6, 26, 18, 38))
    image.paste(COLOURS[colour], big)
    image.paste((0, 0, 0), small)
    return image


def tone(high: bool, seconds: float = 1.0, rate: int = 16_000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    envelope = np.minimum(1.0, np.minimum(t, seconds - t) * 20)  # no click at either end
    samples = (0.6 * envelope * np.sin(2 * np.pi * (880.0 if high else 220.0) * t)).astype(np.float32)
    out = io.BytesIO()
    sf.write(out, samples, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def moving_frames(right: bool, n: int = 4) -> list[str]:
    frames = []
    for i in range(n):
        x = 8 + 12 * i if right else 44 - 12 * i
        image = Image.new("RGB", (64, 64), (20, 20, 30))
        image.paste((240, 200, 40), (x, 24, x + 14, 38))
        frames.append(uri("image/png", png(image)))
    return frames


def question(text: str, options: list[str]) -> dict[str, Any]:
    return {"type": "choice", "criteria": {o: f"{text}: {o}" for o in options}}


def records(folder: Path) -> list[dict[str, Any]]:
    """The suite's records (media files written under folder/media), text first, then by medium."""
    (folder / "media").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    out = []
    for i in range(N["text"]):
        gold = TEXT_OPTIONS[int(rng.integers(4))]
        out.append({"id": f"text-{i:03d}", "benchmark": "facts", "gold": {"answer": gold}, "request": {
            "state": {"observation": f"Fact number {i}."}, "questions": {"answer": question("Which", TEXT_OPTIONS)}}})
    for i in range(N["image"]):
        colour = list(COLOURS)[i % 3]
        name = f"media/picture-{i:03d}.png"
        (folder / name).write_bytes(png(picture(colour, big_left=i % 2 == 0)))
        out.append({"id": f"image-{i:03d}", "benchmark": "image-colour", "gold": {"colour": colour}, "request": {
            "state": {"camera": {"type": "image", "path": name}},
            "questions": {"colour": question("Colour of the larger shape", list(COLOURS))}}})
    for i in range(N["audio"]):
        high = i % 2 == 0
        out.append({"id": f"audio-{i:03d}", "benchmark": "audio-pitch", "gold": {"pitch": "high" if high else "low"},
                    "request": {"state": {"microphone": {"type": "audio", "data": uri("audio/wav", tone(high))}},
                                "questions": {"pitch": question("The tone is", ["high", "low"])}}})
    for i in range(N["video"]):
        right = i % 2 == 1
        out.append({"id": f"video-{i:03d}", "benchmark": "video-motion", "gold": {"direction": "right" if right else "left"},
                    "request": {"state": {"clip": {"type": "video", "frames": moving_frames(right), "fps": 2}},
                                "questions": {"direction": question("The square moves", ["left", "right"])}}})
    for i in range(N["mixed"]):
        colour = list(COLOURS)[i % 3]
        out.append({"id": f"mixed-{i:03d}", "benchmark": "image-audio", "gold": {"colour": colour}, "request": {
            "state": {"camera": {"type": "image", "data": uri("image/png", png(picture(colour, i % 2 == 0)))},
                      "microphone": {"type": "audio", "data": uri("audio/wav", tone(i % 2 == 0))}},
            "questions": {"colour": question("Colour of the larger shape", list(COLOURS))}}})
    return out


def write_suite(folder: Path) -> Path:
    path = folder / "omni-dash.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records(folder)))
    return path


def reference_answers(suite_path: Path) -> list[dict[str, Any]]:
    """BF16's answers: right and confident on most questions, a few near-ties."""
    suite = load_suite(suite_path)
    rng = np.random.default_rng(11)
    rows = []
    for record in suite.records:
        modality = modality_of(record)
        for q, spec in record.request.questions.items():
            options = spec.options
            gold = record.gold[q]
            k = len(options)
            probs = rng.dirichlet(np.full(k, 0.5))
            if rng.random() < 0.85:  # mostly right: gold gets the largest share
                probs[options.index(gold)] += 1.5
            probs = probs / probs.sum()
            rows.append({"record_id": record.id, "benchmark": record.benchmark, "modality": modality, "question": q,
                         "options": options, "probs": [float(p) for p in probs],
                         "top": options[int(np.argmax(probs))], "gold": gold, "method": "label_logit",
                         "truncated": False})
    return rows


def perturbed(reference: list[dict[str, Any]], seed: int, noise: float, flip: set[str]) -> list[dict[str, Any]]:
    """The reference's answers with multiplicative noise, and the top answer moved to another option on the
    questions of the records in `flip` (what a broken tower does to the decisions that need it)."""
    rng = np.random.default_rng(seed)
    out = []
    for a in reference:
        p = np.asarray(a["probs"]) * np.exp(rng.normal(0, noise, len(a["probs"])))
        if a["record_id"] in flip:
            top = int(np.argmax(p))
            other = (top + 1 + int(rng.integers(len(p) - 1))) % len(p)
            p[other] = p[top] * 1.6
        p = p / p.sum()
        out.append({**a, "probs": [float(x) for x in p], "top": a["options"][int(np.argmax(p))]})
    return out


def build(path: Path, suite_folder: Path, *, spec_suite: bool = False) -> tuple[Store, Path]:
    """The store at `path` and its suite under `suite_folder`. `spec_suite`: the runs' spec names the suite file
    (as `quantbench run --suite FILE` stores it), so the dashboard finds it without being told."""
    suite_path = write_suite(suite_folder)
    suite = load_suite(suite_path)
    ref = reference_answers(suite_path)
    seen = [r.id for r in suite.records if modality_of(r) in ("image", "video", "mixed")]
    near_ties = {"audio-003", "audio-010"}  # both INT4 variants flip these two tones: a rounding, not a broken tower
    variants = [  # (variant, backend, kernel, format, role, answers)
        ("bf16", "bf16", "grouped_mm", "bf16", "reference", ref),
        ("bf16", "bf16", "eager", "bf16", "noise_floor", perturbed(ref, 1, 0.01, set())),
        ("int4", "int4", "dequant_bf16", "int4-g128", "candidate", perturbed(ref, 2, 0.04, near_ties)),
        (VISION_BROKEN, "int4", "dequant_bf16", "int4-g128", "candidate",
         perturbed(ref, 2, 0.04, near_ties | set(seen[::2]))),
    ]
    store = Store(path)
    for i, (variant, backend, kernel, fmt, role, answers) in enumerate(variants):
        spec = {"backend": backend, "suite": str(suite_path)} if spec_suite else {"backend": backend}
        run = ds.run_row(ds.CPU, 10 * i, model_id=MODEL, suite_id=suite.id, suite_hash=suite.hash, backend=backend,
                         variant=variant, kernel_path=kernel, weight_format=fmt, native=None, role=role,
                         n_records=len(suite.records), n_questions=len(answers), load_s=1.5, cold_ms=60.0,
                         created_at=dt.datetime(2026, 12, 2, 10, i, tzinfo=dt.UTC), spec=spec,
                         **ds._memory(ds.CPU, 0.02 if backend == "int4" else 0.05, 0.02))
        store.write_run(RunResult(run={**run, "run_id": str(uuid7())}, answers=answers,
                                  latencies=ds.latencies(9.0 if backend == "bf16" else 12.0, seed=40 + i)))
    return store, suite_path
