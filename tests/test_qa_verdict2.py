"""QA of verdicts, second pass: a verdict decided by too few questions, and a recommendation its verdict does not
support (each test failed before its fix)."""

import pandas as pd

from quantbench import report
from quantbench.analysis import recommend
from quantbench.analysis import stats as an
from quantbench.analysis.margins import Margins
from tests.test_report import MB, Lab


def _tv_frames(tvs_candidate, tvs_floor):
    rows = [dict(record_id=f"r{i}", question="q", agree=True) for i in range(len(tvs_candidate))]
    cand = pd.DataFrame([dict(r, tv=t) for r, t in zip(rows, tvs_candidate, strict=True)])
    floor = pd.DataFrame([dict(r, tv=t) for r, t in zip(rows, tvs_floor, strict=True)])
    return cand, floor


TV_ONLY = Margins(agreement=None, tv=0.01)


def test_one_question_decides_no_tv_verdict():
    # A TV-only margin judged one question `indistinguishable`: the bootstrap of one value is that value, a
    # zero-width interval.
    v = an.parity_verdict(*_tv_frames([0.002], [0.0]), TV_ONLY)
    assert v.label == an.INCONCLUSIVE and v.no_interval and v.n_needed is None
    assert "one question gives no interval" in v.short() and "no interval" in v.reasons[0]
    assert "nan" not in v.reasons[0]


def test_a_few_questions_get_students_interval_not_the_bootstraps_alone():
    # Two questions with TV excesses 0.001 and 0.012: the bootstrap's percentiles span [0.001, 0.012] at most,
    # Student's t (1 degree of freedom) about ±0.07 around the mean: straddling the 0.01 margin.
    v = an.parity_verdict(*_tv_frames([0.001, 0.012], [0.0, 0.0]), TV_ONLY)
    assert v.label == an.INCONCLUSIVE and v.n_needed is not None and not v.no_interval
    [part] = v.parts
    assert part.lo < -0.05 and part.hi > 0.06


def test_many_questions_keep_a_decided_verdict():
    v = an.parity_verdict(*_tv_frames([0.002 + 0.0001 * (i % 7) for i in range(200)], [0.0] * 200), TV_ONLY)
    assert v.label == an.WITHIN_MARGIN


def test_an_inconclusive_variant_is_not_the_recommendation(tmp_path):
    # int4 read `inconclusive (about N questions would tell)` and was still recommended ("not worse than the noise
    # floor"): a pick its own verdict says the questions cannot support.
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run(model_tensor_bytes=60 * MB)
    lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor")
    lab.run(lab.answers(noise=0.04, seed=5), backend="int4", variant="int4", weight_format="int4", native="native",
            model_tensor_bytes=20 * MB)
    [rep] = recommend.build_report(lab.store)
    int4 = next(r for r in rep.rows if r.label == "int4")
    assert int4.comparison.verdict.label == an.INCONCLUSIVE
    assert not int4.recommended and rep.recommended.label == "bf16"
    assert "not shown within the margin: inconclusive (about" in int4.best_for
    text = report.render([rep])
    assert "**Recommended: bf16**" in text and "Neither worse nor inconclusive is recommended" in text


def _with_images(answers, n_images):
    return [dict(a, modality="image" if i < n_images else "text") for i, a in enumerate(answers)]


def test_a_modality_too_small_to_decide_does_not_hold_a_decided_variant_back(tmp_path):
    # The pooled verdict decides; a modality of 5 questions reads inconclusive as it must, and the variant stays
    # recommendable (only `worse` on a modality excludes it).
    lab = Lab(tmp_path / "r.duckdb", n=400)
    lab.run(_with_images(lab.answers(), 5), model_tensor_bytes=60 * MB)
    lab.run(_with_images(lab.answers(noise=0.05), 5), kernel_path="transformers experts=eager", role="noise_floor")
    lab.run(_with_images(lab.answers(), 5), backend="int4", variant="int4", weight_format="int4", native="native",
            model_tensor_bytes=20 * MB)
    [rep] = recommend.build_report(lab.store)
    assert rep.recommended.label == "int4"
    c = rep.recommended.comparison
    assert c.verdict.label in (an.INDISTINGUISHABLE, an.WITHIN_MARGIN)
    by_modality = {m.modality: m.verdict.label for m in c.modalities}
    assert by_modality["image"] == an.INCONCLUSIVE
