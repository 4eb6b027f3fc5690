"""Parity per modality: `compare`, `report` and the which-quant rule judge each modality's questions on their own,
so a variant indistinguishable on text but broken on pictures is flagged for pictures and not recommended."""

import json

import numpy as np
import pytest

from quantbench import report
from quantbench.analysis import parity
from quantbench.analysis import stats as an
from quantbench.report.tables import print_comparison
from tests.test_report import Lab

# 240 questions a modality: an exact copy's 0 disagreements in n questions bound the excess at about 3.84 / n,
# under the 2-point margin from n = 189 on (README, The verdict); 240 leaves room for a floor that flips a few.
N_TEXT, N_IMAGE = 240, 240


class ModalLab(Lab):
    """Lab's questions, the first N_TEXT text and the rest image; `image_noise` perturbs only the image ones."""

    def __init__(self, path, n_text=N_TEXT, n_media=N_IMAGE, media="image"):
        super().__init__(path, n=n_text + n_media)
        self.n_text, self.media = n_text, media

    def answers(self, noise=0.0, flatten=0.0, seed=1, image_noise=0.0):
        rows = super().answers(noise, flatten, seed)
        rng = np.random.default_rng(seed + 100)
        for i, row in enumerate(rows):
            row["modality"] = "text" if i < self.n_text else self.media
            if row["modality"] != "text" and image_noise:
                lg = np.log(np.asarray(row["probs"])) + rng.normal(0, image_noise, len(row["probs"]))
                p = np.exp(lg - lg.max())
                row["probs"] = (p / p.sum()).tolist()
                row["top"] = row["options"][int(np.argmax(p))]
        return rows


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = ModalLab(tmp_path_factory.mktemp("modal") / "r.duckdb")
    ids = {
        "bf16": lab.run(ms=14),
        "floor": lab.run(lab.answers(), kernel_path="transformers experts=eager", role="noise_floor"),
        "copy": lab.run(lab.answers(), backend="int4", variant="copy", model_tensor_bytes=30_000_000),
        "planted": lab.run(lab.answers(image_noise=3.0), backend="int4", variant="int4-planted-vision",
                           model_tensor_bytes=20_000_000, native="native"),
    }
    return lab, ids


def test_a_variant_broken_on_images_only_is_worse_on_images_and_indistinguishable_on_text(lab):
    lab, ids = lab
    c = parity.compare(lab.store, ids["planted"])
    by = {m.modality: m for m in c.modalities}
    assert list(by) == ["text", "image"] and c.per_modality
    assert by["text"].verdict.label == an.INDISTINGUISHABLE and by["text"].agreement.k == N_TEXT
    assert by["image"].verdict.label == an.WORSE and by["image"].agreement.n == N_IMAGE
    assert [m.modality for m in c.flagged()] == ["image"]
    assert c.verdict_short() == "all: worse; text: indistinguishable; image: worse"  # pooled first, named
    table = parity.by_modality(c)
    assert table.modality.tolist() == ["text", "image"]
    image = table.set_index("modality").loc["image"]
    assert image.agreement_lo <= image.agreement <= image.agreement_hi < 0.9
    assert image.tv_lo <= image.tv_mean <= image.tv_hi and image.tv_lo > 0.01
    assert image.flips_right_to_wrong > 0 and image.delta_accuracy_lo <= image.delta_accuracy <= image.delta_accuracy_hi
    assert table.set_index("modality").loc["text"].tv_mean == 0.0
    assert c.to_dict()["worse_on"] == ["image"]


def test_an_exact_copy_is_indistinguishable_on_every_modality(lab):
    lab, ids = lab
    c = parity.compare(lab.store, ids["copy"])
    assert [(m.modality, m.verdict.label) for m in c.modalities] == [("text", an.INDISTINGUISHABLE),
                                                                       ("image", an.INDISTINGUISHABLE)]
    assert c.flagged() == []


def test_the_report_flags_the_modality_and_does_not_recommend_the_broken_variant(lab):
    lab, ids = lab
    md = report.report_text(str(lab.store.path))
    assert f"Questions by modality: text {N_TEXT}; image {N_IMAGE}." in md
    planted = next(line for line in md.splitlines() if line.startswith("| int4-planted-vision |"))
    assert "text: indistinguishable; image: worse" in planted
    assert "worse than the noise floor by more than the margin on image decisions" in planted
    assert "⭐" not in planted and "**Recommended: copy**" in md
    assert "Parity per modality" in md
    rows = [line for line in md.splitlines() if line.startswith("| int4-planted-vision | image |")]
    # its row in the parity-per-modality table, then in the statistics table
    assert len(rows) == 2 and rows[0].rstrip(" |").endswith("worse")
    assert "not shown equivalent (p " in rows[1] and "margin card" in rows[1]
    assert "int4-planted-vision on image (240 questions): worse" in md
    data = json.loads(report.report_text(str(lab.store.path), fmt="json"))
    [rep] = data["reports"]
    assert rep["modality_counts"] == {"text": N_TEXT, "image": N_IMAGE}
    row = next(r for r in rep["rows"] if r["variant"] == "int4-planted-vision")
    assert row["worse_on"] == "image" and row["verdict_by_modality"] == "text: indistinguishable; image: worse"
    assert [(m["modality"], m["verdict"]) for m in row["by_modality"]] == [("text", an.INDISTINGUISHABLE),
                                                                          ("image", an.WORSE)]
    csv = report.report_text(str(lab.store.path), fmt="csv")
    assert "worse_on" in csv.splitlines()[0]


def test_compare_prints_the_modality_table_and_why_a_modality_is_worse(lab):
    from rich.console import Console

    lab, ids = lab
    console = Console(record=True, width=250)
    print_comparison(parity.compare(lab.store, ids["planted"]), console)
    text = console.export_text()
    assert "Parity per modality" in text and "worse on image (240 questions):" in text


def test_a_text_only_comparison_keeps_one_modality_and_the_overall_verdict(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=50)
    lab.run()
    lab.run(lab.answers(), kernel_path="transformers experts=eager", role="noise_floor")
    cand = lab.run(lab.answers(noise=0.04, seed=5), backend="int4", variant="int4")
    c = parity.compare(lab.store, cand)
    assert [m.modality for m in c.modalities] == ["text"] and not c.per_modality
    assert c.modalities[0].verdict is c.verdict and c.verdict_short() == c.verdict.short()
    md = report.report_text(str(lab.store.path))
    assert "Questions by modality: text 50." in md and "Parity per modality" not in md


def test_a_modality_too_small_to_move_the_overall_verdict_still_excludes_the_variant(tmp_path):
    lab = ModalLab(tmp_path / "r.duckdb", n_text=592, n_media=8, media="audio")
    lab.run(ms=14)
    lab.run(lab.answers(), kernel_path="transformers experts=eager", role="noise_floor")
    lab.run(lab.answers(image_noise=4.0), backend="int4", variant="broken-audio", model_tensor_bytes=20_000_000)
    lab.run(lab.answers(), backend="int4", variant="copy", model_tensor_bytes=30_000_000)
    [rep] = report.build_report(lab.store)
    rows = {r.label: r for r in rep.rows}
    c = rows["broken-audio"].comparison
    assert c.verdict.label != an.WORSE  # over all 600 questions the broken audio hides
    assert [m.modality for m in c.flagged()] == ["audio"]
    assert "worse than the noise floor by more than the margin on audio decisions" in rows["broken-audio"].excluded
    assert rep.recommended.label == "copy"
