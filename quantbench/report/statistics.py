"""The tests behind each verdict, as text: one row per cell (a variant, or a variant on one modality) with the
exact McNemar p-values against BF16 and against the noise floor, the TOST verdict against the named margin, the
smallest detectable difference, the tails of TV and KL, and the flips split by BF16's own margin. The figures
come from quantbench.analysis.significance; `quantbench report`, `quantbench compare` and the dashboard share
these cells."""

from __future__ import annotations

from quantbench.analysis import hypothesis as hy
from quantbench.analysis import significance as sig
from quantbench.analysis.parity import Comparison
from quantbench.analysis.recommend import GpuReport

MCNEMAR_REF = "McNemar vs BF16 (gold: lost / gained)"
MCNEMAR_FLOOR = "McNemar vs noise floor (flips: extra / fewer)"
TOST = "Equivalence (TOST, α 0.05)"
MDD = "Smallest detectable"
TV_TAIL = "TV p50 / p90 / p99 / max"
KL_TAIL = "KL p50 / p90 / p99 / max"
FLIPS = "Flips: near-tie / middle / confident"


def tail_text(t: hy.Tail) -> str:
    if t.n == 0:
        return "—"
    return f"{t.p50:.4f} / {t.p90:.4f} / {t.p99:.4f} / {t.max:.4f}"


def _mcnemar(m: hy.McNemar | None) -> str:
    if m is None:
        return "—"
    p = m.p_holm if m.p_holm is not None else m.p
    return f"p {hy.fmt_p(p)} ({m.b} / {m.c})"


def _flips(f: sig.FlipClasses) -> str:
    return (f"{f.near_tie_flips}/{f.near_tie_n} / {f.middle_flips}/{f.middle_n} / "
            f"{f.confident_flips}/{f.confident_n}")


def cell_text(t: sig.CellTests, modality: str, n: int) -> dict[str, str]:
    """One cell as text, in column order."""
    judged = t.verdict.n_with_floor
    # The tests against the floor (McNemar, TOST, smallest detectable) ran on the questions the floor answered too:
    # an `n` of the comparison's alone put a 40-question test under a 300-question heading.
    n_text = str(n) if judged is None or judged >= n else f"{n} ({judged} with the noise floor)"
    return {
        "Modality": modality, "n": n_text,
        MCNEMAR_REF: _mcnemar(t.mcnemar_ref), MCNEMAR_FLOOR: _mcnemar(t.mcnemar_floor),
        TOST: t.tost_text(), MDD: t.mdd_text(), TV_TAIL: tail_text(t.tv), KL_TAIL: tail_text(t.kl), FLIPS: _flips(t.flips),
    }


def comparison_cells(c: Comparison) -> list[tuple[str, int, sig.CellTests]]:
    """(modality, questions, tests) of each cell a comparison shows: per modality when it has several."""
    if c.per_modality:
        return [(m.modality, m.agreement.n, m.tests) for m in c.modalities if m.tests is not None]
    if c.tests is None:
        return []
    modality = c.modalities[0].modality if c.modalities else "all"
    return [(modality, c.agreement.n, c.tests)]


def statistics_markdown(report: GpuReport) -> list[str]:
    """The statistics table under a GPU's which-quant table."""
    rows = [{"Variant": r.label, **cell_text(t, modality, n)}
            for r in report.rows if r.comparison is not None for modality, n, t in comparison_cells(r.comparison)]
    if not rows:
        return []
    margin = next((t.margins_name for r in report.rows if r.comparison is not None
                   for _, _, t in comparison_cells(r.comparison) if t.margins_name), None)
    header = list(rows[0])
    lines = [f"Statistics per cell (p-values exact and Holm-adjusted; equivalence against the margin `{margin}`):", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[h].replace("|", "\\|") for h in header) + " |" for row in rows]
    return lines + [""]


def statistics_notes(margins_text: str | None, n_cells: int) -> list[str]:
    """The footnotes that say what the statistics table's columns are."""
    return [
        f"Statistics: McNemar's exact test on the discordant questions, against BF16 on gold answers (lost = BF16 "
        f"right and the variant wrong, gained = the reverse) and against the noise floor on agreement with BF16 "
        f"(extra = the variant flips and the floor does not, fewer = the reverse). Equivalence is two one-sided "
        f"tests against the margin {margins_text or '(none)'} (`--margin card|mlperf99|mlperf99.9` or "
        "`--margin agreement=…,tv=…,accuracy=…`): equivalent when every statistic of the margin is shown within it "
        "at α 0.05. Only the harmful side is tested (the other one-sided test is not applied): a variant closer to "
        "BF16 than BF16's own second kernel, or more accurate than BF16, is not held against it. Smallest detectable: the difference a two-sided test at α 0.05 finds with "
        "80% power on these questions. TV and KL: per-question percentiles. Flips: questions whose top answer "
        f"differs from BF16's, by BF16's own margin between its top two options (near-tie < {sig.NEAR_TIE:g}, "
        f"confident ≥ {sig.CONFIDENT:g}), as flips / questions.",
        sig.holm_note(n_cells),
    ]
