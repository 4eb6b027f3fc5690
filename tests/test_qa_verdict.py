"""QA of the verdicts and recommendations: each test is a defect a user saw (a verdict the data does not support, a
recommendation against its own rule, a misleading label), on hand-made runs whose answer is known."""

import pytest

from quantbench import report
from quantbench.analysis import constraints, parity, recommend
from quantbench.analysis import stats as an
from quantbench.analysis.stats import ParityError
from tests.test_report import MB, Lab


def _rows(rep):
    return {r.label: r for r in rep.rows}


def test_a_variant_quantized_from_other_bf16_weights_gets_no_verdict(tmp_path):
    # The committed store's H200 int4 rows were quantized from another build of the fixture (its embeddings, norms
    # and router differ from the BF16 run's) under the same model id: the report judged int4 `worse` (97% agreement)
    # for flips that measure the other model, not the quantization.
    lab = Lab(tmp_path / "r.duckdb", n=400)  # enough questions for fp8's exact copy to read within the margin
    lab.run(shared_tensors_hash="a" * 64)
    lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor",
            shared_tensors_hash="a" * 64)
    other = lab.run(lab.answers(noise=1.5, seed=9), backend="int4", variant="int4", weight_format="int4",
                    native="native", model_tensor_bytes=20 * MB, shared_tensors_hash="b" * 64)
    same = lab.run(lab.answers(), backend="fp8", variant="fp8", weight_format="fp8", native="native",
                   model_tensor_bytes=30 * MB, shared_tensors_hash="a" * 64)
    with pytest.raises(ParityError, match="shared tensors differ"):
        parity.compare(lab.store, other)
    assert parity.compare(lab.store, same).verdict.label != an.NO_FLOOR
    rep, = recommend.build_report(lab.store)
    int4 = _rows(rep)["int4"]
    assert int4.comparison is None and int4.quality.startswith("not comparable (shared tensors differ")
    assert "worse" not in int4.best_for and rep.recommended.label == "fp8"


def test_recommend_takes_a_batched_latency_only_from_the_rows_own_implementation(tmp_path):
    # Batched passes were matched by the label's first word: `bf16 (transformers grouped_mm)` showed (and was picked
    # by) the quantbench engine's 8-a-pass time, a kernel it never ran.
    lab = Lab(tmp_path / "r.duckdb", n=60)
    lab.run(ms=14)
    lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor")
    engine = "quantbench grouped-moe torch._grouped_mm"
    lab.run(ms=12, kernel_path=engine)
    batched = lab.run(ms=5, batch=8, kernel_path=engine)
    [answer] = constraints.answer(lab.store, constraints.Constraints(concurrency=8, max_latency_ms=50))
    by_label = {k.label: k for k in answer.candidates}
    assert by_label["bf16 (quantbench engine)"].latency.basis == "batched"
    assert batched[:13] in by_label["bf16 (quantbench engine)"].latency.text
    hf = by_label["bf16 (transformers grouped_mm)"]
    assert hf.latency.basis == "batch-1" and hf.latency.value == pytest.approx(14.45)
    assert batched[:13] not in hf.latency.text


def test_a_partial_run_and_a_partial_floor_say_how_many_questions_they_were_judged_on(tmp_path):
    # fp8 answered 20 of the 300 questions (--limit 20) and the noise floor 40: the report said "the share of 300
    # questions" for fp8's 20, and put int4's tests against the floor (on 40 questions) under n = 300.
    lab = Lab(tmp_path / "r.duckdb", n=300)
    lab.run()
    lab.run(lab.answers(noise=0.05)[:40], kernel_path="transformers experts=eager", role="noise_floor")
    lab.run(lab.answers(noise=0.04, seed=5), backend="int4", variant="int4", weight_format="int4", native="native")
    lab.run(lab.answers()[:20], backend="fp8", variant="fp8", weight_format="fp8", native="native")
    [rep] = recommend.build_report(lab.store)
    int4 = _rows(rep)["int4"].comparison
    assert int4.agreement.n == 300 and int4.verdict.n_with_floor == 40
    text = report.render([rep])
    assert "share of 300 questions (fewer where a variant answered only some of them: fp8: 20)" in text
    assert "on the 40 of its 300 questions the noise floor answered too" in text
    assert "| int4 | text | 300 (40 with the noise floor) |" in text
    assert "| fp8 | text | 20 |" in text


def test_compare_names_the_questions_its_smallest_detectable_difference_was_computed_on(tmp_path):
    # compare printed "n = 300" beside a smallest detectable difference computed on the floor's 40 questions.
    from typer.testing import CliRunner

    from quantbench.cli import app

    lab = Lab(tmp_path / "r.duckdb", n=300)
    lab.run()
    lab.run(lab.answers(noise=0.05)[:40], kernel_path="transformers experts=eager", role="noise_floor")
    int4 = lab.run(lab.answers(noise=0.04, seed=5), backend="int4", variant="int4", weight_format="int4")
    done = CliRunner().invoke(app, ["compare", int4, "--db", str(lab.store.path)])
    assert done.exit_code == 0, done.output
    out = " ".join(done.stdout.split())
    assert "power 80%, n = 40):" in out and "power 80%, n = 300)" not in out


def test_a_pick_no_noise_floor_judged_does_not_claim_it_is_not_worse_than_one(tmp_path):
    # Without a noise-floor run every verdict reads `no noise floor`, yet the pick's rule said "not worse than the
    # noise floor", a claim nothing measured.
    lab = Lab(tmp_path / "r.duckdb", n=60)
    lab.run()
    lab.run(backend="int4", variant="int4", weight_format="int4", native="native", model_tensor_bytes=20 * MB)
    [rep] = recommend.build_report(lab.store)
    assert rep.recommended.label == "int4" and rep.recommended.comparison.verdict.label == an.NO_FLOOR
    assert "no noise-floor run here: it was judged on its agreement with BF16 alone" in rep.rule
    lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor")
    [rep] = recommend.build_report(lab.store)
    assert rep.rule.endswith("shown within the margin over the noise floor, native format preferred")


def test_a_repeat_group_with_a_failed_run_says_how_many_of_its_runs_the_interval_is_over(tmp_path):
    # `run --repeat 3` with one run failing read "(2 runs, CV …)", as if two had been asked for.
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run()
    for i, (ms, status) in enumerate([(30, "ok"), (40, "ok"), (50, "failed")]):
        lab.run(ms=ms, backend="int4", variant="int4", weight_format="int4", repeat_id="rep1", repeat_index=i,
                repeat_count=3, status=status, failure=None if status == "ok" else "crashed")
    text = report.render(recommend.build_report(lab.store))
    assert "(2 of 3 runs, CV" in text and "(2 runs," not in text
