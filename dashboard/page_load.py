"""Serving under load: the stored `quantbench load` runs, throughput against latency, where each saturated."""

import json

import pandas as pd
import streamlit as st

from dashboard import figures, store_cache
from quantbench.analysis.load import saturation

st.title("Serving under load")
db, mtime = store_cache.current()
runs = store_cache.load_runs(db, mtime)
if runs.empty:
    st.info("No load runs in this store yet: run `quantbench load --endpoint URL` against a SystemOne server "
            "(`quantbench serve`, or any other).", icon="ℹ️")
    st.stop()


def label(run: pd.Series) -> str:
    server = " ".join(str(x) for x in (run["server_variant"], run["server_kernel_path"]) if isinstance(x, str))
    where = run["server_gpu"] if isinstance(run["server_gpu"], str) else run["endpoint"]
    return f"{server or run['endpoint']} on {where} · {run['mode']} loop · {run['created_at']:%Y-%m-%d %H:%M}"


runs = runs.assign(label=[label(r) for _, r in runs.iterrows()])
chosen = st.multiselect("Load runs", runs["label"].tolist(), default=runs["label"].tolist()[:3],
                        help="newest first; each is one `quantbench load` against one server")
if not chosen:
    st.stop()
ids = runs.loc[runs["label"].isin(chosen), "load_id"].astype(str)
steps = store_cache.load_steps(db, mtime, tuple(ids))
steps = steps.assign(label=steps["load_id"].astype(str).map(dict(zip(runs["load_id"].astype(str), runs["label"],
                                                                     strict=True))))
left, right = st.columns([3, 1])
pct = right.radio("Latency", ["p99_ms", "p50_ms"], format_func=lambda c: c.removesuffix("_ms"), horizontal=True)
left.plotly_chart(figures.throughput_latency(steps, pct), width="stretch")

st.subheader("Saturation")
rows = []
for _, run in steps.groupby("load_id", sort=False):
    loads = run["rate"].where(run["rate"].notna(), run["concurrency"]).astype(float).tolist()
    sat = saturation(loads, run["decisions_per_s"].tolist())
    rows.append({"Load run": run["label"].iloc[0], "Peak decisions/s": sat.peak, "Saturates at": sat.point,
                 "Largest load": sat.beyond, "Kept at the largest load": sat.kept})
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
    "Peak decisions/s": st.column_config.NumberColumn(format="%.1f"),
    "Saturates at": st.column_config.NumberColumn(format="%g", help="clients (or arrivals a second) from which "
                                                  "throughput stays within 5% of its peak; empty: still rising"),
    "Kept at the largest load": st.column_config.NumberColumn(format="percent"),
})
st.caption("Saturation is the smallest load whose throughput is within 5% of the peak, when a larger load was "
           "measured after it (quantbench.analysis.load).")

st.subheader("Steps")
table = steps.assign(errors=[", ".join(f"{n} × {k}" for k, n in json.loads(e).items()) or "none"
                             for e in steps["errors"]])
cols = ["label", "concurrency", "rate", "sent", "decisions_per_s", "p50_ms", "p99_ms", "queue_p50_ms", "queue_p99_ms",
        "model_p50_ms", "overhead_p50_ms", "mean_batch", "client_cpu", "errors", "error_p50_ms"]
ms = st.column_config.NumberColumn(format="%.1f")
st.dataframe(table[cols], hide_index=True, width="stretch", column_config={
    "label": "Load run", "decisions_per_s": st.column_config.NumberColumn("decisions/s", format="%.1f"),
    "p50_ms": ms, "p99_ms": ms, "queue_p50_ms": ms, "queue_p99_ms": ms, "model_p50_ms": ms, "overhead_p50_ms": ms,
    "error_p50_ms": ms, "mean_batch": st.column_config.NumberColumn(format="%.2f"),
    "client_cpu": st.column_config.NumberColumn(format="percent", help="the load generator's CPU time over the "
                                                "step's wall time: near 100%, it was the limit, not the server"),
})
st.caption("End to end on the load generator; queue, forward (model_ms) and batch as the server reported them "
           "(quantbench's server does, others may not); overhead is end to end minus queue and forward.")
