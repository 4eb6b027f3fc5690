"""Issue #25 part 5 on the trained omni default model: its correct INT4 variant, and a copy of that INT4 whose vision
tower alone is perturbed (`quantbench plant --from INT4 --tower vision`). Stored runs of BF16 (the reference), its
noise floor (float32), INT4 and the planted INT4 go through `compare` over image and text decisions:
INT4 reads indistinguishable from BF16 on text, the planted copy worse on image decisions and indistinguishable on
text (its text answers are INT4's, bit for bit). The runs batch 16 records a forward pass to keep the test short
(191 s for all four on the 2-core VM at load 1.5-2.7): the report's which-quant table shows batch-1 runs only, so
the report's rendering of a planted row stays pinned by tests/test_planted.py; the verdicts here are the ones the
report prints (parity.compare).

The omni default model and its INT4 variant come from the cache (built once, as `quantbench demo --family omni`
builds them). The suite is this test's own: the text generator's eval split and the omni generator's image eval
split (image_colour and image_side, one question a record), N_TEXT and N_IMAGE records. An exact copy reads
indistinguishable on a modality only when its excess disagreement's upper bound (about 3.84 / (n + 3.84) at 0 of n)
is under the 2-point margin, which takes n >= 189 (tests/test_planted.py)."""

from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import pytest

from quantbench.analysis import parity
from quantbench.analysis import stats as an
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
N_TEXT, N_IMAGE = 196, 200  # records: 7 text families x 28 (some ask more than one question); 2 image families x 100


def suite_records() -> list[dict]:
    from quantbench.protocol.omnigen import generate_media
    from quantbench.protocol.suitegen import FAMILIES, generate

    text = generate("eval", 0, seed=0, families=dict.fromkeys(FAMILIES, N_TEXT // len(FAMILIES)))
    image = generate_media("eval", {"image_colour": N_IMAGE // 2, "image_side": N_IMAGE // 2})
    return [r.model_dump(mode="json", exclude_none=True) for r in text + image]


@cache
def root() -> Path:
    path = Path(tempfile.mkdtemp(prefix="quantbench-planted-omni-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@cache
def lab() -> tuple[Store, dict[str, str]]:
    """(the store of BF16, its floor, INT4 and the planted INT4; run ids by name)."""
    from quantbench.make.omni_fixture import omni_default_model_dir
    from quantbench.make.quantize import default_variant

    base = root()
    bf16, int4 = omni_default_model_dir(progress=False), default_variant("int4", "omni")
    done = subprocess.run([sys.executable, "-m", "quantbench", "plant", "--from", str(int4), "--tower", "vision",
                           "--out", str(base / "planted")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    records = suite_records()
    suite = base / "suite.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in records))
    common = dict(suite=str(suite), gpu="cpu", warmup=0, latency_min_decisions=1, latency_min_seconds=0.0,
                  concurrency=16)
    specs = {
        "bf16": RunSpec(backend="bf16", model=str(bf16), role="reference", **common),
        "floor": RunSpec(backend="bf16", model=str(bf16), role="noise_floor", dtype="float32", **common),
        "int4": RunSpec(backend="int4", model=str(int4), **common),
        "planted": RunSpec(backend="int4", model=str(base / "planted"), **common),
    }
    store, ids = Store(base / "planted.duckdb"), {}
    for name, spec in specs.items():
        result = execute(spec, echo=False)
        assert result.run.status == "ok", (name, result.run.error)
        ids[name] = store.write_run(result)
    return store, ids


def test_the_correct_int4_is_indistinguishable_on_text():
    store, ids = lab()
    int4 = parity.compare(store, ids["int4"])
    assert int4.reference.run_id == ids["bf16"] and int4.floor.run.run_id == ids["floor"]
    verdicts = {m.modality: m.verdict.label for m in int4.modalities}
    assert verdicts["text"] == an.INDISTINGUISHABLE, int4.verdict_short()
    assert verdicts["image"] != an.WORSE, int4.verdict_short()  # INT4 leaves the towers alone


def test_the_planted_int4_is_worse_on_images_and_indistinguishable_on_text():
    store, ids = lab()
    planted = parity.compare(store, ids["planted"])
    assert planted.candidate.variant == "int4+planted-vision"
    verdicts = {m.modality: m.verdict.label for m in planted.modalities}
    assert verdicts == {"text": an.INDISTINGUISHABLE, "image": an.WORSE}, planted.verdict_short()
    # the vision tower is all the plant changed: its text answers are the INT4 variant's, bit for bit
    int4 = parity.compare(store, ids["int4"])
    text = planted.per_question[planted.per_question.modality == "text"].set_index(["record_id", "question"])
    same = int4.per_question[int4.per_question.modality == "text"].set_index(["record_id", "question"])
    assert (text.tv - same.tv.reindex(text.index)).abs().max() == 0.0

