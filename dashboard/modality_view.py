"""The parity page by modality (text / image / audio / video / mixed): the figures the headline shows for the
chosen modality, and the breakdown table and plot of every modality, from quantbench.analysis.parity's
per-modality comparison (the same rule and intervals as `quantbench compare` and `report`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from dashboard import EMPTY, figures
from quantbench.analysis import parity
from quantbench.analysis.significance import CellTests
from quantbench.analysis.stats import Agreement, Flips, MeanCI, Verdict

ALL = "all"


@dataclass(frozen=True)
class Figures:
    """What the headline shows: the whole comparison's figures, or one modality's."""

    scope: str  # "" for every question, else "on the 24 image questions"
    agreement: Agreement
    tv_ci: MeanCI
    flips: Flips
    verdict: Verdict
    floor_agreement: Agreement | None
    tests: CellTests | None = None  # McNemar, TOST, MDD, TV / KL tails, flips by BF16's margin


def headline(c: parity.Comparison, modality: str) -> Figures:
    if modality != ALL:
        m = next((m for m in c.modalities if m.modality == modality), None)
        if m is not None:
            return Figures(f"on the {m.agreement.n} {modality} questions", m.agreement, m.tv_ci, m.flips, m.verdict,
                           m.floor_agreement, m.tests)
    return Figures("", c.agreement, c.tv_ci, c.flips, c.verdict, c.floor.agreement if c.floor else None, c.tests)


def pct(v) -> str:
    return "—" if v is None or v != v else f"{100 * v:.1f}%"


def pts(v) -> str:
    return "—" if v is None or v != v else f"{100 * v:+.1f}"


def table(df: pd.DataFrame) -> pd.DataFrame:
    """by_modality's rows as the page shows them: intervals written beside their figure."""
    return pd.DataFrame({
        "Modality": df["modality"], "n": df["n"],
        "Agrees with BF16": [f"{pct(a)} ({pct(lo)}–{pct(hi)})" for a, lo, hi in
                             zip(df["agreement"], df["agreement_lo"], df["agreement_hi"], strict=True)],
        "Floor agrees": [pct(v) for v in df["floor_agreement"]],
        "Mean TV": [f"{t:.4f} ({lo:.4f}–{hi:.4f})" for t, lo, hi in
                    zip(df["tv_mean"], df["tv_lo"], df["tv_hi"], strict=True)],
        "Flips": [f"{a} / {b} of {g}" for a, b, g in
                  zip(df["flips_right_to_wrong"], df["flips_wrong_to_right"], df["n_gold"], strict=True)],
        "Δ accuracy (pts)": [f"{pts(d)} ({pts(lo)}…{pts(hi)})" if d == d and d is not None else "no gold"
                             for d, lo, hi in zip(df["delta_accuracy"], df["delta_accuracy_lo"],
                                                  df["delta_accuracy_hi"], strict=True)],
        "Verdict": df["verdict"],
    })


def breakdown(c: parity.Comparison, modality: str) -> None:
    """The per-modality section: the plot (colour = modality, as on every page) and the table, with the
    modalities on which the variant is worse named first."""
    df = parity.by_modality(c)
    st.subheader("By modality")
    worse = [m.modality for m in c.flagged()]
    if worse:
        st.error(f"Worse than BF16 beyond the margin on {', '.join(worse)} decisions"
                 + (f", while its overall verdict is {c.verdict.label}" if c.verdict.label != "worse" else "")
                 + ": a quant that breaks one modality hides among the others' questions.", icon="🚩")
    st.plotly_chart(figures.modality_breakdown(df), width="stretch")
    shown = table(df)
    st.dataframe(shown.style.apply(
        lambda col: [f"color: {figures.modality_colour(m)}; font-weight: 600" for m in df["modality"]],
        subset=["Modality"]), hide_index=True, width="stretch", column_config={
            "n": st.column_config.NumberColumn("n", width=45, help="questions of this modality both runs answered"),
            "Floor agrees": st.column_config.TextColumn(
                help="BF16 under the noise floor's kernel, on the same questions"),
            "Flips": st.column_config.TextColumn(help="BF16 right → variant wrong / the reverse, of the questions "
                                                      "with a gold answer"),
            "Verdict": st.column_config.TextColumn(help="the verdict rule on this modality's questions alone")}, placeholder=EMPTY)
    if modality != ALL:
        st.caption(f"The headline figures above are the {modality} questions'; choose all for every question.")
