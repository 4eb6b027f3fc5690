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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from quantbench.errors import QuantbenchError

Z95 = 1.959963984540054
KL_FLOOR = 1e-12
N_BOOT = 2000
# Mean-TV differences this small count as noise even against a floor that moved nothing: on a CPU, eager and
# grouped_mm experts can be bit-identical, and a float32 vs bfloat16 difference should not read as "worse".
TV_SLACK = 0.005
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
class Verdict:
    label: str  # indistinguishable | worse | no noise floor
    reasons: tuple[str, ...]


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

    Columns: record_id, question, benchmark, gold, top_ref, top_cand, agree, tv, kl, dp, ref_p_top, ref_margin,
    right_ref, right_cand (the last two None without gold).
    """
    cols = ["record_id", "question", "benchmark", "options", "probs", "top", "gold"]
    merged = reference[cols].merge(candidate[cols], on=["record_id", "question"], suffixes=("_r", "_c"))
    rows = []
    # Plain lists: iterating pandas' Arrow-backed columns row by row is several times slower.
    lists = [merged[c].tolist() for c in ("record_id", "question", "benchmark_r", "options_r", "probs_r", "top_r",
                                          "gold_r", "options_c", "probs_c", "top_c")]
    for rid, question, bench, opts_r, probs_r, top_r, gold_r, opts_c, probs_c, top_c in zip(*lists, strict=True):
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
            "record_id": rid, "question": question, "benchmark": bench, "gold": gold,
            "top_ref": top_r, "top_cand": top_c, "agree": top_r == top_c,
            "tv": tv, "kl": max(kl, 0.0), "dp": q[i_top] - p[i_top],
            "ref_p_top": p[i_top], "ref_margin": ordered[0] - (ordered[1] if len(ordered) > 1 else 0.0),
            "right_ref": None if gold is None else top_r == gold,
            "right_cand": None if gold is None else top_c == gold,
        })
    columns = ["record_id", "question", "benchmark", "gold", "top_ref", "top_cand", "agree", "tv", "kl", "dp",
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


def noise_floor_verdict(cand_agree: Agreement, cand_tv: MeanCI, floor_agree: Agreement | None,
                        floor_tv: MeanCI | None) -> Verdict:
    """`worse` when the candidate's interval lies wholly on the bad side of the floor's — lower agreement, or
    higher mean TV by more than TV_SLACK (a variant can keep every top answer yet flatten its probabilities) —
    else `indistinguishable`."""
    if floor_agree is None or floor_tv is None or floor_agree.n == 0:
        return Verdict("no noise floor", ("no noise-floor run for this reference: make one with "
                                          "`quantbench run --noise-floor` (BF16 under a second experts kernel)",))
    reasons = []
    agree_txt = (f"agreement {cand_agree.rate:.1%} [{cand_agree.lo:.1%}, {cand_agree.hi:.1%}] vs floor "
                 f"{floor_agree.rate:.1%} [{floor_agree.lo:.1%}, {floor_agree.hi:.1%}]")
    tv_txt = (f"mean TV {cand_tv.mean:.4f} [{cand_tv.lo:.4f}, {cand_tv.hi:.4f}] vs floor "
              f"{floor_tv.mean:.4f} [{floor_tv.lo:.4f}, {floor_tv.hi:.4f}]")
    worse_agree = cand_agree.hi < floor_agree.lo
    worse_tv = cand_tv.lo > floor_tv.hi + TV_SLACK
    if worse_agree:
        reasons.append(agree_txt + ": below the floor, intervals do not overlap")
    if worse_tv:
        reasons.append(tv_txt + f": above the floor by more than {TV_SLACK} (intervals apart)")
    if reasons:
        return Verdict("worse", tuple(reasons))
    return Verdict("indistinguishable", (agree_txt + ": overlaps or above",
                                         tv_txt + f": overlaps, below, or within {TV_SLACK} of it"))
