"""Parity detail: one variant against its BF16 reference, from `quantbench.analysis.parity`'s comparison."""

import streamlit as st

from dashboard import EMPTY, figures, media_view, modality_view, store_cache, tests_view, url_state
from quantbench.report import SYNTHETIC_NOTE


def text_col(label: str, width: int, help: str | None = None):
    return st.column_config.TextColumn(label, width=width, help=help)


def dist(options: list, probs: list) -> str:
    return "  ".join(f"{o} {p:.2f}" for o, p in zip(options, probs, strict=True))


ALL = modality_view.ALL


def modality_filter(per_question) -> str:
    """The modality the page is cut to (kept in the link as `modality=`): all, or one the questions have. Drawn
    only when the suite carries media: a text-only suite has nothing to choose."""
    present = figures.modality_sorted(per_question["modality"]) if "modality" in per_question else ["text"]
    if present == ["text"]:
        return ALL
    return url_state.bound_select("Modality", "modality", [ALL, *present],
                                  {ALL: "all", **{m: m for m in present}},
                                  help="cut the flipped questions and the media viewer to one kind of decision; "
                                       "the table below breaks every figure down by modality", default=ALL)


st.title("Parity detail")
sel = url_state.selection()
db, mtime = store_cache.current()
reports = store_cache.reports_for(db, mtime, url_state.rules(), sel.since)
mine = [rep for rep in reports if store_cache.report_key(rep) == sel.gpu and rep.model_id == sel.model]
compared = [(rep, row) for rep in mine for row in rep.rows if row.comparison is not None]
if not compared:
    why = {row.quality for rep in mine for row in rep.rows if row.quality and row.quality != "reference"}
    why |= {f"suite {rep.suite_id}: {rep.no_table_note}" for rep in mine if rep.batched_only}
    if SYNTHETIC_NOTE in why:
        st.info("These runs use synthetic (random) weights: they measure speed and memory only, so there is no "
                "parity to show. See the Latency page.", icon="🎲")
    else:
        st.info(f"No variant of {sel.model} on {sel.gpu_label} could be compared with a BF16 reference"
                + (f" ({'; '.join(sorted(why))})" if why else "") + ".", icon="ℹ️")
    st.stop()

labels = [f"{row.label} — suite {rep.suite_id}" if len(mine) > 1 else row.label for rep, row in compared]
url_state.start("variant", labels[0])
if st.session_state["variant"] not in labels:
    st.session_state["variant"] = labels[0]
choice = st.selectbox("Variant", labels, key="variant")
url_state.publish("variant")
rep, row = compared[labels.index(choice)]
c = row.comparison
pq = c.per_question
modality = modality_filter(pq)

ref = c.reference
st.caption(f"{row.label} ({c.candidate.kernel_path}, run {c.candidate.run_id[:13]}) against BF16 "
           f"({ref.kernel_path}, run {ref.run_id[:13]}, {c.reference_how}), {c.agreement.n} "
           "identical questions.")
for note in c.notes:
    st.caption(f"Note: {note}")
h = modality_view.headline(c, modality)
if h.scope:
    st.caption(f"The figures below are {h.scope}.")
a, b, f, v = st.columns([1, 1, 1, 1.6])
a.metric("Agrees with BF16", f"{h.agreement.rate:.1%}", help=f"95% Wilson interval {h.agreement.lo:.1%}–"
         f"{h.agreement.hi:.1%} ({h.agreement.k}/{h.agreement.n})", delta_color="off")
b.metric("Mean TV", f"{h.tv_ci.mean:.4f}", help=f"95% bootstrap interval {h.tv_ci.lo:.4f}–{h.tv_ci.hi:.4f}")
fl = h.flips
f.metric("Flips on gold answers", f"{fl.ref_right_cand_wrong} / {fl.ref_wrong_cand_right}",
         help=f"BF16 right → variant wrong / the reverse, over {fl.n_gold} questions with a gold answer")
v.metric("Against the noise floor", h.verdict.label,
         help=f"margins: {h.verdict.margins.describe()}" if h.verdict.margins else None)
with st.expander("Why this verdict"):
    if h.verdict.label == "inconclusive":
        st.markdown(f"- Inconclusive: {h.verdict.need_text()}.")
    for reason in h.verdict.reasons:
        st.markdown(f"- {reason}")
    if c.floor is not None and h.floor_agreement is not None:
        fa = h.floor_agreement
        st.markdown(f"- Noise floor: BF16 under {c.floor.run.kernel_path} agrees with BF16 on "
                    f"{fa.rate:.1%} ({fa.lo:.1%}–{fa.hi:.1%}){' ' + h.scope if h.scope else ''}.")
tests_view.section(h.tests, h.scope)
if c.per_modality:
    modality_view.breakdown(c, modality)
tests_view.confident_flips(db, mtime, c, None if modality == ALL else modality)

st.subheader("Agreement by the reference's confidence")
left, right = st.columns([5, 4])
left.plotly_chart(figures.buckets(c.buckets), width="stretch")
bucket_table = c.buckets[["margin", "n", "agree", "rate", "ci_lo", "ci_hi", "mean_tv"]].copy()
bucket_table[["rate", "ci_lo", "ci_hi"]] *= 100
right.dataframe(bucket_table, hide_index=True,
                width="stretch", column_config={
                    "margin": text_col("BF16 margin", 95), "n": st.column_config.NumberColumn("n", width=45),
                    "agree": st.column_config.NumberColumn("Agree", width=55),
                    "rate": st.column_config.NumberColumn("Rate", format="%.1f%%", width=65),
                    "ci_lo": st.column_config.NumberColumn("CI low", format="%.1f%%", width=65),
                    "ci_hi": st.column_config.NumberColumn("CI high", format="%.1f%%", width=65),
                    "mean_tv": st.column_config.NumberColumn("Mean TV", format="%.4f", width=70)}, placeholder=EMPTY)

st.subheader("Flipped questions")
flipped = pq[~pq["agree"].astype(bool)]
if modality != ALL:
    flipped = flipped[flipped["modality"] == modality]
keys = ["record_id", "question"]
ans_ref = store_cache.answers(db, mtime, ref.run_id)[keys + ["options", "probs"]]
ans_cand = store_cache.answers(db, mtime, c.candidate.run_id)[keys + ["options", "probs"]]
flipped = flipped.merge(ans_ref, on=keys).merge(ans_cand, on=keys, suffixes=("_ref", "_cand"))


flipped["BF16 distribution"] = [dist(o, p) for o, p in zip(flipped["options_ref"], flipped["probs_ref"], strict=True)]
flipped["variant distribution"] = [dist(o, p) for o, p in
                                   zip(flipped["options_cand"], flipped["probs_cand"], strict=True)]
flipped["gold"] = flipped["gold"].fillna("—")
query = st.text_input("Search the flipped questions", placeholder="words in the question, record id or benchmark",
                      key="flip_search")
if query:
    q = query.lower()
    hay = (flipped["question"] + " " + flipped["record_id"] + " " + flipped["benchmark"].fillna("")).str.lower()
    flipped = flipped[hay.str.contains(q, regex=False)]
cut = [f"are {modality}"] if modality != ALL else []
cut += [f"match “{query}”"] if query else []
st.caption(f"{len(flipped)} of {int((~pq['agree'].astype(bool)).sum())} flipped questions"
           + (" " + " and ".join(cut) if cut else "") + f" ({c.agreement.n} compared).")
shown_cols = ["record_id", "benchmark", *(["modality"] if "modality" in flipped else []), "question", "gold",
              "top_ref", "top_cand", "BF16 distribution", "variant distribution", "ref_margin", "tv", "dp"]
st.dataframe(
    flipped[shown_cols],
    hide_index=True, width="stretch", column_config={
        "record_id": text_col("Record", 112), "benchmark": text_col("Benchmark", 90),
        "modality": text_col("Modality", 70),
        "question": text_col("Question", 175), "gold": text_col("Gold", 50), "top_ref": text_col("BF16", 50),
        "top_cand": text_col("Variant", 60),
        "BF16 distribution": text_col("BF16 distribution", 195, "each option's probability under BF16"),
        "variant distribution": text_col("Variant distribution", 195, "each option's probability under the variant"),
        "ref_margin": st.column_config.NumberColumn("BF16 margin", format="%.3f", width=88,
                                                    help="BF16's p(top) − p(second): small = a near-tie"),
        "tv": st.column_config.NumberColumn("TV", format="%.3f", width=60),
        "dp": st.column_config.NumberColumn("Δp", format="%+.3f", width=65,
                                            help="variant's p of BF16's answer minus BF16's"),
    }, placeholder=EMPTY)

st.subheader("Accuracy per benchmark, paired")
by = c.paired.by_benchmark
if by.empty:
    st.info("This suite has no gold answers: no accuracy figures.", icon="ℹ️")
else:
    m = c.paired.mean
    left, right = st.columns([5, 4])
    left.plotly_chart(figures.paired_deltas(by, (m.mean, m.lo, m.hi) if m else None), width="stretch")
    show = by.copy()
    for col in ("acc_ref", "acc_cand", "delta", "lo", "hi"):
        show[col] = 100 * show[col]
    pts = st.column_config.NumberColumn
    right.dataframe(show, hide_index=True, width="stretch", column_config={
        "benchmark": "Benchmark", "n": "n", "acc_ref": pts("BF16 %", format="%.1f"),
        "acc_cand": pts("Variant %", format="%.1f"), "delta": pts("Δ pts", format="%+.1f"),
        "lo": pts("95% CI low", format="%+.1f"), "hi": pts("95% CI high", format="%+.1f")}, placeholder=EMPTY)
    if m is not None:
        right.caption(f"Unweighted mean over benchmarks: {100 * m.mean:+.2f} points (95% CI {100 * m.lo:+.2f} to "
                      f"{100 * m.hi:+.2f}), {m.n} questions with gold answers.")

if "modality" in pq and set(pq["modality"]) != {"text"}:
    media_view.section(db, mtime, rep, modality)
