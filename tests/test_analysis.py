"""Parity statistics against values computed by hand on tiny answer tables."""

import math

import numpy as np
import pandas as pd
import pytest

from quantbench.analysis import stats as an
from quantbench.analysis.margins import Margins
from quantbench.errors import ConfigError


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


# -- the verdict, on per-question data with the real paired structure ----------------------------------------
# Every run below answers the same questions as its reference, with per-option distributions: flips happen on
# near-ties (the reference's top barely ahead), other questions move probability without changing the top answer.
# Most questions have four or five options, as 170 of the 436 built-in questions do.
KEYS = "abcde"
SHAPE = {2: [0.7, 0.3], 4: [0.55, 0.2, 0.15, 0.1], 5: [0.5, 0.2, 0.1, 0.1, 0.1]}
NEAR_TIE = {2: [0.51, 0.49], 4: [0.36, 0.34, 0.2, 0.1], 5: [0.36, 0.34, 0.1, 0.1, 0.1]}


def n_options(i):
    return (5, 4, 2, 5, 4)[i % 5]


def moved(p, t, flip):
    """p with total variation t from it; the top answer flips (p must be a near-tie) or stays."""
    q = list(p)
    if len(q) == 2:
        d = t if flip else -t  # flip: towards the second option; else sharpen the top
        q[0], q[1] = q[0] - d, q[1] + d
    elif flip:  # half of t swaps the near-tie, half moves between two minor options
        q[0], q[1], q[2], q[-1] = q[0] - t / 2, q[1] + t / 2, q[2] - t / 2, q[-1] + t / 2
    else:  # sharpen the top, spread over four options: max |Δ| is t/2, ½ Σ |Δ| is t
        q[0], q[1], q[2], q[3] = q[0] + t / 2, q[1] - t / 2, q[2] - t / 2, q[3] + t / 2
    return q


def tvs(n, flips, flip_tv, mean, seed=0):
    """Per-question TVs: flip_tv on the flips, the rest skewed (exponential, capped at 3× its mean so no
    probability goes negative; one seed moves the same questions most) and scaled so the mean is `mean`."""
    t = np.full(n, flip_tv)
    rest = [i for i in range(n) if i not in flips]
    if rest:
        raw = np.minimum(np.random.default_rng(seed).exponential(1.0, n), 3.0)[rest]  # by question: a seed
        t[rest] = raw * max(mean * n - flip_tv * len(flips), 0.0) / raw.sum()
    return t


def run_answers(n, near, flips=(), tv=None, bench=None):
    """An answers frame over n questions; `near` are the near-ties (every run of a comparison shares them)."""
    rows = []
    for i in range(n):
        k = n_options(i)
        p = (NEAR_TIE if i in near else SHAPE)[k]
        q = p if tv is None else moved(p, float(tv[i]), i in flips)
        rows.append((f"r{i}", bench(i) if bench else "mmlu", list(KEYS[:k]), q, None))
    return answers(rows)


def verdict_of(n, cand_flips, cand_tv, floor_flips=(), floor_tv=None, margins=None, bench=None):
    near = set(cand_flips) | set(floor_flips)
    ref = run_answers(n, near, bench=bench)
    cand = an.pair(ref, run_answers(n, near, set(cand_flips), cand_tv, bench))
    floor = an.pair(ref, run_answers(n, near, set(floor_flips), floor_tv if floor_tv is not None else np.zeros(n),
                                     bench))
    return cand, floor, an.parity_verdict(cand, floor, margins)


def test_tv_is_half_the_summed_absolute_differences_on_five_options():
    ref = answers([("r1", "A", list("abcde"), [0.4, 0.3, 0.1, 0.1, 0.1], None)])
    cand = answers([("r1", "A", list("abcde"), [0.3, 0.2, 0.2, 0.2, 0.1], None)])
    assert an.pair(ref, cand)["tv"].iloc[0] == pytest.approx(0.2)  # max |Δ| would be 0.1


def test_the_reference_cards_own_figures_are_within_the_margin():
    # n = 258: the floor flips 11 near-ties (95.7%), INT4 9 (96.5%), 7 of them the same ones; TV 0.028 and 0.034,
    # large on the same questions (seed=1 for both: the questions one kernel moves, the other moves too). The card
    # does not publish this pairing; the next test shows the same rates without it.
    floor_flips, int4_flips = range(0, 11), [0, 1, 2, 3, 4, 5, 6, 20, 21]
    cand, floor, v = verdict_of(258, int4_flips, tvs(258, int4_flips, 0.1, 0.034, seed=1), floor_flips,
                                tvs(258, floor_flips, 0.1, 0.028, seed=1))
    assert an.agreement(cand).rate == pytest.approx(249 / 258) and an.agreement(floor).rate == pytest.approx(247 / 258)
    assert cand["tv"].mean() == pytest.approx(0.034) and floor["tv"].mean() == pytest.approx(0.028)
    # The card's "indistinguishable from BF16 at this precision": agreement cannot be told from the floor's; TV's
    # +0.006, paired question by question, is detectable here but inside the 0.01 margin.
    assert v.label == an.WITHIN_MARGIN, v.reasons
    agree, tv = v.parts
    assert agree.label == an.INDISTINGUISHABLE
    assert (agree.diff, agree.lo, agree.hi) == pytest.approx((-2 / 258, -0.0324, 0.0142), abs=5e-4)
    assert tv.diff == pytest.approx(0.006) and 0 < tv.lo < tv.hi <= 0.01


def test_the_cards_figures_with_unrelated_flips_are_inconclusive_and_say_how_many_questions_would_tell():
    # The same rates with no flip in common and TVs large on unrelated questions: the difference is less certain.
    floor_flips, int4_flips = range(0, 11), range(20, 29)
    _, _, v = verdict_of(258, int4_flips, tvs(258, int4_flips, 0.1, 0.034, seed=1), floor_flips,
                         tvs(258, floor_flips, 0.1, 0.028, seed=2))
    assert v.label == an.INCONCLUSIVE and v.parts[0].label == an.INCONCLUSIVE
    assert v.parts[0].hi == pytest.approx(0.0283, abs=5e-4) and v.n_needed == v.parts[0].n_needed
    assert v.n_needed > 258 and f"about {v.n_needed:,} questions would tell" in v.reasons[0]


def test_a_correct_int4_and_a_broken_copy_get_different_words_against_a_floor_without_noise():
    # Held-out checkpoints on the H200, where BF16 under eager answered exactly like grouped_mm (TV 0 everywhere).
    int4_flips, broken_flips = [3, 17], list(range(0, 45, 3))
    int4, _, v_int4 = verdict_of(47, int4_flips, tvs(47, int4_flips, 0.15, 0.013))
    broken, _, v_broken = verdict_of(47, broken_flips, tvs(47, broken_flips, 0.2, 0.10))
    a, b = an.agreement(int4), an.agreement(broken)
    assert (round(100 * a.rate, 1), round(100 * a.lo, 1), round(100 * a.hi, 1)) == (95.7, 85.8, 98.8)
    assert (round(100 * b.rate, 1), round(100 * b.lo, 1), round(100 * b.hi, 1)) == (68.1, 53.8, 79.6)
    assert int4["tv"].mean() == pytest.approx(0.013) and broken["tv"].mean() == pytest.approx(0.10)
    assert v_broken.label == an.WORSE and v_broken.parts[0].lo > 0.2
    assert v_int4.label == an.INCONCLUSIVE  # 47 questions cannot tell a 2-point loss from none
    # agreement's, TV's (TV's interval the wider of the bootstrap's and Student's t: 238 with the bootstrap alone)
    assert v_int4.parts[0].n_needed == 174 and v_int4.n_needed == 399
    assert "about 399 questions would tell" in v_int4.short()


def test_230_of_250_against_a_240_of_250_floor_is_decided_by_the_interval_not_the_rate():
    # 4 points more disagreement than the floor, twice the margin; the rate alone would say worse.
    floor_flips = range(0, 10)
    small = lambda flips: tvs(250, flips, 0.04, 0.004)  # noqa: E731
    five_shared = [*range(5), *range(100, 115)]
    _, _, v = verdict_of(250, five_shared, small(five_shared), floor_flips, small(floor_flips))
    agree = v.parts[0]
    assert agree.diff == pytest.approx(0.04) and agree.lo == pytest.approx(0.0054, abs=1e-4)
    assert v.label == an.INCONCLUSIVE and agree.n_needed == 717
    nested = [*range(10), *range(100, 110)]  # every floor flip is also a candidate flip: a tighter difference
    _, _, v = verdict_of(250, nested, small(nested), floor_flips, small(floor_flips))
    assert v.parts[0].lo == pytest.approx(0.0219, abs=1e-4) and v.label == an.WORSE


@pytest.mark.parametrize("k, label", [(27, an.WITHIN_MARGIN), (28, an.INCONCLUSIVE), (52, an.INCONCLUSIVE),
                                      (53, an.WORSE)])
def test_just_inside_and_just_past_the_margin(k, label):
    # 2000 questions, a floor without noise: k flips put the interval's upper (27 → 28) or lower (52 → 53) bound
    # on either side of the 2-point margin.
    flips = range(k)
    _, _, v = verdict_of(2000, flips, tvs(2000, flips, 0.03, 0.0))
    assert v.parts[0].label == label and v.label == label
    assert v.parts[1].label != an.WORSE


def test_a_wider_margin_moves_the_same_figures_inside_it():
    flips = range(53)
    _, _, v = verdict_of(2000, flips, tvs(2000, flips, 0.03, 0.0), margins=Margins(agreement=0.04))
    assert v.label == an.WITHIN_MARGIN and "margin 4 points" in v.reasons[0]


def test_an_exact_copy_on_few_questions_is_inconclusive_and_says_how_many_would_tell():
    _, _, v = verdict_of(12, [], np.zeros(12))
    assert v.label == an.INCONCLUSIVE and v.parts[1].label == an.INDISTINGUISHABLE
    assert v.n_needed == 189  # the Wilson bound of 0/n falls to 2 points at n = 189
    assert v.short() == "inconclusive (about 189 questions would tell)"
    _, _, v = verdict_of(300, [], np.zeros(300))
    assert v.label == an.INDISTINGUISHABLE and v.n_needed is None


def test_flattened_probabilities_spread_over_four_options_are_worse_on_tv_alone():
    # Every top answer agrees; each question moves 0.016 of probability over four options (max |Δ| 0.008).
    _, _, v = verdict_of(258, [], np.full(258, 0.016))
    assert v.parts[0].label == an.INDISTINGUISHABLE and v.parts[1].label == an.WORSE and v.label == an.WORSE
    _, _, v = verdict_of(258, [], np.full(258, 0.004))
    assert v.label == an.WITHIN_MARGIN and v.parts[1].lo == pytest.approx(0.004)


def test_the_same_rule_judges_each_subset_of_questions():
    # A later per-modality breakdown is this grouping: the image questions flip, the text ones do not.
    modality = lambda i: "image" if i < 100 else "text"  # noqa: E731
    flips = range(0, 100, 4)
    cand, floor, whole = verdict_of(400, flips, tvs(400, flips, 0.1, 0.00625), bench=modality)
    by = an.verdicts_by(cand, floor, "benchmark")
    assert {k: v.label for k, v in by.items()} == {"image": an.WORSE, "text": an.INDISTINGUISHABLE}
    assert by["image"].parts[0].n == 100 and by["image"].parts[0].diff == pytest.approx(0.25)
    assert by["image"] == an.parity_verdict(cand[cand["benchmark"] == "image"], floor)
    assert whole.label == an.WORSE


def test_without_a_floor_there_is_no_verdict_but_the_way_to_get_one():
    cand, _, _ = verdict_of(20, [], np.zeros(20))
    v = an.parity_verdict(cand, None)
    assert v.label == an.NO_FLOOR and "--noise-floor" in v.reasons[0]


def test_margins_outside_zero_to_one_name_the_flag():
    with pytest.raises(ConfigError, match="--margin-agreement 2"):
        Margins(agreement=2)
    with pytest.raises(ConfigError, match="--margin-tv -0.1"):
        Margins(tv=-0.1)


def test_the_paired_score_interval_reduces_to_wilson_at_zero_discordant_questions():
    assert an.paired_difference_ci(0, 0, 258) == pytest.approx((-an.wilson(0, 258)[1], an.wilson(0, 258)[1]))
    assert an.paired_difference_ci(10, 0, 250)[0] == pytest.approx(0.0219, abs=1e-4)


@pytest.mark.parametrize("lo, hi, label", [
    (0.02, 0.05, an.INCONCLUSIVE),  # a lower bound exactly on the margin: not wholly beyond it
    (0.02 + 1e-12, 0.05, an.WORSE),  # just past it: worse
    (-0.01, 0.02, an.INDISTINGUISHABLE),  # an upper bound exactly on the margin is within it
    (0.001, 0.02, an.WITHIN_MARGIN),
])
def test_the_verdict_at_the_margins_edges(lo, hi, label):
    # `worse` means the whole interval lies beyond the margin: a lower bound that only touches it is inconclusive
    assert an._classify(lo, hi, 0.02) == label
