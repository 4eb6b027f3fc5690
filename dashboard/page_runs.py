"""Runs: every stored run with its provenance; failed runs with their reason."""

import streamlit as st

from dashboard import EMPTY, store_cache, url_state

st.title("Runs")
sel = url_state.selection()
runs = store_cache.runs_since(store_cache.runs(*store_cache.current()), sel.since)

only_here = st.toggle(f"Only {sel.model} on {sel.gpu_label}" if sel.model else f"Only runs on {sel.gpu_label}",
                      value=False)
# Without a model (every run on this machine failed before loading one), "here" is the machine's runs.
here = (runs["gpu_id"] == sel.gpu) & ((runs["model_id"] == sel.model) if sel.model else True)
shown = runs[here] if only_here else runs
shown = shown.sort_values("created_at", ascending=False)
n_failed = int((shown["status"] != "ok").sum())
st.caption(f"{len(shown)} run{'' if len(shown) == 1 else 's'}, {n_failed} failed. Newest first. Every row carries what it ran on and with, and "
           "where it came from (Source: your store, a pulled bundle, the results shipped with quantbench).")

# What a reader compares first (when, what ran, where, how it went, how fast, through which kernel), then why a
# run failed, then where it came from and what it ran with.
cols = {
    "created_at": "When", "model_id": "Model", "variant": "Variant", "gpu_label": "GPU / host", "status": "Status",
    "p50_ms": "p50 (ms)", "p99_ms": "p99 (ms)", "decisions_per_s": "decisions/s", "batch": "Batch",
    "kernel_path": "Kernel path", "role": "Role", "weights": "Weights", "backend": "Backend", "weight_format": "Format",
    "native": "Native", "n_timed": "Timed", "load_s": "Load (s)", "failure": "Failure", "error": "Error",
    "source": "Source", "gpu_cc": "CC", "driver_version": "Driver", "cuda_version": "CUDA", "torch_version": "torch",
    "transformers_version": "transformers", "auto_round_version": "auto-round", "modelopt_version": "modelopt",
    "quantbench_version": "quantbench", "quantbench_git_rev": "git rev", "suite_id": "Suite", "host": "Host",
    "cpu_model": "CPU", "cpu_cores": "CPUs", "machine_id": "Machine id", "load_avg_1m": "Load avg (timed)",
    "cpu_others_share": "Others' CPU (timed)", "cpu_steal_share": "Steal (timed)", "repeat_id": "Repeat group",
    "repeat_index": "Repeat #", "host_rss_peak_source": "Peak RSS read by", "run_id": "Run id",
}
table = shown.assign(error=shown["error"].fillna("").astype(str).str.strip().str.split("\n").str[0])
table = table[[c for c in cols if c in table.columns]].copy()
# A run stored without a role is a candidate (quantbench.analysis.recommend reads it so); a text left empty reads
# as a dash, not as the data grid's "None". No failure, no error: empty.
if "role" in table:
    table["role"] = table["role"].fillna("candidate")
table[["failure", "error"]] = table[["failure", "error"]].fillna("")
text = list(table.select_dtypes(include=["object", "string"]).columns)
table[text] = table[text].fillna("—")
ms = {"p50_ms": "p50 (ms)", "p99_ms": "p99 (ms)"}
st.dataframe(table, hide_index=True, width="stretch", height="content" if len(table) <= 30 else 700, column_config={
    **cols,
    "created_at": st.column_config.DatetimeColumn("When", format="YYYY-MM-DD HH:mm"),
    "model_id": st.column_config.TextColumn("Model", width=240),
    "gpu_label": st.column_config.TextColumn("GPU / host", width=200),
    **{c: st.column_config.NumberColumn(label, format="%.1f") for c, label in ms.items()},
    "decisions_per_s": st.column_config.NumberColumn("decisions/s", format="%.1f"),
    "kernel_path": st.column_config.TextColumn("Kernel path", width=300),
    "role": st.column_config.TextColumn("Role", help="candidate (a run stored without a role is one), reference "
                                        "(what the others are compared with) or noise_floor"),
    "load_s": st.column_config.NumberColumn("Load (s)", format="%.2f"),
    "cpu_others_share": st.column_config.NumberColumn("Others' CPU (timed)", format="percent",
                                                      help="CPU time other processes used while the run was timed"),
    "cpu_steal_share": st.column_config.NumberColumn("Steal (timed)", format="percent"),
    "error": st.column_config.TextColumn("Error", width=260, help="first line; the whole message is below"),
    "source": st.column_config.TextColumn("Source", width=260, help="the store the run is read from; for a pulled "
                                          "run, its bundle, who published it and when (the Sources page lists them)"),
}, column_order=list(table.columns), placeholder=EMPTY)
if (shown["weights"] == "synthetic").any():
    st.caption("Weights = synthetic: random weights in the real model's shape; such runs measure speed and memory "
               "only.")

failed = shown[shown["status"] != "ok"]
failed = failed.astype(object).where(failed.notna(), None)
if len(failed):
    st.subheader("Failed runs")
    for r in failed.itertuples():
        title = (f"{r.created_at:%Y-%m-%d %H:%M} · {r.gpu_label} · {r.variant or r.backend} "
                 f"({r.kernel_path or 'no kernel'}) · {r.failure or 'error'}")
        with st.expander(title, expanded=len(failed) <= 3):
            st.code(r.error or "(no error message stored)", language=None)
            st.caption(f"run {r.run_id}")
