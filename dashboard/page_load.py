"""Serving under load: the stored `quantbench load` runs, throughput against latency, where each saturated."""

import json

import pandas as pd
import streamlit as st

from dashboard import EMPTY, figures, store_cache
from quantbench.analysis.load import load_text, saturation, saturation_cell, saturation_sentence

RUN_HELP = "when it ran, the server's variant, the steps, its max_batch (where known) and model"

st.title("Serving under load")
db, mtime = store_cache.current()
runs = store_cache.load_runs(db, mtime)
if runs.empty:
    st.info("No load runs in this store yet: run `quantbench load --endpoint URL` against a SystemOne server "
            "(`quantbench serve`, or any other).", icon="ℹ️")
    st.stop()


def loads_of(run_steps: pd.DataFrame) -> list[float]:
    """Each step's load: its arrival rate (open loop), or else its clients."""
    return run_steps["rate"].where(run_steps["rate"].notna(), run_steps["concurrency"]).astype(float).tolist()


def steps_text(run_steps: pd.DataFrame, mode: str) -> str:
    """`1, 8, 32 clients` or `50, 100 requests/s offered`: the run's steps in order."""
    loads = loads_of(run_steps.sort_values("step"))
    if not loads:
        return "no steps"
    return ", ".join(f"{x:g}" for x in loads[:-1]) + (", " if len(loads) > 1 else "") + load_text(loads[-1], mode)


def labels_of(run: pd.Series, run_steps: pd.DataFrame) -> tuple[str, str]:
    """(label, legend name): what tells load runs apart first (when, variant, steps, the server's max_batch where
    the store reads it from its /healthz: a `server_max_batch` column), then the model; the label adds the kernel
    and GPU, which many runs share. A multiselect, the legend and the tables cut a name's end, not its start."""
    text = {k: run[k] for k in ("server_variant", "server_model", "server_kernel_path", "server_gpu")
            if isinstance(run.get(k), str)}
    max_batch = run.get("server_max_batch")
    if isinstance(max_batch, float) and max_batch.is_integer():
        max_batch = int(max_batch)
    first = [f"{run['created_at']:%Y-%m-%d %H:%M:%S}", text.get("server_variant", run["endpoint"]),
             steps_text(run_steps, run["mode"]),
             None if max_batch is None or pd.isna(max_batch) else f"max_batch {max_batch}", text.get("server_model")]
    rest = [text.get("server_kernel_path"), f"on {text['server_gpu']}" if "server_gpu" in text else None]
    legend = " · ".join(p for p in first if p)
    return " · ".join(p for p in first + rest if p), legend


all_steps = store_cache.load_steps(db, mtime, tuple(runs["load_id"].astype(str)))
by_run = {str(i): s for i, s in all_steps.groupby(all_steps["load_id"].astype(str), sort=False)}
named = [labels_of(r, by_run.get(str(r["load_id"]), all_steps.iloc[0:0])) for _, r in runs.iterrows()]
labels, legend = [n[0] for n in named], [n[1] for n in named]
for i in range(len(labels)):  # two runs in one second against one server: their ids tell them apart
    if labels[i] in labels[:i]:
        labels[i] += f" · {str(runs['load_id'].iloc[i])[-6:]}"
        legend[i] += f" · {str(runs['load_id'].iloc[i])[-6:]}"
runs = runs.assign(label=labels, legend=legend)

chosen = st.multiselect("Load runs", runs["label"].tolist(), default=runs["label"].tolist()[:3],
                        help="newest first; each is one `quantbench load` against one server: when it ran, the "
                             "server's variant, the steps (clients, or arrivals a second), its max_batch where known, "
                             "then its model, kernel path and GPU")
if not chosen:
    st.stop()
picked = runs[runs["label"].isin(chosen)]
ids = picked["load_id"].astype(str)
steps = all_steps[all_steps["load_id"].astype(str).isin(set(ids))]
names = dict(zip(runs["load_id"].astype(str), runs["label"], strict=True))
legends = dict(zip(runs["load_id"].astype(str), runs["legend"], strict=True))
steps = steps.assign(label=steps["load_id"].astype(str).map(names), legend=steps["load_id"].astype(str).map(legends))
left, right = st.columns([3, 1])
pct = right.radio("Latency", ["p99_ms", "p50_ms"], format_func=lambda c: c.removesuffix("_ms"), horizontal=True)
left.plotly_chart(figures.throughput_latency(steps, pct), width="stretch")


def number(value: object, pattern: str = "{:,.1f}") -> str:
    return EMPTY if value is None or pd.isna(value) else pattern.format(value)


st.subheader("Saturation")
rows, sentences = [], []
for load_id, run in steps.groupby(steps["load_id"].astype(str), sort=False):
    run = run.sort_values("step")
    mode = str(run["mode"].iloc[0])
    loads = loads_of(run)
    errors = [json.loads(e) if isinstance(e, str) else (e or {}) for e in run["errors"]]
    sat = saturation(loads, run["decisions_per_s"].tolist(), errors=errors, sent=run["sent"].tolist())
    last = run["decisions_per_s"].iloc[loads.index(max(loads))] if loads else None
    kept = sat.kept if sat.point is not None else (last / sat.peak if sat.steps > 1 and sat.peak else None)
    refused = ", ".join(f"{r.refused} of {r.sent} at {load_text(r.load, mode)}" for r in sat.refusals)
    rows.append({"Load run": legends[load_id], "Steps": steps_text(run, mode), "Peak decisions/s": number(sat.peak),
                 "Saturates at": saturation_cell(sat, mode),
                 "Largest load": EMPTY if sat.largest is None else load_text(sat.largest, mode),
                 "Kept at the largest load": number(kept, "{:.0%}"), "Refused (503 / 429)": refused or "none"})
    sentences.append(f"- **{legends[load_id]}**: {saturation_sentence(sat, mode)}.")
right_aligned = st.column_config.TextColumn(alignment="right")
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
    "Load run": st.column_config.TextColumn(width="medium", help=RUN_HELP),
    "Peak decisions/s": right_aligned,
    "Saturates at": st.column_config.TextColumn(help="clients (or arrivals a second) from which throughput stays "
                                                "within 5% of its peak, when a larger load was measured after it"),
    "Largest load": right_aligned,
    "Kept at the largest load": st.column_config.TextColumn(alignment="right", help="the largest load's "
                                                            f"throughput over the peak ({EMPTY}: one step only)"),
    "Refused (503 / 429)": st.column_config.TextColumn(help="requests the server refused under load: saturated, "
                                                       "or shedding load (a full queue, a request waiting too long)"),
}, placeholder=EMPTY)
st.markdown("\n".join(sentences))
st.caption("Saturation is the smallest load whose throughput is within 5% of the peak, when a larger load was "
           "measured after it (quantbench.analysis.load); one step cannot show it.")

st.subheader("Steps")
MS = ("p50_ms", "p99_ms", "queue_p50_ms", "queue_p99_ms", "model_p50_ms", "overhead_p50_ms", "error_p50_ms")
table = pd.DataFrame({
    "Load run": steps["legend"],
    "load": [load_text(x, m) for x, m in zip(loads_of(steps), steps["mode"], strict=True)],
    "sent": steps["sent"].astype(int),
    "decisions/s": [number(v) for v in steps["decisions_per_s"]],
    **{c: [number(v) for v in steps[c]] for c in MS[:6]},
    "mean_batch": [number(v, "{:.2f}") for v in steps["mean_batch"]],
    "client_cpu": [number(v, "{:.0%}") for v in steps["client_cpu"]],
    "errors": [", ".join(f"{n} × {k}" for k, n in json.loads(e).items()) or "none" for e in steps["errors"]],
    "error_p50_ms": [number(v) for v in steps["error_p50_ms"]],
})
st.dataframe(table, hide_index=True, width="stretch", column_config={
    "Load run": st.column_config.TextColumn(width="medium", help=RUN_HELP),
    "load": st.column_config.TextColumn("load", help="clients (closed loop) or arrivals a second (open loop)"),
    **{c: right_aligned for c in ("decisions/s", *MS, "mean_batch")},
    "client_cpu": st.column_config.TextColumn(alignment="right", help="the load generator's CPU time over the "
                                              "step's wall time: near 100%, it was the limit, not the server"),
}, placeholder=EMPTY)
st.caption(f"End to end on the load generator; queue, forward (model_ms) and batch as the server reported them "
           f"(quantbench's server does, others may not: {EMPTY}); overhead is end to end minus queue and forward.")
