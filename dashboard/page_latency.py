"""Latency: per-decision distributions of the report's runs on the selected GPU, percentiles, cold start, load."""

import pandas as pd
import streamlit as st

from dashboard import EMPTY, figures, store_cache, url_state
from quantbench.analysis import efficiency

st.title("Latency")
sel = url_state.selection()
db, mtime = store_cache.current()
reports = store_cache.reports_for(db, mtime, url_state.rules(), sel.since, price_per_gpu_hour=url_state.price())
mine = [rep for rep in reports if store_cache.report_key(rep) == sel.gpu and rep.model_id == sel.model]
rows = [row for rep in mine for row in rep.rows if row.ok]
suite_of = {row.run.run_id: rep.suite_id for rep in mine for row in rep.rows}
batched = sorted({str(rep.suite_id) for rep in mine if rep.throughput})  # suites with batched runs
if not rows and any(rep.batched_only for rep in mine):
    st.info(f"Only batched runs of {sel.model} on {sel.gpu_label}: each timed a whole pass of several decisions, "
            "never one decision. The report page shows their decisions per second; run at batch 1 for per-decision "
            "latency.", icon="📦")
    st.stop()
if not rows:
    st.info(f"No successful run of {sel.model} on {sel.gpu_label}: nothing was timed. See the Runs page.", icon="ℹ️")
    st.stop()

st.caption(f"{sel.model} on {sel.gpu_label}: the runs in the report (the latest successful run of each variant). "
           "Model time is the forward pass alone (CUDA events on a GPU, perf_counter on a CPU); tokenization is "
           "reported apart as prep."
           + (" Batched runs (several decisions a pass) are not here: the report page shows their decisions per "
              f"second (suite{'s' * (len(batched) > 1)} {', '.join(batched)})." if batched else ""))
# One report per suite: with several (e.g. 128-, 512- and 2048-token decisions) a variant appears once per suite
several = len({rep.suite_hash for rep in mine}) > 1
label = {r.run.run_id: f"{r.label} · {suite_of[r.run.run_id]}" if several else r.label for r in rows}
fmt = {r.run.run_id: str(r.run.weight_format) for r in rows}
lat = store_cache.latencies(db, mtime, tuple(label))
if lat.empty:
    st.info("These runs stored no per-decision timings.", icon="ℹ️")
    st.stop()
lat["variant"] = lat["run_id"].map(label)
lat["weight_format"] = lat["run_id"].map(fmt)

left, right = st.columns([3, 1])
phases = right.multiselect("Phase", sorted(lat["phase"].unique()), default=sorted(lat["phase"].unique()),
                           help="suite: the decisions whose answers are scored; latency: extra timed repeats")
kind = right.radio("Chart", ["box", "violin"], horizontal=True)
shown = lat[lat["phase"].isin(phases)]
left.plotly_chart(figures.latency_box(shown, list(label.values()), kind), width="stretch")

def watts(w: float | None) -> str:
    return "n/a" if w is None else f"{w:.0f}"  # as the energy column says it, not the grid's "None"


# Percentiles from the run's record (quantbench.store.records): the figures `quantbench report` prints.
table = pd.DataFrame([{
    "Variant": r.label,
    "Suite": suite_of[r.run.run_id],
    "Kernel": r.run.kernel_path,
    "n timed": r.run.n_timed,
    "p50 (ms)": r.run.p50_ms,
    "p90 (ms)": r.run.p90_ms,
    "p99 (ms)": r.run.p99_ms,
    "Energy per decision": efficiency.energy_text(r.efficiency),
    "Mean power (W)": watts(r.efficiency.mean_w),
    "Idle power (W)": watts(r.efficiency.idle_w),
    "Cold start (ms)": r.run.cold_ms,
    "Load (s)": r.run.load_s,
    "Weights": r.run.weights,
} for r in rows])
ms = st.column_config.NumberColumn(format="%.1f")
st.subheader("Percentiles, cold start and load time")
st.dataframe(table, hide_index=True, width="stretch", column_config={
    "p50 (ms)": ms, "p90 (ms)": ms, "p99 (ms)": ms,
    "Mean power (W)": st.column_config.TextColumn(help="GPU power over the timed phase (NVML)"),
    "Idle power (W)": st.column_config.TextColumn(help="over an idle second before it"),
    "Cold start (ms)": st.column_config.NumberColumn(format="%.1f", help="the first decision after the load"),
    "Load (s)": st.column_config.NumberColumn(format="%.2f", help="checkpoint to ready model, seconds"),
}, placeholder=EMPTY)
st.caption(" ".join(efficiency.energy_note(None, sel.family == "cpu")))
if (table["Weights"] == "synthetic").any():
    st.caption("Runs on synthetic (random) weights are timed like any other: their speed and memory are real, "
               "their answers are not.")
