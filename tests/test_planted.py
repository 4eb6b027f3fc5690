"""Issue #25 part 5: the planted regression the per-modality verdict must catch. `quantbench plant` copies a
tiny Qwen3-Omni thinker and breaks its vision tower only; over a suite of image and text decisions, stored runs of
BF16 (the reference), its noise floor, the planted copy and an exact copy of BF16 go through `compare` and
`report`: the planted variant reads worse on image decisions and indistinguishable on text ones (it is not
recommended), the exact copy indistinguishable on both.

The tiny thinker has random weights: its answers are near-ties (median margin between its top two options about
0.02; its float32 noise floor already flips 3% of them), so an INT4 of it is itself not indistinguishable from
BF16 and would hide what the plant does to text. The test plants into the BF16 checkpoint, whose text answers the
plant leaves bit-identical; on a trained model (the omni default model) plant into its INT4:
`quantbench plant --from INT4_DIR --tower vision --out DIR`.

Suite size: an exact copy's verdict on a modality is `indistinguishable` only when 0 extra disagreements in n
questions bound the excess under the 2-point margin, which takes n >= 189 (the paired score interval's upper
bound at 0/n is about 3.84 / (n + 3.84)); each modality gets 240 questions: 24 records x 10 questions (a
question is one row of its record's forward pass)."""

from __future__ import annotations

import atexit
import json
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest
from safetensors.torch import load_file

from quantbench import report
from quantbench.analysis import parity
from quantbench.analysis import stats as an
from quantbench.make.plant import PLANTED_FILE, plant, tower_of
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests.omni_tiny import build_thinker
from tests.test_media import uri
from tests.test_omni_media import png

ROOT = Path(__file__).resolve().parents[1]
N_RECORDS, N_QUESTIONS = 24, 10  # per modality: 240 questions (see the module docstring)
OPTIONS = {"a": "the first", "b": "the second", "c": "the third", "d": "the fourth"}


def suite_records() -> list[dict]:
    questions = {f"q{i}": {"type": "choice", "criteria": OPTIONS, "description": f"question {i}"}
                 for i in range(N_QUESTIONS)}
    gold = {f"q{i}": "abcd"[i % 4] for i in range(N_QUESTIONS)}
    records = []
    for j in range(N_RECORDS):
        records.append({"id": f"img{j:02d}", "benchmark": "picture", "gold": gold, "request": {
            "state": {"observation": f"scene {j}", "camera": {"type": "image", "data": uri("image/png", png(100 + j))}},
            "questions": questions}})
        records.append({"id": f"txt{j:02d}", "benchmark": "words", "gold": gold, "request": {
            "state": {"observation": f"scene {j}: a door to the left, a wall ahead, {j % 5} boxes"},
            "questions": questions}})
    return records


@cache
def root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="quantbench-planted-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@cache
def lab() -> tuple[Store, Store, dict[str, str]]:
    """(the store of BF16, floor and planted; the store of BF16, floor and the exact copy; run ids by name)."""
    base = root()
    source = build_thinker(base / "bf16")
    suite = base / "suite.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in suite_records()))
    done = subprocess.run([sys.executable, "-m", "quantbench", "plant", "--from", str(source), "--tower", "vision",
                           "--out", str(base / "planted")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "planted" in done.stdout and "+planted-vision" in " ".join(done.stdout.split())
    shutil.copytree(source, base / "copy")  # BF16's bytes in another folder
    common = dict(suite=str(suite), gpu="cpu", warmup=0, latency_min_decisions=1, latency_min_seconds=0.0)
    specs = {
        "bf16": RunSpec(backend="bf16", model=str(source), role="reference", **common),
        "floor": RunSpec(backend="bf16", model=str(source), role="noise_floor", dtype="float32", **common),
        "planted": RunSpec(backend="bf16", model=str(base / "planted"), **common),
        "copy": RunSpec(backend="bf16", model=str(base / "copy"), **common),
    }
    planted_store, copy_store = Store(base / "planted.duckdb"), Store(base / "copy.duckdb")
    ids = {}
    for name, spec in specs.items():
        result = execute(spec, echo=False)
        assert result.run.status == "ok", (name, result.run.error)
        for store in [planted_store] * (name != "copy") + [copy_store] * (name != "planted"):
            ids[name] = store.write_run(result)
    return planted_store, copy_store, ids


def test_plant_changes_only_the_towers_weights_and_says_it_is_planted():
    lab()
    before = load_file(str(root() / "bf16" / "model.safetensors"))
    after = load_file(str(root() / "planted" / "model.safetensors"))
    assert before.keys() == after.keys()
    changed = {k for k in before if not before[k].equal(after[k])}
    assert changed and all(tower_of(k, "vision") and before[k].ndim >= 2 for k in changed)
    record = json.loads((root() / "planted" / PLANTED_FILE).read_text())
    assert record["planted"] is True and record["tower"] == "vision" and record["tensors_changed"] == len(changed)
    assert record["model_id"] == json.loads((root() / "planted" / "quantbench_provenance.json").read_text())[
        "source_model_id"]


def test_the_planted_variant_is_worse_on_images_and_indistinguishable_on_text():
    store, _, ids = lab()
    planted = parity.compare(store, ids["planted"])
    assert planted.reference.run_id == ids["bf16"] and planted.floor.run.run_id == ids["floor"]
    assert planted.candidate.variant == "bf16+planted-vision"
    extra = planted.candidate.extra
    assert (json.loads(extra) if isinstance(extra, str) else extra)["planted"]["tower"] == "vision"
    verdicts = {m.modality: m.verdict.label for m in planted.modalities}
    assert verdicts == {"text": an.INDISTINGUISHABLE, "image": an.WORSE}, planted.verdict_short()
    text = planted.per_question[planted.per_question.modality == "text"]
    assert text.tv.max() == 0.0  # the vision tower is all it changed: text answers bit-identical


def test_compare_prints_the_tests_behind_each_modalitys_verdict():
    """What `quantbench compare` prints on these transformers-made checkpoints: McNemar's exact p against BF16 and
    against the noise floor, the TOST verdict with its named margin, TV / KL percentiles and the flips by BF16's own
    margin, per modality (Holm-adjusted across them); the planted image cell and the text cell disagree."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    store, _, ids = lab()
    done = CliRunner().invoke(app, ["compare", ids["planted"], "--db", str(store.path)], terminal_width=400)
    assert done.exit_code == 0, done.output
    out = " ".join(done.output.split())
    assert "McNemar exact, vs BF16 on gold answers (lost / gained): p = " in out
    assert "McNemar exact, vs the noise floor on flips (extra / fewer): p = " in out
    assert "Equivalence (TOST, α 0.05) against the margin card: agreement within 2 points and mean TV within 0.01" in out
    assert "TV per question" in out and "KL(ref ‖ cand) per question" in out
    assert re.search(r"mean [\d.]+ p50 [\d.]+ p90 [\d.]+ p99 [\d.]+ max [\d.]+", out)
    assert "Flips by BF16's margin (near-tie < 0.1 / middle / confident ≥ 0.5)" in out
    assert "Tests per modality (p-values Holm-adjusted across these 2 modalities)" in out
    planted = parity.compare(store, ids["planted"])
    by = {m.modality: m.tests for m in planted.modalities}
    assert by["image"].equivalent is False and by["text"].equivalent is True  # the plant is where it shows
    assert by["image"].mcnemar_floor.p_holm < 0.001 and by["text"].mcnemar_floor.b == 0  # no extra text flip
    # random weights answer near-ties only (the module docstring): every flip of the plant is counted as one
    assert by["image"].flips.flips == by["image"].flips.near_tie_flips > 0 and by["text"].flips.flips == 0
    assert by["image"].tv.p99 > by["text"].tv.p99 == 0.0


def test_an_exact_copy_is_indistinguishable_on_every_modality():
    _, store, ids = lab()
    copy = parity.compare(store, ids["copy"], reference_run_id=ids["bf16"])
    assert copy.tv.max == 0.0
    assert {m.modality: m.verdict.label for m in copy.modalities} == {"text": an.INDISTINGUISHABLE,
                                                                      "image": an.INDISTINGUISHABLE}


def test_the_report_flags_the_planted_variant_for_images_and_does_not_recommend_it():
    store, _, _ = lab()
    md = report.report_text(str(store.path))
    assert f"Questions by modality: text {N_RECORDS * N_QUESTIONS}; image {N_RECORDS * N_QUESTIONS}." in md
    row = next(line for line in md.splitlines() if line.startswith("| bf16+planted-vision |"))
    assert "text: indistinguishable; image: worse" in row
    assert "worse than the noise floor by more than the margin on image decisions" in row and "⭐" not in row


def _checkpoint(path: Path, tensors: dict) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_quantize_mode_rounds_each_row_of_the_tower_to_its_grid_and_keeps_the_rest_byte_for_byte(tmp_path):
    import torch

    g = torch.Generator().manual_seed(0)
    tensors = {"thinker.visual.blocks.0.mlp.fc1.weight": torch.randn(8, 16, generator=g).to(torch.bfloat16),
               "thinker.visual.blocks.0.norm1.weight": torch.ones(16, dtype=torch.bfloat16),
               "thinker.model.layers.0.mlp.gate.weight": torch.randn(4, 16, generator=g).to(torch.bfloat16),
               "thinker.audio_tower.conv2d1.weight": torch.randn(4, 1, 3, 3, generator=g).to(torch.bfloat16)}
    src = _checkpoint(tmp_path / "src", tensors)
    record = plant(src, tmp_path / "out", tower="vision", mode="quantize", bits=2)
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    fc1 = out["thinker.visual.blocks.0.mlp.fc1.weight"].float()
    step = tensors["thinker.visual.blocks.0.mlp.fc1.weight"].float().abs().amax(dim=1, keepdim=True)
    assert set((fc1 / step).round(decimals=2).unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0}  # 2 bits: 4 levels
    assert not fc1.equal(tensors["thinker.visual.blocks.0.mlp.fc1.weight"].float())
    for name in ("thinker.visual.blocks.0.norm1.weight", "thinker.model.layers.0.mlp.gate.weight",
                 "thinker.audio_tower.conv2d1.weight"):
        assert out[name].equal(tensors[name]), name  # norms, the decoder and the other tower untouched
    assert record["tensors_changed"] == 1 and record["bits"] == 2 and record["from_hash"]


def test_plant_refuses_what_it_cannot_plant_naming_the_flag(tmp_path):
    import torch

    from quantbench.errors import ConfigError

    text_only = _checkpoint(tmp_path / "text", {"model.layers.0.mlp.gate.weight": torch.ones(4, 8)})
    with pytest.raises(ConfigError, match="--tower vision: .* has no floating-point vision tower weights"):
        plant(text_only, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    omni = _checkpoint(tmp_path / "omni", {"visual.patch_embed.proj.weight": torch.ones(4, 8)})
    with pytest.raises(ConfigError, match="--tower 'smell'"):
        plant(omni, tmp_path / "out", tower="smell")
    with pytest.raises(ConfigError, match="--scale 0"):
        plant(omni, tmp_path / "out", scale=0)
    with pytest.raises(ConfigError, match="--out .* is --from itself"):
        plant(omni, omni)
    plant(omni, tmp_path / "planted")
    with pytest.raises(ConfigError, match="already a planted regression"):
        plant(tmp_path / "planted", tmp_path / "again")
    with pytest.raises(ConfigError, match="exists; give a new directory or --overwrite"):
        plant(omni, tmp_path / "planted")
