"""Constraints: your latency target at a concurrency, VRAM and energy budgets and quality margin; one pick per GPU
with its evidence, or which constraint no variant meets. The same answers as `quantbench recommend`
(quantbench.analysis.constraints)."""

from collections import Counter

import streamlit as st

from dashboard import EMPTY, store_cache, url_state
from quantbench.analysis.constraints import OBJECTIVES, PERCENTILES, Constraints
from quantbench.errors import QuantbenchError
from quantbench.report import GpuReport

st.title("Constraints")
st.caption("Which quant meets your constraints on each GPU? Latency is taken from load runs (`quantbench load`) of "
           "the same suite where they exist, else from batched or batch-1 runs, and each answer says which. The same "
           "answers as `quantbench recommend`.")
sel = url_state.selection()
db, mtime = store_cache.current()


MARGIN_PTS = (0.1, 50.0)  # the margin input's range: a link outside it keeps the default (not the nearest end)


def _margin(raw: str) -> float:
    v = url_state.positive(raw)
    if not MARGIN_PTS[0] <= v <= MARGIN_PTS[1]:
        raise ValueError(raw)
    return v


def _int(raw: str) -> int:
    v = int(raw)
    if v < 1:
        raise ValueError(raw)
    return v


for key in ("max_latency_ms", "max_vram_gib", "max_energy_j"):
    url_state.start(key, None, url_state.positive)
url_state.start("concurrency", 1, _int)
url_state.start("percentile", 50, lambda raw: int(raw) if int(raw) in PERCENTILES else 50)
url_state.start("margin_pts", 2.0, _margin)
url_state.start("c_objective", "memory", lambda raw: raw if raw in OBJECTIVES else "memory")

a, b, c = st.columns(3)
a.number_input("Latency target per decision (ms)", min_value=0.0, step=5.0, key="max_latency_ms",
               placeholder="no target", help="at the concurrency beside it; leave empty for none")
b.number_input("at this many clients", min_value=1, step=1, key="concurrency",
               help="requests in flight: load runs measure this; without one, batch-1 figures are a lower bound")
c.radio("Percentile", list(PERCENTILES), key="percentile", format_func=lambda p: f"p{p}", horizontal=True)
d, e, f = st.columns(3)
d.number_input(f"{'Memory' if sel.family == 'cpu' else 'VRAM'} budget (GiB)", min_value=0.0, step=1.0,
               key="max_vram_gib", placeholder="no budget", help="peak VRAM (peak host RSS on a CPU)")
e.number_input("Energy budget per decision (J)", min_value=0.0, step=1.0, key="max_energy_j",
               placeholder="no budget", help="GPU energy per decision (NVML); a CPU run has none, so it cannot meet one")
f.number_input("Quality margin per modality (points)", min_value=MARGIN_PTS[0], max_value=MARGIN_PTS[1], step=0.5, key="margin_pts",
               help="agreement with BF16 a variant may lose beyond the noise floor's, judged on each modality")
st.radio("Among those that qualify, pick", list(OBJECTIVES), key="c_objective", format_func=OBJECTIVES.get,
         horizontal=True)
for key in ("max_latency_ms", "max_vram_gib", "max_energy_j"):
    url_state.publish(key, lambda v: f"{v:g}", 0.0)
url_state.publish("concurrency", default=1)
url_state.publish("percentile", default=50)
url_state.publish("margin_pts", lambda v: f"{v:g}", 2.0)
url_state.publish("c_objective", default="memory")

try:
    constraints = Constraints(max_latency_ms=st.session_state["max_latency_ms"] or None,
                              concurrency=int(st.session_state["concurrency"]),
                              percentile=int(st.session_state["percentile"]),
                              max_vram_gib=st.session_state["max_vram_gib"] or None,
                              max_energy_j=st.session_state["max_energy_j"] or None,
                              margin=float(st.session_state["margin_pts"]) / 100,
                              min_agreement=url_state.rules().min_agreement,
                              objective=st.session_state["c_objective"])
except QuantbenchError as err:
    st.error(str(err))
    st.stop()

answers = [a for a in store_cache.constraint_answers(db, mtime, constraints, sel.since) if not a.synthetic]
st.markdown(f"**Constraints:** {constraints.describe(cpu=sel.family == 'cpu')}.")
if not answers:
    st.info("No table of trained weights to answer from: runs of synthetic (random) weights measure speed and memory "
            "only.", icon="ℹ️")
    st.stop()


def is_selected(rep: GpuReport) -> bool:
    """The sidebar's GPU and model: the model's own table, or its BF16 base's where it is a variant made elsewhere
    (quantbench.models.lineage pairs it into that table, as the report page shows it)."""
    runs = [row.run for row in rep.rows] + [t["run"] for t in rep.throughput]
    return store_cache.report_key(rep) == sel.gpu and (
        rep.model_id == sel.model or any(run.own_model_id == sel.model for run in runs))


def machine_and_model(rep: GpuReport) -> tuple[str, str]:
    return store_cache.report_key(rep), str(rep.model_id)


# several suites of one model on one GPU: headings that differ only in the caption below them read as repeats
suites_per_table = Counter(machine_and_model(a.report) for a in answers)
same_suite_id = Counter((*machine_and_model(a.report), a.report.suite_id) for a in answers)


def heading(rep: GpuReport) -> str:
    """`GPU · model`, with ` · suite ID` where that model has several suites on that GPU (and the suite's hash
    where two of them share an id: a suite edited since), and ` (selected)` for the sidebar's GPU and model."""
    suite = ""
    if suites_per_table[machine_and_model(rep)] > 1:
        suite = f" · suite {rep.suite_id}"
        if same_suite_id[(*machine_and_model(rep), rep.suite_id)] > 1:
            suite += f" (hash {rep.suite_hash})"
    return f"{rep.gpu} · {rep.model_id}{suite}" + (" (selected)" if is_selected(rep) else "")


# the sidebar's model first, then the other models on its GPU, then every other GPU (each in the report's order)
for ans in sorted(answers, key=lambda a: (not is_selected(a.report), store_cache.report_key(a.report) != sel.gpu)):
    rep = ans.report
    st.subheader(heading(rep))
    st.caption(f"Suite {rep.suite_id} (hash {rep.suite_hash})")
    if ans.pick is not None:
        st.success(f"**⭐ {ans.pick.label}** — {ans.verdict.removeprefix(f'{ans.pick.label}: ')}")
    else:
        st.warning(ans.verdict[:1].upper() + ans.verdict[1:])
    if not ans.candidates:  # a table of batched runs alone: the verdict says why there is nothing to judge
        continue
    st.dataframe([{
        "Variant": ("⭐ " if k is ans.pick else "") + k.label,
        "Meets every constraint": "yes" if k.passes else "no",
        "Fails": "; ".join(f"{n}: {w}" for n, w in k.failed.items()),
        f"Latency p{constraints.percentile} (ms)": k.latency.value,
        "Latency from": k.latency.text,
        "Peak memory (GiB)": k.peak_gib,
        "Energy (J / decision)": k.energy.value,
        "Quality": k.quality,
        "Source": k.row.run.source,
    } for k in ans.candidates], hide_index=True, width="stretch",
        column_config={f"Latency p{constraints.percentile} (ms)": st.column_config.NumberColumn(format="%.1f"),
                       "Peak memory (GiB)": st.column_config.NumberColumn(format="%.2f"),
                       "Energy (J / decision)": st.column_config.NumberColumn(format="%.2f"),
                       "Fails": st.column_config.TextColumn(width=320),
                       "Latency from": st.column_config.TextColumn(width=360)},
        key=f"constraints-{store_cache.report_key(rep)}-{rep.model_id}-{rep.suite_hash}", placeholder=EMPTY)
