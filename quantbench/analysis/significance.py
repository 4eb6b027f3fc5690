"""The tests behind one cell of a comparison (a variant, or a variant on one modality's questions): exact McNemar
against BF16 and against the noise floor, the verdict's TOST against its named margin, the smallest detectable
difference, the tail of TV and KL, and the flips split by BF16's own confidence. `holm_adjust` then corrects the
p-values across every cell of one report (or one `compare`), family by family.

A flip is a question whose top answer differs from BF16's. Split by BF16's margin between its top two options
(stored per answer, `answers.margin`): a near-tie (margin < NEAR_TIE) flips under any valid kernel (the noise
floor flips them too); a confident flip (margin ≥ CONFIDENT) is BF16 sure of an answer the variant gave up, the
event that says something is broken. ModelOpt's fidelity_check notes ~24% answer flips at < 1% accuracy change:
most of those are near-ties.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from quantbench.analysis import hypothesis as hy
from quantbench.analysis import stats as an

NEAR_TIE = 0.1  # BF16's p(top) − p(second) below this: a near-tie
CONFIDENT = 0.5  # at or above this: a confident answer


@dataclass(frozen=True)
class FlipClasses:
    """Questions and flips (top answer ≠ BF16's) by BF16's margin between its top two options."""

    n: int
    flips: int
    near_tie_n: int
    near_tie_flips: int
    middle_n: int
    middle_flips: int
    confident_n: int
    confident_flips: int

    def text(self) -> str:
        return (f"{self.flips} of {self.n}: near-tie {self.near_tie_flips} of {self.near_tie_n}, middle "
                f"{self.middle_flips} of {self.middle_n}, confident {self.confident_flips} of {self.confident_n}")


def flip_class(ref_margin: float) -> str:
    """near-tie | middle | confident, by BF16's margin (rounded to 9 places: 0.6 − 0.5 is 0.0999…, a 0.1)."""
    m = round(float(ref_margin), 9)
    return "near-tie" if m < NEAR_TIE else "confident" if m >= CONFIDENT else "middle"


def flip_classes(paired: pd.DataFrame) -> FlipClasses:
    if paired.empty:
        return FlipClasses(0, 0, 0, 0, 0, 0, 0, 0)
    cls = paired["ref_margin"].map(flip_class)
    flipped = ~paired["agree"].astype(bool)
    counts = {}
    for name in ("near-tie", "middle", "confident"):
        sel = cls == name
        counts[name] = (int(sel.sum()), int((sel & flipped).sum()))
    return FlipClasses(len(paired), int(flipped.sum()), *counts["near-tie"], *counts["middle"],
                       *counts["confident"])


def confident_flips(paired: pd.DataFrame) -> pd.DataFrame:
    """The questions BF16 answered with a margin ≥ CONFIDENT whose top answer the candidate changed, most
    confident first."""
    sel = paired[(~paired["agree"].astype(bool)) & (paired["ref_margin"].round(9) >= CONFIDENT)]
    return sel.sort_values("ref_margin", ascending=False)


@dataclass
class CellTests:
    """Every test of one cell. p-values are raw; the `*_holm` fields are set by `holm_adjust` (None until then)."""

    mcnemar_ref: hy.McNemar | None  # right/wrong on gold, candidate vs BF16 (None: no gold answers)
    mcnemar_floor: hy.McNemar | None  # disagreement with BF16, candidate vs the noise floor (None: no floor)
    verdict: an.Verdict
    tv: hy.Tail
    kl: hy.Tail
    flips: FlipClasses
    tost_p_holm: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def margins_name(self) -> str | None:
        return self.verdict.margins.name if self.verdict.margins else None

    @property
    def tost_p(self) -> float | None:
        return self.verdict.tost_p

    @property
    def equivalent(self) -> bool | None:
        """TOST at α = 0.05 on every statistic of the margin, Holm-adjusted when adjusted; None: not testable."""
        p = self.tost_p_holm if self.tost_p_holm is not None else self.tost_p
        return None if p is None else p < hy.ALPHA

    def tost_text(self) -> str:
        p = self.tost_p_holm if self.tost_p_holm is not None else self.tost_p
        if p is None:
            return "—"
        word = "equivalent" if p < hy.ALPHA else "not shown equivalent"
        return f"{word} (p {hy.fmt_p(p)}, margin {self.margins_name})"

    def mdd_text(self) -> str:
        """The smallest differences these questions detect, one per statistic of the verdict."""
        parts = []
        for e in self.verdict.parts:
            if e.mdd is None:
                parts.append(f"{e.statistic}: none detectable")
            elif e.statistic == "mean TV":
                parts.append(f"TV {e.mdd:.4f}")
            else:
                parts.append(f"{e.statistic} {100 * e.mdd:.1f} pts")
        return "; ".join(parts) or "—"

    def as_dict(self) -> dict[str, Any]:
        def mc(m: hy.McNemar | None) -> dict[str, Any] | None:
            return None if m is None else {"b": m.b, "c": m.c, "n": m.n, "p": m.p, "p_holm": m.p_holm}

        return {
            "mcnemar_vs_bf16": mc(self.mcnemar_ref), "mcnemar_vs_floor": mc(self.mcnemar_floor),
            "margin": self.margins_name, "tost_p": self.tost_p, "tost_p_holm": self.tost_p_holm,
            "equivalent": self.equivalent,
            "tost": [{"statistic": e.statistic, "margin": e.margin, "estimate": e.tost.estimate,
                      "p_lower": e.tost.p_lower, "p_upper": e.tost.p_upper, "p": e.tost.p, "mdd": e.mdd}
                     for e in self.verdict.parts if e.tost is not None],
            "tv_p50": self.tv.p50, "tv_p90": self.tv.p90, "tv_p99": self.tv.p99, "tv_max": self.tv.max,
            "kl_p50": self.kl.p50, "kl_p90": self.kl.p90, "kl_p99": self.kl.p99, "kl_max": self.kl.max,
            "flips": self.flips.flips, "flips_near_tie": self.flips.near_tie_flips,
            "near_tie_questions": self.flips.near_tie_n, "flips_middle": self.flips.middle_flips,
            "flips_confident": self.flips.confident_flips, "confident_questions": self.flips.confident_n,
        }


def cell_tests(paired: pd.DataFrame, verdict: an.Verdict) -> CellTests:
    """The tests of one cell from its per-question pairing with BF16 (stats.pair) and its verdict (whose
    disagreement part already counted the discordant questions against the noise floor)."""
    f = an.flips(paired)
    ref = hy.McNemar("vs BF16 on gold", f.ref_right_cand_wrong, f.ref_wrong_cand_right, f.n_gold,
                     hy.mcnemar_exact(f.ref_right_cand_wrong, f.ref_wrong_cand_right)) if f.n_gold else None
    dis = next((e for e in verdict.parts if e.statistic == "disagreement"), None)
    floor = None
    if dis is not None and dis.b is not None:
        floor = hy.McNemar("vs the noise floor", dis.b, dis.c, dis.n, hy.mcnemar_exact(dis.b, dis.c))
    return CellTests(ref, floor, verdict, hy.tail(paired["tv"]), hy.tail(paired["kl"]), flip_classes(paired))


def holm_adjust(cells: list[CellTests]) -> int:
    """Holm-adjust, across `cells`, each family of p-values on its own: McNemar vs BF16, McNemar vs the floor,
    and the TOST. Returns how many cells took part."""
    for tests in ([c.mcnemar_ref for c in cells], [c.mcnemar_floor for c in cells]):
        present = [t for t in tests if t is not None]
        for t, adj in zip(present, hy.holm([t.p for t in present]), strict=True):
            t.p_holm = adj
    tosts = [c for c in cells if c.tost_p is not None]
    for c, adj in zip(tosts, hy.holm([c.tost_p for c in tosts]), strict=True):
        c.tost_p_holm = adj
    return len(cells)


def holm_note(n_cells: int) -> str:
    return (f"p-values are Holm-adjusted across the {n_cells} cell{'s' if n_cells != 1 else ''} of this report "
            "(variant × modality × GPU), each family on its own (McNemar vs BF16, McNemar vs the noise floor, "
            "TOST): with this many tests, one would otherwise come out significant by chance.")


FLAT_COLUMNS = ("mcnemar_vs_bf16_p", "mcnemar_vs_bf16_p_holm", "mcnemar_vs_floor_p", "mcnemar_vs_floor_p_holm",
                "margin", "tost_p", "tost_p_holm", "equivalent", "tv_p50", "tv_p90", "tv_p99", "tv_max", "kl_p50",
                "kl_p90", "kl_p99", "kl_max", "flips_near_tie", "flips_middle", "flips_confident")


def flat_columns(t: CellTests | None) -> dict[str, Any]:
    """A cell's tests as flat csv / json columns (None where there are none)."""
    if t is None:
        return dict.fromkeys(FLAT_COLUMNS)
    d = t.as_dict()
    ref, floor = d["mcnemar_vs_bf16"] or {}, d["mcnemar_vs_floor"] or {}
    return {
        "mcnemar_vs_bf16_p": ref.get("p"), "mcnemar_vs_bf16_p_holm": ref.get("p_holm"),
        "mcnemar_vs_floor_p": floor.get("p"), "mcnemar_vs_floor_p_holm": floor.get("p_holm"),
        **{k: d[k] for k in FLAT_COLUMNS[4:16]},
        "flips_near_tie": t.flips.near_tie_flips, "flips_middle": t.flips.middle_flips,
        "flips_confident": t.flips.confident_flips,
    }
