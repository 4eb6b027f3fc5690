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
from quantbench.make.quantize import Recipe, quantize
from quantbench.models.calibration import file_samples, load_calibration, media_kinds
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


# -- media records through the towers, observed in the quantizing child -------------------------------------------
EXPECTED = {"visual": 3, "audio_tower": 1, "samples_with": {"image": 2, "audio": 1, "video": 1}}  # img asks 2 questions


def test_the_provenance_records_the_file_the_records_used_and_their_media():
    made = provenance(variant("nvfp4", "media"))["calibration"]
    cal = root() / "calibration" / "media.jsonl"
    assert made["file"] == str(cal.resolve()) and made["sha256"] == hashlib.sha256(cal.read_bytes()).hexdigest()
    assert made["hash_with_media_files"] == load_calibration(cal).hash != made["sha256"]  # it covers the pictures
    assert (made["records_in_file"], made["records_used"]) == (7, 7)
    assert made["records_with"] == {"image": 1, "audio": 1, "video": 1}
    assert (made["text_samples"], made["media_samples"]) == (5, 4)  # img 2 questions, wav 1, vid 1
    assert provenance(variant("nvfp4", "media"))["recipe"]["calibration_hash"] == made["hash_with_media_files"]


def test_modelopt_calibration_runs_the_towers_on_every_media_record():
    seen = provenance(variant("nvfp4", "media"))["modelopt_calibration"]
    # one batch of the 5 packed texts, then each media sample alone: every forward reached the decoder
    assert {k: seen["forwards"][k] for k in ("forwards", "reached_decoder")} == {"forwards": 5, "reached_decoder": 5}
    assert {k: seen["forwards"][k] for k in EXPECTED} == EXPECTED
    assert seen["plain_disabled_conv3d"] == 1  # the vision patch embedding, off ModelOpt's CUDA-only NVFP4 kernel
    for tower in ("audio_tower", "visual"):  # the towers ran in BF16: their quantizers stayed off
        assert seen["quantizers"][tower]["enabled"] == 0
    text = provenance(variant("nvfp4", "text"))["modelopt_calibration"]["forwards"]
    assert (text["visual"], text["audio_tower"], text["forwards"]) == (0, 0, 1)


def expert_tensors(path: Path) -> dict[str, torch.Tensor]:
    return {k: t for f in path.glob("*.safetensors") for k, t in load_file(str(f)).items() if ".experts." in k}


def test_media_records_change_the_experts_activation_scales_and_not_their_weights():
    media, text = expert_tensors(variant("nvfp4", "media")), expert_tensors(variant("nvfp4", "text"))
    assert media.keys() == text.keys()
    scales = [k for k in media if k.endswith(".input_scale")]
    assert len(scales) == 2 * 8 * 3
    changed = [k for k in scales if not torch.equal(media[k], text[k])]
    assert len(changed) >= len(scales) // 2, changed  # media tokens reach (nearly) every expert's inputs
    for k in media.keys() - set(scales):  # the weights and their scales come from the weights alone
        assert torch.equal(media[k], text[k]), k


def test_auto_round_feeds_each_media_record_whole_to_the_thinker():
    prov = provenance(variant("int4", "media"))
    ran = prov["calibration_forwards"]  # auto-round's MLLM calibrator called model(**sample) once per sample
    assert (ran["forwards"], ran["reached_decoder"]) == (9, 9)
    assert {k: ran[k] for k in EXPECTED} == EXPECTED
    assert prov["calibration"]["media_samples"] == 4 and prov["int4_expert_projections"] == 2 * 8 * 3


def test_a_sample_is_what_a_decision_feeds_the_thinker_and_the_watch_refuses_one_run_without_its_media():
    """In-process, on the thinker built in memory: the media sampler's dicts carry the towers' inputs and the
    gold answer's label after the prompt; the watch's check fails when the same samples run as text only."""
    from quantbench.make.quantize.watch import CalibrationWatch
    from quantbench.models.calibration import media_sampler
    from tests.omni_tiny import full_model

    model, tokenizer = full_model().thinker, omni_tokenizer()
    cal = load_calibration(write_file("media.jsonl", TEXT + MEDIA))
    sampler = media_sampler(model, tokenizer, thinker(), cal)
    img, wav, vid = (sampler(rec) for rec in cal.records if rec.id in ("img", "wav", "vid"))
    assert [media_kinds(s) for s in img + wav + vid] == [["image"], ["image"], ["audio"], ["video"]]
    assert int((img[0]["input_ids"] == model.config.image_token_id).sum()) == 12  # 120 x 90: 12 tokens
    assert img[0]["input_ids"][0, -1] == tokenizer(" A", add_special_tokens=False)["input_ids"][0]  # gold: left
    assert tokenizer.decode(wav[0]["input_ids"][0, -8:]).endswith("\nAnswer:")  # no gold: the prompt alone
    assert img[0]["pixel_values"].dtype == torch.bfloat16 and "image_grid_thw" in img[0]
    assert {"feature_attention_mask", "input_features"} <= wav[0].keys()
    assert {"pixel_values_videos", "video_grid_thw", "video_second_per_grid"} <= vid[0].keys()
    samples = img + wav + vid
    with torch.inference_mode(), CalibrationWatch(model) as whole:
        for s in samples:
            model(**s, use_cache=False)
    assert whole.check(samples, "test")["visual"] == 3
    with torch.inference_mode(), CalibrationWatch(model) as text_only:
        for s in samples:
            model(input_ids=s["input_ids"].clamp(max=300), attention_mask=s["attention_mask"], use_cache=False)
    with pytest.raises(QuantbenchError, match=r"test calibration ran .*'visual': 0.* not .*'visual': 3"):
        text_only.check(samples, "test")


# -- bad records: named by record and field ------------------------------------------------------------------------
@pytest.mark.parametrize("path, problem", [("media/nope.png", r"'media/nope.png': no such file"),
                                           ("../frame.png", r"'../frame.png' is outside the suite's folder")])
def test_a_missing_or_outside_media_file_is_refused_before_anything_loads(tmp_path, path, problem):
    record = {**MEDIA[0], "request": {"state": {"camera": {"type": "image", "path": path}}, "questions": QUESTIONS}}
    cal = write_file("bad.jsonl", [TEXT[0], record], tmp_path / "cal")
    with pytest.raises(ConfigError, match=rf"^--calibration: {cal}:2: state\.camera\.path: {problem}"):
        quantize(thinker(), "nvfp4", tmp_path / "out", progress=False, calibration=cal, **RECIPE)
    assert not (tmp_path / "out").exists()


def test_a_text_only_model_refuses_a_media_record_naming_record_and_field(tmp_path):
    cal = write_file("media.jsonl", TEXT + MEDIA, tmp_path / "cal")
    done = subprocess.run([sys.executable, "-m", "quantbench", "quantize", "--model", str(save_tiny(tmp_path / "m")),
                           "--scheme", "fp8", "--out", str(tmp_path / "out"), "--calibration", str(cal)],
                          capture_output=True, text=True, cwd=ROOT)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, said
    assert f"--calibration {cal.resolve()}: record img: state.camera: the model reads text only; it has no image " \
           "input" in said
    assert not (tmp_path / "out").exists()


def test_undecodable_media_is_refused_from_the_child_naming_record_and_field(tmp_path):
    record = {"id": "broken", "benchmark": "nav",
              "request": {"state": {"camera": {"type": "image", "path": "media/clip.wav"}}, "questions": QUESTIONS}}
    cal = write_file("bad.jsonl", [*TEXT, record], tmp_path / "cal")
    with pytest.raises(ConfigError, match=rf"^--calibration {cal.resolve()}: record broken: state\.camera\.path: "):
        quantize(thinker(), "fp8", tmp_path / "out", progress=False, calibration=cal, **RECIPE)
