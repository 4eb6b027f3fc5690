"""The tests behind a verdict on the parity page: exact McNemar against BF16 and against the noise floor, the TOST
verdict against its named margin, the smallest detectable difference, the tails of TV and KL, the flips by BF16's
own margin, and the confident flips with their questions (read from the answers' stored margins). The figures are
quantbench.analysis.significance's, the same `quantbench compare` prints."""

from __future__ import annotations

import streamlit as st

from dashboard import EMPTY, store_cache
from quantbench.analysis import hypothesis as hy
from quantbench.analysis import significance as sig
from quantbench.analysis.parity import Comparison
from quantbench.report.statistics import tail_text


def section(t: sig.CellTests | None, scope: str) -> None:
    """The tests of the headline's cell (every question, or one modality's)."""
    if t is None:
        return
    st.subheader("Tests" + (f" {scope}" if scope else ""))
    a, b, c = st.columns(3)
    ref, floor = t.mcnemar_ref, t.mcnemar_floor
    a.metric("McNemar vs BF16 (exact p)", hy.fmt_p(ref.p) if ref else "—",
             help=None if ref is None else f"on gold answers: {ref.b} lost (BF16 right, variant wrong), {ref.c} "
                                           f"gained, of {ref.n}; Holm-adjusted across the report: {hy.fmt_p(ref.p_holm)}")
    b.metric("McNemar vs noise floor (exact p)", hy.fmt_p(floor.p) if floor else "—",
             help=None if floor is None else f"flips from BF16: {floor.b} the variant's only, {floor.c} the floor's "
                                             f"only, of {floor.n}; Holm-adjusted: {hy.fmt_p(floor.p_holm)}")
    margins = t.verdict.margins
    c.metric(f"Equivalence (TOST), margin {t.margins_name}", "—" if t.equivalent is None else
             ("equivalent" if t.equivalent else "not shown"), help=(margins.describe() if margins else None))
    st.caption(f"TOST: {t.tost_text()}; smallest detectable difference (α 0.05, power 80%): {t.mdd_text()}. "
               f"TV per question p50 / p90 / p99 / max: {tail_text(t.tv)}; KL: {tail_text(t.kl)}.")
    f = t.flips
    st.caption(f"Flips by BF16's own margin between its top two options: near-tie (< {sig.NEAR_TIE:g}) "
               f"{f.near_tie_flips} of {f.near_tie_n}, middle {f.middle_flips} of {f.middle_n}, confident "
               f"(≥ {sig.CONFIDENT:g}) {f.confident_flips} of {f.confident_n}. A near-tie flips under any valid "
               "kernel; a confident flip is BF16 sure of an answer the variant gave up.")


def confident_flips(db: str, mtime, c: Comparison, modality: str | None) -> None:
    """Every question BF16 answered with a margin ≥ CONFIDENT that the variant flipped, with its question."""
    df = store_cache.confident_flips(db, mtime, c.reference.run_id, c.candidate.run_id)
    if modality:
        df = df[df["modality"] == modality]
    st.subheader("Confident flips")
    if df.empty:
        st.caption(f"No question BF16 answered with a margin ≥ {sig.CONFIDENT:g} changed its top answer"
                   + (f" among the {modality} questions" if modality else "") + ".")
        return
    st.caption(f"{len(df)} question(s) BF16 answered with a margin of at least {sig.CONFIDENT:g} between its top two "
               "options, whose top answer the variant changed (from the answers' stored margins), most confident "
               "first.")
    show = df.assign(
        BF16=[" ".join(f"{o} {p:.2f}" for o, p in zip(o_, p_, strict=True))
              for o_, p_ in zip(df["options_ref"], df["probs_ref"], strict=True)],
        variant=[" ".join(f"{o} {p:.2f}" for o, p in zip(o_, p_, strict=True))
                 for o_, p_ in zip(df["options_cand"], df["probs_cand"], strict=True)],
        gold=df["gold"].fillna("—"))
    st.dataframe(show[["record_id", "question", "benchmark", "modality", "gold", "top_ref", "top_cand", "ref_margin",
                       "BF16", "variant"]], hide_index=True, width="stretch", column_config={
        "record_id": st.column_config.TextColumn("Record", width=112),
        "question": st.column_config.TextColumn("Question", width=150),
        "top_ref": st.column_config.TextColumn("BF16", width=60),
        "top_cand": st.column_config.TextColumn("Variant", width=60),
        "ref_margin": st.column_config.NumberColumn("BF16 margin", format="%.3f", width=90),
        "BF16": st.column_config.TextColumn("BF16 distribution", width=200),
        "variant": st.column_config.TextColumn("Variant distribution", width=200)}, placeholder=EMPTY)
