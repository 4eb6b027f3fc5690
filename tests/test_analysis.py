"""Parity statistics against values computed by hand on tiny answer tables."""

import math

import numpy as np
import pandas as pd
import pytest

from quantbench import analysis as an


def answers(rows):
    """rows: (record_id, benchmark, options, probs, gold) → an answers frame with top = argmax."""
    return pd.DataFrame([
        {"record_id": r, "question": "q", "benchmark": b, "options": o, "probs": p,
         "top": o[max(range(len(p)), key=p.__getitem__)], "gold": g}
        for r, b, o, p, g in rows
    ])


# Four questions whose statistics are worked out in the comments.
REF = answers([
    ("r1", "A", ["a", "b"], [0.7, 0.3], "a"),
    ("r2", "A", ["a", "b", "c"], [0.5, 0.3, 0.2], "b"),
    ("r3", "B", ["yes", "no"], [0.9, 0.1], None),
    ("r4", "B", ["a", "b"], [0.51, 0.49], "b"),
])
CAND = answers([
    ("r1", "A", ["a", "b"], [0.4, 0.6], "a"),  # flips: TV 0.3, Δp −0.3
    ("r2", "A", ["a", "b", "c"], [0.5, 0.3, 0.2], "b"),  # identical
    ("r3", "B", ["no", "yes"], [0.2, 0.8], None),  # same options in another order: q = [0.8, 0.2]
    ("r4", "B", ["a", "b"], [0.49, 0.51], "b"),  # a near-tie that flips
])


def by_record(paired):
    return paired.set_index("record_id")


def test_wilson_interval_matches_published_values():
    assert an.wilson(9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)
    assert an.wilson(2, 4) == pytest.approx((0.1500, 0.8500), abs=1e-4)
    assert an.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert an.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert all(math.isnan(x) for x in an.wilson(0, 0))


def test_pair_computes_tv_kl_dp_and_margin_per_question():
    p = by_record(an.pair(REF, CAND))
    assert p.loc["r1", "tv"] == pytest.approx(0.3)
    assert p.loc["r1", "kl"] == pytest.approx(0.7 * math.log(0.7 / 0.4) + 0.3 * math.log(0.3 / 0.6))
    assert p.loc["r1", "dp"] == pytest.approx(-0.3)
    assert p.loc["r1", "ref_margin"] == pytest.approx(0.4)
    assert p.loc["r2", ["tv", "kl", "dp"]].tolist() == [0.0, 0.0, 0.0]
    # Options in another order are matched by key, not position.
    assert p.loc["r3", "tv"] == pytest.approx(0.1)
    assert p.loc["r3", "kl"] == pytest.approx(0.9 * math.log(0.9 / 0.8) + 0.1 * math.log(0.1 / 0.2))
    assert p.loc["r3", "dp"] == pytest.approx(-0.1)
    assert bool(p.loc["r3", "agree"])
    assert p.loc["r4", "kl"] == pytest.approx(0.02 * math.log(0.51 / 0.49))
    assert p.loc["r4", "ref_margin"] == pytest.approx(0.02)


def test_kl_stays_finite_when_the_candidate_gives_an_option_zero():
    ref = answers([("r1", "A", ["a", "b"], [0.5, 0.5], None)])
    cand = answers([("r1", "A", ["a", "b"], [1.0, 0.0], None)])
    kl = an.pair(ref, cand)["kl"].iloc[0]
    assert kl == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / an.KL_FLOOR))


def test_pair_keeps_only_questions_both_runs_answered():
    p = an.pair(REF, CAND[CAND.record_id != "r2"])
    assert sorted(p.record_id) == ["r1", "r3", "r4"]


def test_pair_refuses_questions_asked_with_different_options():
    other = CAND.copy()
    other.at[0, "options"] = ["a", "z"]
    with pytest.raises(an.ParityError, match="record 'r1' question 'q'.*different options"):
        an.pair(REF, other)


def test_agreement_and_flips_by_hand():
    p = an.pair(REF, CAND)
    a = an.agreement(p)
    assert (a.k, a.n, a.rate) == (2, 4, 0.5)
    assert (a.lo, a.hi) == pytest.approx((0.1500, 0.8500), abs=1e-4)
    # Gold on r1 (ref right, cand wrong), r2 (both wrong), r4 (ref wrong, cand right); r3 has none.
    assert an.flips(p) == an.Flips(n_gold=3, ref_right_cand_wrong=1, ref_wrong_cand_right=1, both_right=0,
                                   both_wrong=1)


def test_distribution_uses_linear_percentiles():
    d = an.distribution([0.3, 0.0, 0.1, 0.02])
    assert (d.n, d.min, d.max) == (4, 0.0, 0.3)
    assert d.mean == pytest.approx(0.105)
    assert d.median == pytest.approx(0.06)
    assert d.p90 == pytest.approx(0.24)  # sorted[2] + 0.7 · (sorted[3] − sorted[2])
    assert d.p10 == pytest.approx(0.006)
    assert math.isnan(an.distribution([]).mean)


def test_confidence_buckets_separate_near_ties():
    b = an.confidence_buckets(an.pair(REF, CAND)).set_index("margin")
    assert b["n"].tolist() == [1, 0, 0, 1, 1, 1]  # margins 0.02, 0.2, 0.4, 0.8
    assert b.loc["0.00–0.05", "rate"] == 0.0  # the near-tie flipped
    assert b.loc["0.40–0.70", "rate"] == 0.0  # r1, margin 0.4, flipped too
    assert b.loc["0.70–1.00", "rate"] == 1.0  # the top edge is inclusive
    assert b["n"].sum() == 4


def test_accuracy_by_benchmark_counts_only_questions_with_gold():
    acc = an.accuracy_by_benchmark(REF).set_index("benchmark")
    assert acc.loc["A", ["n_gold", "correct"]].tolist() == [2, 1]
    assert acc.loc["B", ["n_gold", "correct", "accuracy"]].tolist() == [1, 0, 0.0]


def test_paired_accuracy_deltas_and_unweighted_mean_by_hand():
    pa = an.paired_accuracy(an.pair(REF, CAND), seed=0)
    by = pa.by_benchmark.set_index("benchmark")
    assert by.loc["A", ["n", "acc_ref", "acc_cand", "delta"]].tolist() == [2, 0.5, 0.0, -0.5]
    assert by.loc["B", ["n", "acc_ref", "acc_cand", "delta"]].tolist() == [1, 0.0, 1.0, 1.0]
    assert (by.loc["B", "lo"], by.loc["B", "hi"]) == (1.0, 1.0)  # one question: no sampling spread
    assert pa.mean.mean == pytest.approx(0.25)  # (−0.5 + 1.0) / 2, not weighted by n
    assert pa.mean.lo <= 0.25 <= pa.mean.hi


def test_paired_bootstrap_is_reproducible_from_its_seed():
    rows = [(f"r{i}", "A", ["a", "b"], [0.6, 0.4], "a" if i % 3 else "b") for i in range(60)]
    ref = answers(rows)
    cand = answers([(r, b, o, [0.4, 0.6] if int(r[1:]) % 5 == 0 else p, g) for r, b, o, p, g in rows])
    one, two = (an.paired_accuracy(an.pair(ref, cand), seed=7).mean for _ in range(2))
    assert one == two
    assert one.lo < one.mean < one.hi


def test_no_gold_gives_no_accuracy_delta():
    ref = answers([("r1", "A", ["a", "b"], [0.7, 0.3], None)])
    pa = an.paired_accuracy(an.pair(ref, ref))
    assert pa.mean is None and pa.by_benchmark.empty


def test_counting_bootstrap_matches_plain_resampling():
    v = np.array([0.0] * 60 + [1.0] * 140)
    fast = an.boot_means(v, np.random.default_rng(0), 4000)  # two distinct values: drawn as counts
    slow = an.boot_means(v + np.arange(200) * 1e-12, np.random.default_rng(1), 4000)  # 200 values: resampled
    assert np.percentile(fast, [2.5, 50, 97.5]) == pytest.approx(np.percentile(slow, [2.5, 50, 97.5]), abs=0.01)
    assert fast.std() == pytest.approx(math.sqrt(0.7 * 0.3 / 200), rel=0.1)


def test_bootstrap_mean_of_a_constant_has_no_width():
    ci = an.bootstrap_mean([0.2] * 50)
    assert (ci.mean, ci.lo, ci.hi) == pytest.approx((0.2, 0.2, 0.2))


FLOOR_AGREE = an.Agreement(k=240, n=250, rate=0.96, lo=0.928, hi=0.978)
FLOOR_TV = an.MeanCI(n=250, mean=0.028, lo=0.024, hi=0.032)


def test_a_perfect_copy_is_indistinguishable_from_the_floor():
    lo, hi = an.wilson(250, 250)
    v = an.noise_floor_verdict(an.Agreement(250, 250, 1.0, lo, hi), an.MeanCI(250, 0.0, 0.0, 0.0), FLOOR_AGREE,
                               FLOOR_TV)
    assert v.label == "indistinguishable"


def test_lower_agreement_outside_the_floor_is_worse():
    lo, hi = an.wilson(200, 250)
    v = an.noise_floor_verdict(an.Agreement(200, 250, 0.8, lo, hi), an.MeanCI(250, 0.03, 0.026, 0.034), FLOOR_AGREE,
                               FLOOR_TV)
    assert v.label == "worse"
    assert len(v.reasons) == 1 and v.reasons[0].startswith("agreement 80.0%")


def test_flattened_probabilities_are_worse_even_when_every_top_answer_agrees():
    lo, hi = an.wilson(250, 250)
    v = an.noise_floor_verdict(an.Agreement(250, 250, 1.0, lo, hi), an.MeanCI(250, 0.2, 0.18, 0.22), FLOOR_AGREE,
                               FLOOR_TV)
    assert v.label == "worse"
    assert v.reasons[0].startswith("mean TV 0.2000")


def test_without_a_floor_there_is_no_verdict_but_the_way_to_get_one():
    v = an.noise_floor_verdict(FLOOR_AGREE, FLOOR_TV, None, None)
    assert v.label == "no noise floor"
    assert "--noise-floor" in v.reasons[0]


def test_tiny_tv_differences_are_noise_even_against_a_floor_that_moved_nothing():
    still = an.MeanCI(250, 0.0, 0.0, 0.0)
    lo, hi = an.wilson(250, 250)
    perfect = an.Agreement(250, 250, 1.0, lo, hi)
    assert an.noise_floor_verdict(perfect, an.MeanCI(250, 0.0002, 0.0001, 0.0003), perfect, still).label == (
        "indistinguishable")
    assert an.noise_floor_verdict(perfect, an.MeanCI(250, 0.0065, 0.006, 0.007), perfect, still).label == "worse"
