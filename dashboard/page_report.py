"""Which quant should I use? The report table for the selected GPU and model, its chart, and every GPU's pick."""

from collections import Counter

import streamlit as st

from dashboard import EMPTY, figures, report_table, store_cache, url_state
from quantbench.analysis import efficiency
from quantbench.report import (
    FIXTURE_PREFIX,
    SYNTHETIC_NOTE,
    GpuReport,
    cells,
    flat_rows,
    gpu_matrices,
    render,
)

st.title("Which quant should I use?")
sel = url_state.selection()
db, mtime = store_cache.current()
runs = store_cache.runs_since(store_cache.runs(db, mtime), sel.since)

if not (runs["status"] == "ok").any():
    st.warning("Every run in this store failed, so there is nothing to compare yet. The reasons are below (and on "
               "the Runs page); fix them and run again.", icon="⚠️")
    failed = runs[["created_at", "gpu_label", "backend", "variant", "failure", "error"]].copy()
    failed["error"] = failed["error"].fillna("").str.split("\n").str[0]
    st.dataframe(failed, hide_index=True, width="stretch", placeholder=EMPTY)
    st.stop()

rules = url_state.rule_inputs(cpu=sel.family == "cpu")
price = url_state.price_input()
url_state.start("history", False, lambda raw: raw.lower() in ("1", "true", "yes"))
history = st.toggle("History: every kernel generation", key="history",
                    help="off: the newest run of each variant (what `quantbench report` prints); on: the newest run "
                         "of every kernel generation and every build of the embedded model (`quantbench report --all`)")
url_state.publish("history", to_url=lambda v: "1" if v else "0", default=False)
reports = store_cache.reports_for(db, mtime, rules, sel.since, history=history, price_per_gpu_hour=price)
mine = [r for r in reports if store_cache.report_key(r) == sel.gpu and r.model_id == sel.model]
# A variant made elsewhere (its own model id in the sidebar) sits in its BF16 base's table (quantbench.models.lineage).
bases = sorted({r.model_id for r in reports if store_cache.report_key(r) == sel.gpu
                for row in r.rows if row.run.own_model_id == sel.model})
if not mine and bases:
    st.info(f"{sel.model} is a variant of {', '.join(bases)}: it is compared with that model's BF16 run, in its "
            "table below (the note under the table says how the two were paired).", icon="🔗")
    mine = [r for r in reports if store_cache.report_key(r) == sel.gpu and r.model_id in bases]
if not mine:
    if not history and sel.model.startswith(FIXTURE_PREFIX):
        st.info(f"{sel.model} is an older build of the embedded model, superseded on {sel.gpu_label} by a newer "
                "one: switch on History to see its runs.", icon="ℹ️")
    else:
        st.info(f"No report for {sel.model} on {sel.gpu_label}: its only runs are noise-floor runs. Run the variants "
                "(`quantbench run --backend ...`) on this machine.", icon="ℹ️")


def is_synthetic(rep: GpuReport) -> bool:
    return any(r.quality == SYNTHETIC_NOTE for r in rep.rows)


def throughput_table(rep: GpuReport) -> None:
    """Batched runs: decisions/s, one row per variant and batch size (beside the per-decision table, or alone)."""
    st.caption("Throughput: decisions per second with several decisions in one forward pass"
               + ("." if rep.batched_only else " (the table above is one decision at a time)."))
    st.dataframe([{"Variant": t["variant"], "Decisions per pass": t["batch"], "Decisions/s": t["decisions_per_s"],
                   "Mean ms per pass": t["ms_per_pass"],
                   "Energy per decision": efficiency.energy_text(t["efficiency"]),
                   **({"Cost per 1M decisions": efficiency.cost_text(t["efficiency"])} if price else {}),
                   "Run": t["run_id"][:13]}
                  for t in rep.throughput], hide_index=True, width="stretch",
                 column_config={"Decisions/s": st.column_config.NumberColumn(format="%.1f"),
                                "Mean ms per pass": st.column_config.NumberColumn(format="%.1f")},
                 key=f"throughput-{store_cache.report_key(rep)}-{rep.suite_hash}", placeholder=EMPTY)


def batched_only(rep: GpuReport) -> None:
    """A group of batched runs alone: why there is no per-decision table, and its throughput."""
    st.info(f"**No per-decision table:** {rep.no_table_note}.", icon="📦")
    throughput_table(rep)
    for note in rep.notes:
        st.caption(note)
    with st.expander("This table as markdown (what `quantbench report` prints, for a model card)"):
        st.code(render([rep], "markdown", rules), language="markdown")


suite_ids = Counter((r.model_id, r.suite_id) for r in mine)  # one id twice: the suite was edited between runs (a new hash)
for rep in mine:
    # several suites of one model on one GPU: headings that differ only in the caption below them read as repeats
    suite = "" if len(mine) == 1 else f" · suite {rep.suite_id}" + (
        f" (hash {rep.suite_hash})" if suite_ids[(rep.model_id, rep.suite_id)] > 1 else "")
    st.subheader(f"{rep.model_id} on {rep.gpu}{suite}")
    st.caption(f"Suite {rep.suite_id} (hash {rep.suite_hash})")
    if rep.batched_only:
        batched_only(rep)
        continue
    if is_synthetic(rep):
        st.info("Synthetic (random) weights: these runs measure **speed and memory only** — their answers say "
                "nothing about quality, so no agreement and no recommendation are shown for them.", icon="🎲")
    if rep.recommended is not None:
        why = rep.rule.removeprefix(f"{rep.recommended.label}: ")
        st.success(f"**⭐ Recommended: {rep.recommended.label}** — {why}")
    else:
        st.warning(rep.rule[:1].upper() + rep.rule[1:])
    busy = [r for r in rep.rows if r.busy]
    if busy:  # a latency measured while others used the machine is not what this machine gives idle
        st.warning("Measured on a busy machine: " + "; ".join(f"{r.label}: {r.busy}" for r in busy)
                   + ". Their latencies are slower than an idle machine's; run them again when it is quiet.", icon="⚠️")
    df = report_table.report_frame(rep, history)
    st.dataframe(report_table.styled(rep, df), hide_index=True, width="stretch", column_config=report_table.column_config(rep),
                 column_order=report_table.column_order(df), key=f"table-{store_cache.report_key(rep)}-{rep.suite_hash}", placeholder=EMPTY)
    if rep.throughput:  # batched runs: decisions/s beside the per-decision table, one row each
        throughput_table(rep)
    for note in rep.notes:
        st.caption(note)
    flat = flat_rows([rep])
    if any(r.comparison is not None for r in rep.rows):
        st.plotly_chart(figures.tradeoff(rep, flat, rules), width="stretch")
        if any(r.comparison.per_modality for r in rep.rows if r.comparison is not None):
            st.plotly_chart(figures.agreement_by_modality(rep), width="stretch")
            st.caption("Each modality's questions judged alone, by the same rule (the Parity detail page breaks every "
                       "figure down by modality and shows the media decisions where the variants disagree).")
    else:
        st.plotly_chart(figures.speed_memory(rep, flat), width="stretch")
    with st.expander("This table as markdown (what `quantbench report` prints, for a model card)"):
        st.code(render([rep], "markdown", rules), language="markdown")

shown = bases[0] if bases and not any(r.model_id == sel.model for r in reports) else sel.model
# A table of batched runs alone has no pick by construction: its note and throughput are above, not a card here.
everywhere = [r for r in reports if r.model_id == shown and not r.batched_only]
if not everywhere:
    st.stop()
st.subheader(f"{shown}: the recommendation on every GPU")
for matrix in gpu_matrices(everywhere):
    st.markdown(f"**Which quant on which GPU** (suite {matrix.suite_id}): p50 latency per decision · weights in "
                "memory · agreement with that GPU's BF16; ⭐ the pick on that GPU.")
    st.dataframe(report_table.matrix_frame(matrix), hide_index=True, width="stretch",
                 column_config=report_table.matrix_column_config(matrix),
                 key=f"matrix-{matrix.model_id}-{matrix.suite_id}", placeholder=EMPTY)
tables_on = Counter(r.gpu for r in everywhere)  # a GPU with several suites gets a card per suite, named by it
per_row = max(3, min(4, len(everywhere)))
for start in range(0, len(everywhere), per_row):
    for col, rep in zip(st.columns(per_row), everywhere[start:start + per_row], strict=False):
        box = col.container(border=True)
        here = " (selected)" if store_cache.report_key(rep) == sel.gpu else ""
        pick = rep.recommended
        if tables_on[rep.gpu] > 1:  # a caption, not the metric's label: a long label is cut to the card's width
            box.caption(f"Suite {rep.suite_id}")
        box.metric(rep.gpu + here, pick.label if pick else "none")
        if pick is not None:
            c = cells(pick, rep)
            mem = c.get("VRAM (weights)") or c.get("Weights (host memory)")
            box.caption(f"{mem} weights · p50 / p90 {c['Latency p50 / p90 (per decision)']} · "
                        f"{c['Energy per decision']} per decision · agrees {c['Agrees with BF16 (95% CI)']}")
        box.caption(rep.rule if pick is None else rep.rule.removeprefix(f"{pick.label}: "))
