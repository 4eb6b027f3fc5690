"""Hypothesis tests on paired answers: exact McNemar, two one-sided tests (TOST), Holm's correction, the smallest
detectable difference, and t intervals over repeated runs. Pure functions of counts and arrays, no I/O.

Conventions, so the numbers can be checked by hand:
- McNemar (exact, conditional): of the `b + c` discordant questions (b count for one side only, c for the
  other), under H0 each is a fair coin: p = min(1, 2 · P(X ≤ min(b, c))), X ~ Binomial(b + c, ½); 1 when b + c = 0.
  Textbook check: Bentur et al. (2009) as analysed by Fagerland, Lydersen & Laake (2013, BMC Med Res Methodol
  13:91), b = 1, c = 7: exact p 0.070, mid-p 0.039, asymptotic (χ² = 4.5) 0.034.
- TOST (Schuirmann 1987): equivalence within (−m, +m) is shown at level α when both one-sided nulls, Δ ≤ −m and
  Δ ≥ +m, are rejected at α; its p-value is the larger of the two one-sided p-values, and it rejects exactly when
  the (1 − 2α) interval lies inside the margins. Paired proportions use Tango's (1998) score statistic, the same
  one whose inversion is `stats.paired_difference_ci`; a mean (TV) uses the paired t statistic. A one-sided margin
  tests the harmful side only: the verdict's statistics are all of that kind (the excess over the noise floor,
  where a variant closer to BF16 than BF16's own second kernel is no fault, and accuracy lost against BF16, as
  MLPerf's "≥ 99% of the reference").
- Holm (1979): sort the m p-values, multiply the i-th smallest (from 0) by m − i, carry the running maximum, cap at 1.
- The smallest detectable difference (MDD): the true difference a two-sided test at α = 0.05 finds with 80% power
  on these n questions — for paired proportions by Connor's (1987) sample-size formula solved for the difference,
  at the observed rate of the other side's discordance; for a mean, (z₀.₉₇₅ + z₀.₈) · sd / √n.
- A t interval over k repeats: mean ± t(0.975, k − 1) · sd / √k, sd with k − 1 in the denominator; CV = sd / mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
POWER = 0.80


def _binom_cdf(k: int, n: int) -> float:
    from scipy.stats import binom  # lazy: scipy.stats costs a few hundred ms to import

    return float(binom.cdf(k, n, 0.5))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact (conditional binomial) McNemar p-value for b and c discordant pairs."""
    n = int(b) + int(c)
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * _binom_cdf(min(int(b), int(c)), n))


def mcnemar_mid_p(b: int, c: int) -> float:
    """The mid-p version (half the probability of the observed count left out): less conservative than exact."""
    from scipy.stats import binom

    n = int(b) + int(c)
    if n == 0:
        return 1.0
    k = min(int(b), int(c))
    return min(1.0, 2.0 * (_binom_cdf(k, n) - 0.5 * float(binom.pmf(k, n, 0.5))))


def mcnemar_asymptotic(b: int, c: int) -> float:
    """McNemar's χ² (1 df, no continuity correction): (b − c)² / (b + c)."""
    from scipy.stats import chi2

    n = int(b) + int(c)
    return 1.0 if n == 0 else float(chi2.sf((b - c) ** 2 / n, 1))


@dataclass
class McNemar:
    """One exact McNemar test: `b` questions count against the candidate, `c` for it; `p` two-sided exact."""

    what: str  # "vs BF16 on gold" | "vs the noise floor"
    b: int
    c: int
    n: int
    p: float
    p_holm: float | None = None  # Holm-adjusted across the cells of a report; None outside a report

    def text(self, adjusted: bool = True) -> str:
        p = self.p_holm if adjusted and self.p_holm is not None else self.p
        tail = " (Holm)" if adjusted and self.p_holm is not None else ""
        return f"p = {fmt_p(p)}{tail} ({self.b} against / {self.c} for, of {self.n})"


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "—"
    if p < 0.001:
        return "< 0.001"
    return f"{p:.3f}"


# -- TOST ------------------------------------------------------------------------------------------------------
def norm_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))



def macro_paired_difference(strata: list[tuple[int, int, int]]) -> tuple[float, float]:
    """(estimate, standard error) of the unweighted mean over strata of (b − c) / n, each stratum a benchmark's
    (b: first only, c: second only, n pairs). The estimate is the plain one; each stratum's variance is Agresti &
    Min's (2005) adjusted Wald one for paired proportions — ½ added to every cell of its 2×2 table (n + 2 pairs) —
    so a stratum without discordant pairs still carries its sampling uncertainty; the mean's variance is their sum
    over K²."""
    k = len(strata)
    est = sum((b - c) / n for b, c, n in strata) / k
    var = 0.0
    for b, c, n in strata:
        b2, c2, n2 = b + 0.5, c + 0.5, n + 2
        var += ((b2 + c2) / n2 - ((b2 - c2) / n2) ** 2) / n2
    return est, math.sqrt(var) / k


def mdd_from_se(se: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """(z_{1−α/2} + z_power) · se: the smallest difference a two-sided test with this standard error detects."""
    return (_z(1 - alpha / 2) + _z(power)) * se


def tango_score(b: float, c: float, n: float, theta: float) -> float:
    """Tango's score statistic for H0: (b − c) / n = theta (paired proportions; b first-only, c second-only)."""
    a2, b2, c2 = 2 * n, -b - c + (2 * n - b + c) * theta, -c * theta * (1 - theta)
    q = (-b2 + math.sqrt(max(b2 * b2 - 4 * a2 * c2, 0.0))) / (2 * a2)
    var = max(2 * q + theta - theta * theta, 1e-300)
    return (b - c - n * theta) / math.sqrt(n * var)


@dataclass(frozen=True)
class Tost:
    """Two one-sided tests of one statistic against its margin: `p_lower` tests H0 Δ ≤ −margin, `p_upper` H0
    Δ ≥ +margin (the harmful side: more disagreement, more TV, more accuracy lost); `p` the TOST p-value (the
    larger, or `p_upper` alone when one-sided)."""

    statistic: str
    estimate: float
    margin: float
    p_lower: float | None  # None: one-sided (non-inferiority)
    p_upper: float
    n: int

    @property
    def p(self) -> float:
        return self.p_upper if self.p_lower is None else max(self.p_lower, self.p_upper)


def tost_paired_proportions(statistic: str, b: int, c: int, n: int, margin: float,
                            one_sided: bool = False) -> Tost:
    """TOST for the difference (b − c) / n of paired proportions, by Tango's score statistic at ±margin."""
    if n <= 0:
        return Tost(statistic, math.nan, margin, None if one_sided else math.nan, math.nan, 0)
    m = min(margin, 1 - 1e-12)
    p_upper = norm_cdf(tango_score(b, c, n, m))  # small when (b − c) / n lies well below +m
    p_lower = None if one_sided else 1.0 - norm_cdf(tango_score(b, c, n, -m))
    return Tost(statistic, (b - c) / n, margin, p_lower, p_upper, int(n))


def tost_mean(statistic: str, diffs: np.ndarray | list[float], margin: float, one_sided: bool = False) -> Tost:
    """TOST for the mean of paired differences (the candidate's TV minus the floor's, per question): paired t."""
    from scipy.stats import t as student

    d = np.asarray(diffs, dtype=float)
    n = int(d.size)
    if n < 2:
        return Tost(statistic, float(d.mean()) if n else math.nan, margin, None if one_sided else math.nan,
                    math.nan, n)
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(n)
    if se == 0.0:  # every question the same difference: decided by where it lies
        p_up = 0.0 if mean < margin else 1.0
        p_lo = None if one_sided else (0.0 if mean > -margin else 1.0)
        return Tost(statistic, mean, margin, p_lo, p_up, n)
    p_upper = float(student.cdf((mean - margin) / se, n - 1))
    p_lower = None if one_sided else float(student.sf((mean + margin) / se, n - 1))
    return Tost(statistic, mean, margin, p_lower, p_upper, n)


# -- Holm --------------------------------------------------------------------------------------------------------
def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment, in the input order (NaN stays NaN and is not counted)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    m = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


# -- the smallest detectable difference ---------------------------------------------------------------------------
def _z(q: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(q))


def mdd_paired_proportions(n: int, other_rate: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The difference δ in paired proportions that a two-sided McNemar test at `alpha` detects with `power` on
    n pairs, when the other side's discordance rate is `other_rate` (so ψ = 2·other_rate + δ discordant):
    Connor (1987), n = (z_a·√ψ + z_b·√(ψ − δ²))² / δ², solved for δ by bisection. None when n < 1."""
    if n < 1:
        return None
    za, zb = _z(1 - alpha / 2), _z(power)
    p01 = max(0.0, float(other_rate))

    def needed(delta: float) -> float:
        psi = min(1.0, 2 * p01 + delta)
        return (za * math.sqrt(psi) + zb * math.sqrt(max(psi - delta * delta, 0.0))) ** 2 / (delta * delta)

    lo, hi = 1e-9, 1.0 - 2 * p01 if p01 < 0.5 else 1e-9
    if hi <= lo or needed(hi) > n:
        return None  # not even the largest possible difference is detectable here
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if needed(mid) > n else (lo, mid)
    return hi


def mdd_mean(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """(z_{1−α/2} + z_power) · sd / √n: the smallest mean difference a two-sided test finds with `power`."""
    if n < 2 or sd is None or math.isnan(sd):
        return None
    return (_z(1 - alpha / 2) + _z(power)) * sd / math.sqrt(n)


# -- repeats ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RepeatStat:
    """One figure over k repeated runs: mean, sample sd, CV and a 95% t interval."""

    n: int
    mean: float
    sd: float
    cv: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


def t_interval(values: list[float] | np.ndarray, level: float = 0.95) -> RepeatStat | None:
    """mean ± t(level, k − 1) · sd / √k over k ≥ 2 values (None below 2: one run has no spread)."""
    from scipy.stats import t as student

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    k = int(v.size)
    if k < 2:
        return None
    mean, sd = float(v.mean()), float(v.std(ddof=1))
    half = float(student.ppf(0.5 + level / 2, k - 1)) * sd / math.sqrt(k)
    return RepeatStat(k, mean, sd, sd / mean if mean else math.nan, mean - half, mean + half)


# -- percentiles ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tail:
    """The tail of a per-question divergence (TV or KL): median, p90, p99 and max (linear interpolation)."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float

    def text(self, digits: int = 4) -> str:
        f = f"{{:.{digits}f}}".format
        return f"p50 {f(self.p50)} · p90 {f(self.p90)} · p99 {f(self.p99)} · max {f(self.max)}"


def tail(values: np.ndarray | list[float]) -> Tail:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return Tail(0, math.nan, math.nan, math.nan, math.nan)
    p50, p90, p99 = (float(x) for x in np.percentile(v, [50, 90, 99]))
    return Tail(int(v.size), p50, p90, p99, float(v.max()))
