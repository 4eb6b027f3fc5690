"""Issue #24 part 3, last piece: `quantbench quantize --calibration FILE.jsonl` calibrates on the user's own decision
records, and a record carrying media reaches a Qwen3-Omni thinker's vision and audio towers during calibration,
through the decision engine's own path (OmniEngine.prepare and the checkpoint's processor).

What is observed, in the quantizing child: how many forwards the library ran, how many reached the first decoder
layer, and how many times the vision and audio towers ran (quantize/watch.py, checked there against the samples
given and recorded in the provenance): an auto-round that swallowed a failing media forward, or a route that
dropped the media inputs, fails the check. NVFP4 calibrated with media records gets other activation scales for
the experts than calibrated on the same file's text records alone, and the same weights. Bad records are refused
naming the record and the field: a missing file, a path outside the folder, undecodable bytes, media for a model
that reads text only.

The variants are made once per module by the real ModelOpt and auto-round on the tiny thinker (about 15 s each
on the 2-core CPU machine)."""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.models.calibration import file_samples, load_calibration, media_kinds
from quantbench.models.quantize import Recipe, quantize
from tests.omni_tiny import build_thinker, omni_tokenizer
from tests.test_media import audio_bytes, mp4_bytes, uri
from tests.test_omni_media import png
from tests.tiny import save_tiny

ROOT = Path(__file__).resolve().parents[1]
RECIPE = {"nsamples": 12, "seqlen": 64, "group_size": 32}
QUESTIONS = {"action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right",
                                                       "forward": "Move forward"}},
             "ok": {"type": "boolean"}}
OBSERVATIONS = ["a wall ahead, an open door to the left", "a corridor that bends right, lights off",
                "stairs going down in front, a locked gate behind", "a red button on the wall, the exit to the right"]
TEXT = [{"id": f"t{i}", "benchmark": "nav", "gold": {"action": ["left", "right", "forward", "right"][i], "ok": "yes"},
         "request": {"state": {"observation": obs}, "questions": QUESTIONS}} for i, obs in enumerate(OBSERVATIONS)]
MEDIA = [
    {"id": "img", "benchmark": "nav", "gold": {"action": "left"},
     "request": {"state": {"observation": "look", "camera": {"type": "image", "path": "media/frame.png"}},
                 "questions": QUESTIONS}},
    {"id": "wav", "benchmark": "nav",  # no gold: the prompt alone
     "request": {"state": {"microphone": {"type": "audio", "path": "media/clip.wav"}},
                 "questions": {"ok": {"type": "boolean"}}}},
    {"id": "vid", "benchmark": "nav", "gold": {"ok": "no"},
     "request": {"state": {"clip": {"type": "video", "data": uri("video/mp4", mp4_bytes(4, 2, 64, bars=True))}},
                 "questions": {"ok": {"type": "boolean"}}}},
]


@cache
def root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="quantbench-mediacal-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@cache
def thinker() -> Path:
    return build_thinker(root() / "thinker")


def write_file(name: str, records: list[dict], folder: Path | None = None) -> Path:
    """A calibration file of `records` in `folder` (default: the module's), beside its media files."""
    folder = folder or root() / "calibration"
    (folder / "media").mkdir(parents=True, exist_ok=True)
    (folder / "media" / "frame.png").write_bytes(png(3))
    (folder / "media" / "clip.wav").write_bytes(audio_bytes("WAV", 1.0))
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@cache
def variant(scheme: str, records: str) -> Path:
    """The tiny thinker quantized with the calibration file of `records` (`media`: text and media records,
    `text`: the same file's text records only); the int4 one through the CLI."""
    cal = write_file(f"{records}.jsonl", TEXT + MEDIA if records == "media" else TEXT)
    out = root() / f"{scheme}-{records}"
    if scheme == "int4":
        done = subprocess.run([sys.executable, "-m", "quantbench", "quantize", "--model", str(thinker()),
                               "--scheme", scheme, "--out", str(out), "--calibration", str(cal),
                               *(f"--{k.replace('_', '-')}={v}" for k, v in RECIPE.items())],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return out
    return quantize(thinker(), scheme, out, progress=False, calibration=cal, **RECIPE)


def provenance(path: Path) -> dict:
    return json.loads((path / "quantbench_provenance.json").read_text())


# -- the samples a file makes (no model) -------------------------------------------------------------------------
def test_text_records_are_packed_with_their_gold_answers_and_a_short_tail_is_left_out():
    cal = load_calibration(write_file("text.jsonl", TEXT))
    tokenizer = omni_tokenizer()
    samples, made = file_samples(cal, tokenizer, nsamples=50, seqlen=64)
    assert all(isinstance(s, str) for s in samples) and len(samples) == made["samples"] == made["text_samples"]
    assert all(len(tokenizer(s, add_special_tokens=False)["input_ids"]) >= 64 for s in samples)
    assert "observation: a wall ahead, an open door to the left" in samples[0]
    assert "Answer: A" in samples[0]  # t0's gold "left" is option A, written after its prompt
    assert made["records_in_file"] == 4 and made["records_with"] == {"image": 0, "audio": 0, "video": 0}
    assert made["sha256"] == hashlib.sha256(cal.path.read_bytes()).hexdigest()
    # t3's second question (75 tokens) does not fill a sample of 64 tokens and the margin: left out
    assert sum(s.count("a red button") for s in samples) == 1 and made["records_used"] == 4
    assert len(file_samples(cal, tokenizer, nsamples=1, seqlen=64)[0]) == 1
    with pytest.raises(ConfigError, match=r"make no sample of --seqlen 4096 tokens"):
        file_samples(cal, tokenizer, nsamples=8, seqlen=4096)


def test_the_default_recipe_keeps_its_cache_key_and_a_file_is_a_recipe_of_its_own():
    default = Recipe("int4", nsamples=16, seqlen=256)
    assert "calibration_hash" not in default.to_dict()
    assert default.hash == hashlib.sha256(json.dumps(
        {"scheme": "int4", "iters": 0, "nsamples": 16, "seqlen": 256, "group_size": 128, "experts_only": True,
         "seed": 0}, sort_keys=True).encode()).hexdigest()
    assert Recipe("int4", nsamples=16, seqlen=256, calibration_hash="ab" * 32).hash != default.hash
    with pytest.raises(ConfigError, match="--calibration with --plain-rtn"):
        Recipe("int4", opt_rtn=False, calibration_hash="ab" * 32)
