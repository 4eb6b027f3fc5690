"""Parity statistics on answer tables: pure functions of DataFrames, no I/O.

An answers frame has one row per (record_id, question) with `options` (option keys), `probs` (their
probabilities, same order), `top`, `gold` (or None) and `benchmark` — the `answers` table of the store.
`pair(reference, candidate)` lines two runs up question by question; everything else works on that pairing.

Conventions, so the numbers can be checked by hand:
- agreement: the share of questions where both runs pick the same top option, with a Wilson 95% interval;
- TV = ½ Σ |p_ref − p_cand| over the question's options; KL(ref ‖ cand) = Σ p_ref · ln(p_ref / p_cand), with
  p_cand floored at KL_FLOOR so one zero probability cannot make it infinite;
- Δp = p_cand(ref's top) − p_ref(ref's top): negative when the candidate is less sure of the reference's answer;
- the reference's confidence is its margin, p(top) − p(second): a near-tie has a small margin;
- percentiles interpolate linearly (DuckDB's quantile_cont, numpy's default);
- bootstrap intervals are percentile intervals over `n_boot` resamples from `numpy.random.default_rng(seed)`.
- the verdict (`parity_verdict`) compares a candidate's pairing with the reference to the noise floor's on the same
  questions: the excess and its 95% interval against a named margin fixed beforehand (quantbench.analysis.margins: the
  card's preset, MLPerf's accuracy gates); the tests behind it are quantbench.analysis.hypothesis's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from quantbench.analysis import hypothesis as hy
from quantbench.analysis.margins import Margins
from quantbench.errors import QuantbenchError

Z95 = 1.959963984540054
KL_FLOOR = 1e-12
N_BOOT = 2000
# Verdict words, from best to worst.
INDISTINGUISHABLE = "indistinguishable"  # the excess over the floor is within the margin and not detectably above 0
WITHIN_MARGIN = "different, within margin"  # detectably above the floor, but bounded within the margin
INCONCLUSIVE = "inconclusive"  # the interval straddles the margin: too few questions to tell
WORSE = "worse"  # the whole interval lies beyond the margin
NO_FLOOR = "no noise floor"
# The one accuracy quantbench reports (`runs`, `report`, `compare`, the dashboard): each benchmark's share of right
# answers on its questions with a gold answer, averaged over benchmarks without weights (a large benchmark does not
# drown a small one; the fixture's families differ in size).
ACCURACY_NAME = "accuracy (mean over benchmarks)"
NO_GOLD = "no gold answers"
# Margin buckets: near-ties (margin < 0.05) are where two equally valid kernels already disagree.
MARGIN_EDGES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0)


class ParityError(QuantbenchError):
    """Two runs cannot be compared (different inputs, nothing in common, a missing reference)."""


@dataclass(frozen=True)
class Agreement:
    k: int  # questions where the top answers agree
    n: int
    rate: float
    lo: float  # Wilson 95% interval
    hi: float


@dataclass(frozen=True)
class Dist:
    n: int
    mean: float
    min: float
    p1: float  # the low tail matters for Δp (the candidate much less sure of the reference's answer)
    p10: float
    median: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class MeanCI:
    n: int
    mean: float
    lo: float  # bootstrap 95% interval of the mean
    hi: float


@dataclass(frozen=True)
class Flips:
    n_gold: int  # paired questions that have a gold answer
    ref_right_cand_wrong: int
    ref_wrong_cand_right: int
    both_right: int
    both_wrong: int


@dataclass(frozen=True)
class Excess:
    """How much further from the reference the candidate is than the noise floor, on one statistic, paired on the
    same questions: `diff` = candidate − floor (disagreement rate, or mean TV), positive = further away."""
    statistic: str  # disagreement | mean TV
    n: int
    candidate: float
    floor: float
    diff: float
    lo: float  # 95% interval of diff (score interval for paired proportions; paired bootstrap for TV)
    hi: float
    margin: float
    label: str  # INDISTINGUISHABLE | WITHIN_MARGIN | INCONCLUSIVE | WORSE
    n_needed: int | None = None  # inconclusive: about how many questions would decide, were the rates to hold
    b: int | None = None  # paired proportions: questions counting against the candidate only
    c: int | None = None  # and for it only
    tost: hy.Tost | None = None  # two one-sided tests against the margin (one-sided for accuracy)
    mdd: float | None = None  # the smallest difference these questions detect (α 0.05 two-sided, power 80%)
    no_interval: bool = False  # too few questions for an interval (one): inconclusive, and no count would be named


@dataclass(frozen=True)
class Verdict:
    label: str  # INDISTINGUISHABLE | WITHIN_MARGIN | INCONCLUSIVE | WORSE | NO_FLOOR
    reasons: tuple[str, ...]
    margins: Margins | None = None
    parts: tuple[Excess, ...] = ()
    n_needed: int | None = None  # inconclusive: the questions that would decide every undecided statistic
    no_interval: bool = False  # inconclusive because a statistic had too few questions for any interval

    @property
    def tost_p(self) -> float | None:
        """The TOST p-value of the whole verdict: equivalence is claimed only when every statistic is equivalent
        (intersection-union), so the largest of the parts' TOST p-values."""
        ps = [p.tost.p for p in self.parts if p.tost is not None and not math.isnan(p.tost.p)]
        return max(ps) if ps else None

    @property
    def n_with_floor(self) -> int | None:
        """The questions the statistics against the noise floor were judged on: those the floor answered too, which
        can be fewer than the comparison's (a floor run with --limit); None without such a statistic."""
        ns = [p.n for p in self.parts if p.statistic != "accuracy loss"]
        return min(ns) if ns else None

    def short(self) -> str:
        """The verdict in a table cell."""
        if self.label == INCONCLUSIVE:
            return f"{INCONCLUSIVE} ({self.need_text()})"
        return self.label

    def need_text(self) -> str:
        """What would decide an inconclusive verdict."""
        return NO_INTERVAL_TEXT if self.no_interval else n_needed_text(self.n_needed)


@dataclass(frozen=True)
class PairedAccuracy:
    by_benchmark: pd.DataFrame  # benchmark, n, acc_ref, acc_cand, delta, lo, hi (fractions, not points)
    mean: MeanCI | None  # unweighted mean of the per-benchmark deltas; None without gold answers


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (sensible at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def _is_gold(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _probs_for(options: list[str], probs: list[float], want: list[str], where: str) -> list[float]:
    if options == want:
        return probs
    if sorted(options) != sorted(want):
        raise ParityError(
            f"{where}: the runs were asked different options ({want} vs {options}); the inputs are not identical, "
            "so the answers cannot be compared — run both variants on the same suite"
        )
    by_key = dict(zip(options, probs, strict=True))
    return [by_key[o] for o in want]


def pair(reference: pd.DataFrame, candidate: pd.DataFrame) -> pd.DataFrame:
    """One row per question both runs answered, with the per-question statistics.

    Columns: record_id, question, benchmark, modality, gold, top_ref, top_cand, agree, tv, kl, dp, ref_p_top,
    ref_margin, right_ref, right_cand (the last two None without gold). `modality` is the reference's (an answers
    frame without the column, from before schema 7, reads text).
    """
    cols = ["record_id", "question", "benchmark", "modality", "options", "probs", "top", "gold"]
    reference, candidate = (df if "modality" in df else df.assign(modality="text") for df in (reference, candidate))
    merged = reference[cols].merge(candidate[cols], on=["record_id", "question"], suffixes=("_r", "_c"))
    rows = []
    # Plain lists: iterating pandas' Arrow-backed columns row by row is several times slower.
    lists = [merged[c].tolist() for c in ("record_id", "question", "benchmark_r", "modality_r", "options_r",
                                          "probs_r", "top_r", "gold_r", "options_c", "probs_c", "top_c")]
    for rid, question, bench, modality, opts_r, probs_r, top_r, gold_r, opts_c, probs_c, top_c in zip(*lists,
                                                                                                       strict=True):
        opts = list(opts_r)
        p = [float(x) for x in probs_r]
        where = f"record {rid!r} question {question!r}"
        q = [float(x) for x in _probs_for(list(opts_c), list(probs_c), opts, where)]
        tv = 0.5 * sum(abs(a - b) for a, b in zip(p, q, strict=True))
        kl = sum(a * math.log(a / max(b, KL_FLOOR)) for a, b in zip(p, q, strict=True) if a > 0)
        i_top = opts.index(top_r)
        ordered = sorted(p, reverse=True)
        gold = gold_r if _is_gold(gold_r) else None
        rows.append({
            "record_id": rid, "question": question, "benchmark": bench, "modality": modality or "text", "gold": gold,
            "top_ref": top_r, "top_cand": top_c, "agree": top_r == top_c,
            "tv": tv, "kl": max(kl, 0.0), "dp": q[i_top] - p[i_top],
            "ref_p_top": p[i_top], "ref_margin": ordered[0] - (ordered[1] if len(ordered) > 1 else 0.0),
            "right_ref": None if gold is None else top_r == gold,
            "right_cand": None if gold is None else top_c == gold,
        })
    columns = ["record_id", "question", "benchmark", "modality", "gold", "top_ref", "top_cand", "agree", "tv", "kl", "dp",
               "ref_p_top", "ref_margin", "right_ref", "right_cand"]
    return pd.DataFrame(rows, columns=columns)


def agreement(paired: pd.DataFrame) -> Agreement:
    n = len(paired)
    k = int(paired["agree"].sum()) if n else 0
    lo, hi = wilson(k, n)
    return Agreement(k=k, n=n, rate=k / n if n else math.nan, lo=lo, hi=hi)


def distribution(values: pd.Series | np.ndarray | list[float]) -> Dist:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Dist(0, *[math.nan] * 8)
    p1, p10, p50, p90, p99 = (float(x) for x in np.percentile(v, [1, 10, 50, 90, 99]))
    return Dist(n=int(v.size), mean=float(v.mean()), min=float(v.min()), p1=p1, p10=p10, median=p50, p90=p90,
                p99=p99, max=float(v.max()))


def boot_means(v: np.ndarray, rng: np.random.Generator, n_boot: int = N_BOOT) -> np.ndarray:
    """Means of `n_boot` resamples (with replacement) of `v`.

    Few distinct values (right/wrong deltas): draw how often each value is picked, which is the same resampling
    without materialising it. Otherwise resample in chunks, so 150K questions never need a 2000 × 150K matrix.
    """
    values, counts = np.unique(v, return_counts=True)
    if values.size <= 16:
        picks = rng.multinomial(v.size, counts / v.size, size=n_boot)
        return picks @ values / v.size
    chunk = max(1, 4_000_000 // v.size)
    return np.concatenate([v[rng.integers(0, v.size, size=(min(chunk, n_boot - i), v.size), dtype=np.int32)].mean(axis=1)
                           for i in range(0, n_boot, chunk)])


def bootstrap_mean(values: pd.Series | np.ndarray | list[float], seed: int = 0, n_boot: int = N_BOOT) -> MeanCI:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return MeanCI(0, math.nan, math.nan, math.nan)
    means = boot_means(v, np.random.default_rng(seed), n_boot)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return MeanCI(n=int(v.size), mean=float(v.mean()), lo=float(lo), hi=float(hi))


def flips(paired: pd.DataFrame) -> Flips:
    g = paired[paired["gold"].notna()]
    ref, cand = g["right_ref"].astype(bool), g["right_cand"].astype(bool)
    return Flips(
        n_gold=len(g),
        ref_right_cand_wrong=int((ref & ~cand).sum()),
        ref_wrong_cand_right=int((~ref & cand).sum()),
        both_right=int((ref & cand).sum()),
        both_wrong=int((~ref & ~cand).sum()),
    )


def confidence_buckets(paired: pd.DataFrame, edges: tuple[float, ...] = MARGIN_EDGES) -> pd.DataFrame:
    """Agreement by the reference's margin p(top) − p(second): near-ties are where answers flip."""
    rows = []
    m = paired["ref_margin"].round(9)  # 0.7 − 0.3 is 0.39999999999999997: bucket it as the 0.4 it means
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        last = i == len(edges) - 2
        sel = paired[(m >= lo) & ((m <= hi) if last else (m < hi))]
        a = agreement(sel)
        rows.append({"margin": f"{lo:.2f}–{hi:.2f}", "lo_edge": lo, "hi_edge": hi, "n": a.n, "agree": a.k,
                     "rate": a.rate, "ci_lo": a.lo, "ci_hi": a.hi,
                     "mean_tv": float(sel["tv"].mean()) if a.n else math.nan})
    return pd.DataFrame(rows)


def accuracy_by_benchmark(answers: pd.DataFrame) -> pd.DataFrame:
    """Accuracy on the questions that have a gold answer: benchmark, n_gold, correct, accuracy."""
    g = answers[answers["gold"].notna()]
    if g.empty:
        return pd.DataFrame(columns=["benchmark", "n_gold", "correct", "accuracy"])
    right = (g["top"] == g["gold"]).astype(int)
    out = right.groupby(g["benchmark"].fillna("(none)")).agg(["size", "sum", "mean"]).reset_index()
    out.columns = ["benchmark", "n_gold", "correct", "accuracy"]
    return out


def paired_accuracy(paired: pd.DataFrame, seed: int = 0, n_boot: int = N_BOOT) -> PairedAccuracy:
    """Candidate minus reference accuracy on identical questions, per benchmark and as their unweighted mean.

    The bootstrap resamples questions within each benchmark (stratified, paired: a question keeps both runs'
    answers), so the mean's interval carries every benchmark's sampling noise.
    """
    g = paired[paired["gold"].notna()]
    columns = ["benchmark", "n", "acc_ref", "acc_cand", "delta", "lo", "hi"]
    if g.empty:
        return PairedAccuracy(pd.DataFrame(columns=columns), None)
    rng = np.random.default_rng(seed)
    rows, boots = [], []
    for bench, grp in sorted(g.groupby(g["benchmark"].fillna("(none)")), key=lambda kv: str(kv[0])):
        d = grp["right_cand"].astype(float).to_numpy() - grp["right_ref"].astype(float).to_numpy()
        reps = boot_means(d, rng, n_boot)
        lo, hi = np.percentile(reps, [2.5, 97.5])
        rows.append({"benchmark": bench, "n": int(d.size), "acc_ref": float(grp["right_ref"].astype(float).mean()),
                     "acc_cand": float(grp["right_cand"].astype(float).mean()), "delta": float(d.mean()),
                     "lo": float(lo), "hi": float(hi)})
        boots.append(reps)
    by = pd.DataFrame(rows, columns=columns)
    mean_reps = np.vstack(boots).mean(axis=0)
    lo, hi = np.percentile(mean_reps, [2.5, 97.5])
    return PairedAccuracy(by, MeanCI(n=int(by["n"].sum()), mean=float(by["delta"].mean()), lo=float(lo), hi=float(hi)))


def paired_difference_ci(b: float, c: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Score interval (Tango 1998) for the difference of two paired proportions, (b − c) / n, where b questions
    count for the first only and c for the second only. Sensible at b = c = 0, where it reduces to the Wilson
    bound of 0/n, unlike the Wald interval or squaring-and-adding the two marginal Wilson intervals."""
    if n <= 0:
        return (math.nan, math.nan)
    est = (b - c) / n

    def score(theta: float) -> float:
        # The constrained MLE of the second-only share given the difference theta, then the score statistic.
        a2, b2, c2 = 2 * n, -b - c + (2 * n - b + c) * theta, -c * theta * (1 - theta)
        q = (-b2 + math.sqrt(max(b2 * b2 - 4 * a2 * c2, 0.0))) / (2 * a2)
        var = max(2 * q + theta - theta * theta, 1e-300)
        return (b - c - n * theta) / math.sqrt(n * var)

    def solve(lo: float, hi: float, target: float) -> float:  # score() decreases in theta
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if score(mid) > target else (lo, mid)
        return (lo + hi) / 2

    edge = 1 - 1e-12
    lower = -edge if score(-edge) <= z else solve(-edge, est, z)
    upper = edge if score(edge) >= -z else solve(est, edge, -z)
    return (lower, upper)


def _classify(lo: float, hi: float, margin: float) -> str:
    if lo > margin:
        return WORSE
    if hi <= margin:
        return INDISTINGUISHABLE if lo <= 0 else WITHIN_MARGIN
    return INCONCLUSIVE


MAX_N_NEEDED = 10_000_000


def _n_needed(n: int, interval_at, margin: float) -> int | None:
    """The fewest questions (≥ n) at which `interval_at(N)` — the interval were the observed rates to hold on N
    questions — no longer straddles the margin; None when no practical number would (the difference sits on it)."""
    decided = lambda m: _classify(*interval_at(m), margin) != INCONCLUSIVE  # noqa: E731
    hi = n
    while not decided(hi):
        if hi >= MAX_N_NEEDED:
            return None
        hi = min(hi * 2, MAX_N_NEEDED)
    lo = max(n, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid + 1, hi)
    return hi


NO_INTERVAL_TEXT = "one question gives no interval: a suite of more questions would tell"


def n_needed_text(n: int | None) -> str:
    if n is None:
        return "the difference sits on the margin: more questions would not settle it; choose the margin"
    return f"about {n:,} questions would tell"


def _excess_agreement(both: pd.DataFrame, margin: float) -> Excess:
    cand_off, floor_off = ~both["agree_c"].astype(bool), ~both["agree_f"].astype(bool)
    n = len(both)
    b, c = int((cand_off & ~floor_off).sum()), int((floor_off & ~cand_off).sum())
    lo, hi = paired_difference_ci(b, c, n)
    diff = (b - c) / n
    label = _classify(lo, hi, margin)
    need = None
    if label == INCONCLUSIVE:
        need = _n_needed(n, lambda m: paired_difference_ci(b * m / n, c * m / n, m), margin)
    return Excess("disagreement", n, float(cand_off.mean()), float(floor_off.mean()), diff, lo, hi, margin, label,
                  need, b, c, hy.tost_paired_proportions("disagreement", b, c, n, margin, one_sided=True),
                  hy.mdd_paired_proportions(n, c / n))


def _excess_tv(both: pd.DataFrame, margin: float, seed: int) -> Excess:
    """The mean of the per-question TV differences, with the wider of two 95% intervals: the paired bootstrap's
    percentiles and Student's t (n − 1 degrees of freedom). The bootstrap alone is too narrow on a few questions
    (one question's resamples are all that question: a zero-width interval decided the verdict); t is too narrow on
    skewed TVs of many. One question: no interval at all (NaN bounds; inconclusive)."""
    from scipy.stats import t as student

    d = both["tv_c"].to_numpy(dtype=float) - both["tv_f"].to_numpy(dtype=float)
    ci = bootstrap_mean(d, seed)  # paired: a resampled question keeps both its TVs
    n = ci.n
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    if n < 2:
        lo, hi = math.nan, math.nan  # _classify: neither side decided, inconclusive
    else:
        half = float(student.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        lo, hi = min(ci.lo, ci.mean - half), max(ci.hi, ci.mean + half)
    label = _classify(lo, hi, margin)
    need = None
    if label == INCONCLUSIVE and n > 1:
        need = _n_needed(n, lambda m: (ci.mean - (ci.mean - lo) * math.sqrt(n / m),
                                       ci.mean + (hi - ci.mean) * math.sqrt(n / m)), margin)
    return Excess("mean TV", n, float(both["tv_c"].mean()), float(both["tv_f"].mean()), ci.mean, lo, hi,
                  margin, label, need, tost=hy.tost_mean("mean TV", d, margin, one_sided=True),
                  mdd=hy.mdd_mean(sd, n), no_interval=n < 2)


def _excess_accuracy(paired: pd.DataFrame, relative: float) -> Excess | None:
    """Accuracy lost against BF16 (not against the floor: MLPerf's gate compares with the reference), as the one
    accuracy quantbench reports (ACCURACY_NAME: the mean over benchmarks), on the questions with a gold answer,
    against `relative` × BF16's. Its standard error is Agresti & Min's adjusted one for paired proportions (½ added
    to each cell of every benchmark's 2×2 table, so no discordance still leaves an interval), combined over the
    benchmarks as their mean is; the interval is ±1.96 of it, the one-sided test z = (loss − margin) / se.
    None without gold answers."""
    g = paired[paired["gold"].notna()] if "gold" in paired else paired.iloc[:0]
    if g.empty:
        return None
    strata, acc_ref, acc_cand = [], [], []
    for _, grp in g.groupby(g["benchmark"].fillna("(none)")):
        ref, cand = grp["right_ref"].astype(bool), grp["right_cand"].astype(bool)
        strata.append((int((ref & ~cand).sum()), int((~ref & cand).sum()), len(grp)))
        acc_ref.append(float(ref.mean()))
        acc_cand.append(float(cand.mean()))
    loss, se = hy.macro_paired_difference(strata)
    b, c, n = (sum(x[i] for x in strata) for i in range(3))  # lost / gained, for McNemar beside it
    margin = relative * float(np.mean(acc_ref))
    if margin <= 0:  # BF16 answered none right: no accuracy to keep 99% of
        return None
    lo, hi = loss - Z95 * se, loss + Z95 * se
    label = _classify(lo, hi, margin)
    need = None
    if label == INCONCLUSIVE:
        need = _n_needed(n, lambda m: (loss - Z95 * se * math.sqrt(n / m), loss + Z95 * se * math.sqrt(n / m)), margin)
    tost = hy.Tost("accuracy loss", loss, margin, None, hy.norm_cdf((loss - margin) / se), n)
    return Excess("accuracy loss", n, float(np.mean(acc_cand)), float(np.mean(acc_ref)), loss, lo, hi, margin, label,
                  need, b, c, tost, hy.mdd_from_se(se))


def _excess_txt(e: Excess) -> str:
    if e.statistic == "disagreement":
        head = (f"agreement {1 - e.candidate:.1%} vs the floor's {1 - e.floor:.1%}: {100 * e.diff:+.1f} points more "
                f"disagreement, 95% interval [{100 * e.lo:+.1f}, {100 * e.hi:+.1f}], margin {100 * e.margin:g} points")
    elif e.statistic == "accuracy loss":
        head = (f"{ACCURACY_NAME} {e.candidate:.1%} vs BF16's {e.floor:.1%}: {100 * e.diff:+.2f} points lost, 95% "
                f"interval [{100 * e.lo:+.2f}, {100 * e.hi:+.2f}] (Agresti–Min), margin {100 * e.margin:.2f} "
                "points")
    else:
        interval = "no interval" if e.no_interval else f"95% interval [{e.lo:+.4f}, {e.hi:+.4f}]"
        head = f"mean TV {e.candidate:.4f} vs the floor's {e.floor:.4f}: {e.diff:+.4f}, {interval}, margin {e.margin:g}"
    than = "BF16's accuracy" if e.statistic == "accuracy loss" else "the floor"
    why = {INDISTINGUISHABLE: f"within the margin and not detectably {'below' if than != 'the floor' else 'above'} {than}",
           WITHIN_MARGIN: f"detectably {'below' if than != 'the floor' else 'above'} {than}, but within the margin",
           WORSE: "wholly beyond the margin",
           INCONCLUSIVE: (NO_INTERVAL_TEXT if e.no_interval
                          else f"the interval straddles the margin; {n_needed_text(e.n_needed)}")}[e.label]
    return f"{head} (n = {e.n}) → {e.label}: {why}"


ORDER = (INDISTINGUISHABLE, WITHIN_MARGIN, INCONCLUSIVE, WORSE)


def parity_verdict(candidate: pd.DataFrame, floor: pd.DataFrame | None, margins: Margins | None = None,
                   seed: int = 0) -> Verdict:
    """The verdict on per-question data: `candidate` = pair(reference, candidate run), `floor` = pair(reference,
    noise-floor run). Questions both answered are paired; pass the rows of any subset (a benchmark, a modality)
    to judge that subset.

    For each statistic the named margin has — disagreement with the reference's top answer and mean TV, as the
    excess over the floor on the same questions; accuracy lost against the reference itself (MLPerf's gate, no
    floor needed) — the difference gets a 95% interval: wholly beyond the margin → worse; at or below it →
    indistinguishable when the interval also reaches 0, else different, within margin; straddling it →
    inconclusive, with how many questions would tell. The worst statistic decides. Each part also carries its
    one-sided test against the margin at α 0.05 (`Excess.tost`; `Verdict.tost_p` the largest) and the smallest
    difference its questions detect (`Excess.mdd`)."""
    margins = margins or Margins()
    parts: list[Excess] = []
    no_floor = None
    if margins.uses_floor:
        if floor is None or floor.empty:
            no_floor = ("no noise-floor run for this reference: make one with `quantbench run --noise-floor` (BF16 "
                        "under a second experts kernel)")
        else:
            keys = ["record_id", "question"]
            both = candidate[keys + ["agree", "tv"]].merge(floor[keys + ["agree", "tv"]], on=keys, suffixes=("_c", "_f"))
            if both.empty:
                no_floor = "the noise-floor run answered none of these questions: run it on the same suite"
            else:
                if margins.agreement is not None:
                    parts.append(_excess_agreement(both, margins.agreement))
                if margins.tv is not None:
                    parts.append(_excess_tv(both, margins.tv, seed))
    if margins.accuracy is not None:
        acc = _excess_accuracy(candidate, margins.accuracy)
        if acc is not None:
            parts.append(acc)
        elif not margins.uses_floor:
            return Verdict(NO_GOLD, ("no gold answers among these questions: an accuracy margin cannot be judged",),
                           margins)
    if no_floor is not None:
        return Verdict(NO_FLOOR, (no_floor,), margins)
    label = max((p.label for p in parts), key=ORDER.index)
    need, no_interval = None, False
    if label == INCONCLUSIVE:
        undecided = [p for p in parts if p.label == INCONCLUSIVE]
        no_interval = any(p.no_interval for p in undecided)
        needs = [p.n_needed for p in undecided]
        need = None if no_interval or None in needs else max(needs)
    return Verdict(label, tuple(_excess_txt(p) for p in parts), margins, tuple(parts), need, no_interval)


def verdicts_by(candidate: pd.DataFrame, floor: pd.DataFrame | None, column: str, margins: Margins | None = None,
                seed: int = 0) -> dict[str, Verdict]:
    """One verdict per value of `column` (benchmark; later a modality): the same rule on each subset."""
    return {str(key): parity_verdict(grp, floor, margins, seed)
            for key, grp in sorted(candidate.groupby(candidate[column].fillna("(none)")), key=lambda kv: str(kv[0]))}
