"""The statistics behind a verdict, against values a textbook prints (issue #35 item 7): exact McNemar, TOST,
Holm's ordering, a percentile of a known distribution, a near-tie flip counted as a near-tie, the smallest
detectable difference and the t interval over repeats. Each would fail if its arithmetic were wrong."""

import math

import numpy as np
import pandas as pd
import pytest

from quantbench.analysis import hypothesis as hy
from quantbench.analysis import significance as sig
from quantbench.analysis import stats as an
from quantbench.analysis.margins import margins_from


def test_mcnemar_matches_the_textbook_example():
    # Bentur et al. (2009), airway hyper-responsiveness before / after, as analysed by Fagerland, Lydersen & Laake
    # (2013, BMC Med Res Methodol 13:91, Table 2): b = 1, c = 7 of 21 pairs. Exact conditional 0.070, mid-p 0.039,
    # asymptotic McNemar (χ² = 4.5) 0.034.
    assert hy.mcnemar_exact(1, 7) == pytest.approx(0.0703, abs=5e-4)
    assert hy.mcnemar_exact(1, 7) == pytest.approx(18 / 256)  # 2 · (C(8,0) + C(8,1)) / 2⁸
    assert hy.mcnemar_mid_p(1, 7) == pytest.approx(0.039, abs=5e-4)
    assert hy.mcnemar_asymptotic(1, 7) == pytest.approx(0.034, abs=5e-4)
    assert hy.mcnemar_exact(7, 1) == hy.mcnemar_exact(1, 7)  # two-sided
    assert hy.mcnemar_exact(0, 0) == 1.0 and hy.mcnemar_exact(5, 5) == 1.0
    # Agresti, Categorical Data Analysis, presidential approval (Table 10.1): 150 vs 86 of 1600, z² = 17.36
    assert hy.mcnemar_asymptotic(150, 86) == pytest.approx(3.1e-5, rel=0.05)
    assert hy.mcnemar_exact(150, 86) < 1e-4


# Student's sleep data (Cushny & Peebles, 1905), the paired example of every t-test textbook: extra hours of sleep
# with two drugs in the same ten patients. R: t.test(extra ~ group, data = sleep, paired = TRUE) gives
# t = -4.0621, df = 9, p = 0.002833, mean difference -1.58, 95% CI (-2.4598858, -0.7001142).
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_tost_on_the_sleep_data_reproduces_the_paired_t_and_its_equivalence_bounds():
    d = np.array(SLEEP_1) - np.array(SLEEP_2)
    se = d.std(ddof=1) / math.sqrt(d.size)
    assert d.mean() / se == pytest.approx(-4.0621, abs=1e-4)
    wide = hy.tost_mean("sleep", d, margin=2.5)
    narrow = hy.tost_mean("sleep", d, margin=0.5)
    # bounds ±2.5 h: Δ = -1.58 lies 0.92 h inside the lower bound: t = (−1.58 + 2.5) / se = 2.3655, df 9
    assert wide.p_lower == pytest.approx(0.0211, abs=2e-4) and wide.p_upper < 1e-5 and wide.p == wide.p_lower
    # bounds ±0.5 h (TOSTER's vignette): the difference is far outside, equivalence fails
    assert narrow.p == pytest.approx(1 - 0.0107, abs=2e-4) and narrow.p > 0.05
    # TOST rejects exactly when the (1 − 2α) interval lies inside the bounds (Schuirmann 1987)
    from scipy.stats import t

    half90 = t.ppf(0.95, 9) * se
    edge = abs(d.mean()) + half90  # the bound at which the 90% interval just touches it
    assert hy.tost_mean("sleep", d, margin=edge).p == pytest.approx(0.05, abs=1e-9)
    assert hy.tost_mean("sleep", d, margin=edge * 1.01).p < 0.05 < hy.tost_mean("sleep", d, margin=edge * 0.99).p


def test_tost_on_paired_proportions_inverts_the_score_interval():
    # the margin at which TOST's p is exactly α is the bound of the (1 − 2α) Tango interval: two views of one test
    b, c, n = 12, 5, 400
    lo90, hi90 = an.paired_difference_ci(b, c, n, z=1.6448536269514722)
    assert hy.tost_paired_proportions("d", b, c, n, margin=hi90).p_upper == pytest.approx(0.05, abs=1e-6)
    t = hy.tost_paired_proportions("d", b, c, n, margin=0.05)
    assert t.estimate == pytest.approx(7 / 400) and t.p < 0.05  # 1.75 points, well inside ±5
    assert hy.tost_paired_proportions("d", b, c, n, margin=0.02).p > 0.05  # not inside ±2
    one = hy.tost_paired_proportions("loss", b, c, n, margin=0.05, one_sided=True)
    assert one.p_lower is None and one.p == one.p_upper


def test_holm_adjusts_in_step_down_order():
    # m = 4 sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max: 0.06
    assert hy.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert hy.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = hy.holm([0.2, math.nan, 0.01])
    assert math.isnan(adjusted[1]) and adjusted == pytest.approx([0.2, adjusted[1], 0.02], nan_ok=True)


def test_a_percentile_of_a_known_distribution():
    values = np.random.default_rng(0).permutation(np.arange(1, 1001, dtype=float))  # 1 … 1000, shuffled
    t = hy.tail(values)
    assert (t.p50, t.p90, t.p99, t.max) == pytest.approx((500.5, 900.1, 990.01, 1000.0))  # linear interpolation


def _paired(ref_probs, cand_probs):
    rows = []
    for i, (p, q) in enumerate(zip(ref_probs, cand_probs, strict=True)):
        opts = ["a", "b", "c"][: len(p)]
        rows.append({"record_id": f"r{i}", "question": "q", "benchmark": "b", "modality": "text", "options": opts,
                     "probs": p, "top": opts[int(np.argmax(p))], "gold": opts[0]})
        rows[-1]["cand"] = {"options": opts, "probs": q, "top": opts[int(np.argmax(q))]}
    ref = pd.DataFrame([{k: v for k, v in r.items() if k != "cand"} for r in rows])
    cand = pd.DataFrame([{**{k: v for k, v in r.items() if k != "cand"}, **r["cand"]} for r in rows])
    return an.pair(ref, cand)


def test_a_flip_on_a_near_tie_is_counted_as_a_near_tie_and_one_on_a_sure_answer_as_confident():
    paired = _paired(
        ref_probs=[[0.52, 0.48], [0.55, 0.45], [0.9, 0.1], [0.7, 0.2, 0.1], [0.6, 0.4]],
        cand_probs=[[0.49, 0.51], [0.56, 0.44], [0.3, 0.7], [0.45, 0.5, 0.05], [0.7, 0.3]])
    f = sig.flip_classes(paired)
    # BF16 margins 0.04 (flipped), 0.10 (kept), 0.80 (flipped), 0.50 (flipped), 0.20 (kept)
    assert (f.near_tie_n, f.near_tie_flips) == (1, 1)
    assert (f.middle_n, f.middle_flips) == (2, 0)  # 0.10 is not a near-tie (< 0.1); 0.20 is middle
    assert (f.confident_n, f.confident_flips) == (2, 2)  # 0.50 (≥ 0.5, though 0.7 − 0.2 rounds below) and 0.80
    assert list(sig.confident_flips(paired)["record_id"]) == ["r2", "r3"]
    assert sig.flip_class(0.0999999) == "near-tie" and sig.flip_class(0.6 - 0.5) == "middle"


def test_the_smallest_detectable_difference_shrinks_with_questions():
    # with no discordance on the other side, Connor's formula gives δ ≈ (z₀.₉₇₅ + z₀.₈)² / n = 7.85 / n
    assert hy.mdd_paired_proportions(1000, 0.0) == pytest.approx(7.85 / 1000, rel=0.02)
    assert hy.mdd_paired_proportions(400, 0.02) > hy.mdd_paired_proportions(400, 0.0)  # noise hides differences
    assert hy.mdd_mean(0.1, 100) == pytest.approx(2.8016 * 0.01, abs=1e-4)


def test_a_t_interval_over_repeats():
    s = hy.t_interval([10.0, 12.0, 14.0])  # mean 12, sd 2, t(0.975, 2) = 4.3027
    assert (s.mean, s.sd, s.cv) == pytest.approx((12.0, 2.0, 2 / 12))
    assert (s.lo, s.hi) == pytest.approx((12 - 4.3027 * 2 / math.sqrt(3), 12 + 4.3027 * 2 / math.sqrt(3)), abs=1e-3)
    assert hy.t_interval([5.0]) is None  # one run has no spread


def test_the_mlperf99_margin_judges_accuracy_against_bf16_one_sided():
    margins = margins_from("mlperf99")
    assert (margins.agreement, margins.tv, margins.accuracy, margins.name) == (None, None, 0.01, "mlperf99")
    assert margins_from("agreement=0.03,tv=0.02").name == "custom"
    assert margins_from("card", agreement=0.05).agreement == 0.05
    with pytest.raises(Exception, match="--margin 'tight'"):
        margins_from("tight")
    # 1000 gold questions, BF16 right on 900: losing 5 net (0.5 points) is within 1% of 90% = 0.9 points
    n = 1000
    ref = [[0.8, 0.2]] * 900 + [[0.2, 0.8]] * 100
    cand = [[0.8, 0.2]] * 890 + [[0.2, 0.8]] * 10 + [[0.2, 0.8]] * 95 + [[0.8, 0.2]] * 5
    paired = _paired(ref, cand)
    v = an.parity_verdict(paired, None, margins)
    [acc] = v.parts
    assert acc.statistic == "accuracy loss" and (acc.b, acc.c, acc.n) == (10, 5, n)
    assert acc.margin == pytest.approx(0.009) and acc.tost.p_lower is None
    assert (acc.floor, acc.candidate, acc.diff) == pytest.approx((0.9, 0.895, 0.005))  # BF16's, the variant's, lost
    # 0.5 points lost ± 0.8 (Agresti–Min): the interval reaches past the 0.9-point margin, so not yet shown
    se = math.sqrt((16 / 1002 - (5 / 1002) ** 2) / 1002)  # ½ added to each cell: b 10.5, c 5.5, n 1002
    assert (acc.lo, acc.hi) == pytest.approx((0.005 - 1.96 * se, 0.005 + 1.96 * se), abs=1e-4)
    assert acc.tost.p == pytest.approx(hy.norm_cdf((0.005 - 0.009) / se))
    assert v.label == an.INCONCLUSIVE and acc.tost.p > 0.05  # accuracy margins need no noise floor
    exact = an.parity_verdict(_paired(ref, ref), None, margins).parts[0]  # no discordance: still an interval
    assert exact.diff == 0.0 and exact.hi > 0.0015 and exact.tost.p < 0.05
    losing = _paired(ref, [[0.8, 0.2]] * 870 + [[0.2, 0.8]] * 130)  # 3 points lost of BF16's 90%: beyond 0.9
    worse = an.parity_verdict(losing, None, margins)
    assert worse.label == an.WORSE and worse.parts[0].tost.p > 0.999
