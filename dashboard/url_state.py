"""Filters bound to the URL, so a filtered view can be shared as a link.

A bound widget starts from what the user chose earlier in this session (kept in `_memo`: Streamlit forgets the
state of a widget that a page did not draw), else from the URL's query parameter, else from its default; after
it is drawn its value is written back to the URL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from quantbench.report import Rules

MEMO = "_memo"
ALWAYS = object()  # a default no value equals: the parameter stays in the URL


def _memo() -> dict[str, Any]:
    return st.session_state.setdefault(MEMO, {})


def value(key: str, default: Any, parse: Callable[[str], Any] = str) -> Any:
    """The current value of a bound setting, whether or not its widget is on this page."""
    if key in st.session_state:
        return st.session_state[key]
    if key in _memo():
        return _memo()[key]
    raw = st.query_params.get(key)
    if raw is None:
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError):
        return default


def start(key: str, default: Any, parse: Callable[[str], Any] = str) -> None:
    """Give widget `key` its starting value (call before drawing it)."""
    if key not in st.session_state:
        st.session_state[key] = value(key, default, parse)


def publish(key: str, to_url: Callable[[Any], str] = str, default: Any = ALWAYS) -> Any:
    """Remember the widget's value and put it in the URL (left out while it equals `default`)."""
    v = st.session_state[key]
    _memo()[key] = v
    if v is None or v == default:
        if key in st.query_params:
            del st.query_params[key]
    else:
        st.query_params[key] = to_url(v)
    return v


def _pick(want: str | None, options: list[str], labels: dict[str, str]) -> str | None:
    """The option the URL names: exactly, else by label, else the first one containing it (case-insensitive)."""
    if want is None:
        return None
    if want in options:
        return want
    w = want.strip().lower()
    for o in options:
        if w == labels.get(o, o).lower():
            return o
    return next((o for o in options if w in o.lower() or w in labels.get(o, o).lower()), None)


def bound_select(label: str, key: str, options: list[str], labels: dict[str, str] | None = None,
                 help: str | None = None, default: Any = ALWAYS, preferred: str | None = None) -> str:
    """A select box bound to the URL; with nothing chosen yet (session, link), `preferred` if offered, else the
    first option."""
    labels = labels or {}
    if key not in st.session_state:
        chosen = _memo().get(key)
        if chosen in options:
            st.session_state[key] = chosen
        else:
            raw = st.query_params.get(key)
            picked = _pick(raw, options, labels)
            st.session_state[key] = picked or (preferred if preferred in options else options[0])
            if raw is not None and picked is None:  # say so, rather than show another GPU's table as if asked
                _misses()[key] = (label, raw, labels.get(st.session_state[key], st.session_state[key]),
                                  st.session_state[key])
    elif st.session_state[key] not in options:  # a wider filter changed: this one's old value is gone
        st.session_state[key] = options[0]
    st.selectbox(label, options, key=key, format_func=lambda o: labels.get(o, o), help=help)
    return publish(key, default=default)


MISSES = "_link_misses"


def _misses() -> dict[str, tuple[str, str, str, str]]:
    return st.session_state.setdefault(MISSES, {})


def link_misses() -> list[str]:
    """What the link asked for that no choice matches (an unknown GPU or model, a day without runs), and what is
    shown instead: one line each, for as long as the replacement is still the one chosen."""
    out = []
    for key, (label, raw, shown, value) in list(_misses().items()):
        if st.session_state.get(key) != value:  # the user chose something else: the link is answered
            del _misses()[key]
            continue
        asked = " ".join(raw.replace("`", "'").split())  # a code span: a link cannot put markdown on the page
        asked = asked if len(asked) <= 80 else asked[:79] + "…"
        what = label if label.split()[0].isupper() else label[:1].lower() + label[1:]  # "GPU", "model"
        out.append(f"The link asks for {what} `{asked}`, which no run here matches: showing **{shown}** "
                   f"instead (choose in the sidebar).")
    return out


@dataclass(frozen=True)
class Selection:
    family: str
    gpu: str  # store_cache.machine_id: the GPU's name, or cpu:HOST
    gpu_label: str
    model: str | None  # None: every run on this machine failed before loading a model
    since: str | None = None  # only runs made on or after this day (YYYY-MM-DD); None: every run


ALL_RUNS = "all"


def since_input(runs: pd.DataFrame) -> str | None:
    """'Runs since' one of the days the store has runs from: leaves out runs of an older quantbench."""
    days = sorted({f"{t:%Y-%m-%d}" for t in pd.to_datetime(runs["created_at"]).dropna()}, reverse=True)
    day = bound_select("Runs since", "since", [ALL_RUNS, *days], {ALL_RUNS: "all runs"},
                       help="leave out runs made before this day (UTC), e.g. those of an older quantbench",
                       default=ALL_RUNS)
    return None if day == ALL_RUNS else day


FAMILY_ORDER = ["blackwell", "hopper", "ada", "ampere", "cpu"]


def sidebar(runs: pd.DataFrame, since: str | None = None, this_machine: str | None = None) -> Selection:
    """Family, GPU and model selectors, from the stored runs (already cut to `since`). With nothing chosen (no link,
    no earlier choice) they open on `this_machine`, its GPU (or cpu:HOST), when it has runs.

    A run that failed before loading a model (a missing checkpoint, a timeout, a killed child) has no model id: its
    machine is still offered, so its failures can be seen, but it adds no model to choose."""
    machines = runs[["family", "gpu_id", "gpu_label"]].astype(str).drop_duplicates()
    families = sorted(machines["family"].unique(), key=lambda f: (FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 99, f))
    gpu_labels = dict(zip(machines["gpu_id"], machines["gpu_label"], strict=False))
    # A shared link may name only the GPU: start its family from it.
    if "family" not in st.session_state and "family" not in _memo() and "family" not in st.query_params:
        gpu = _pick(st.query_params.get("gpu"), sorted(gpu_labels), gpu_labels)
        if gpu is None and "gpu" not in st.query_params and this_machine in gpu_labels:
            gpu = this_machine  # your own runs first
        if gpu is not None:
            st.session_state["family"] = machines.loc[machines["gpu_id"] == gpu, "family"].iloc[0]
    family = bound_select("GPU family", "family", families, {f: "CPU" if f == "cpu" else f.capitalize() for f in families})
    here = machines[machines["family"] == family]
    gpus = sorted(here["gpu_id"].unique())
    gpu = bound_select("GPU", "gpu", gpus, gpu_labels, help="the exact GPU (or CPU host) the runs were made on",
                       preferred=this_machine)
    # The model a person just ran comes first, trained weights before synthetic ones (those answer "which quant"
    # only for speed and memory); runs come oldest first.
    on_gpu = runs[(runs["family"].astype(str) == family) & (runs["gpu_id"].astype(str) == gpu)].iloc[::-1]
    on_gpu = on_gpu[on_gpu["model_id"].notna()]
    newest = list(dict.fromkeys(on_gpu["model_id"].astype(str)))
    synthetic = set(on_gpu.loc[on_gpu["weights"].astype(str) == "synthetic", "model_id"].astype(str))
    models = sorted(newest, key=lambda m: (m in synthetic, newest.index(m)))
    if not models:
        st.caption("Model: none (every run here failed before loading one)")
    model = bound_select("Model", "model", models) if models else None
    return Selection(family, gpu, gpu_labels[gpu], model, since)


def selection() -> Selection:
    return st.session_state["_selection"]


# -- the recommendation rules --------------------------------------------------------------------------------
DEFAULT_MIN_AGREE = 100 * Rules().min_agreement
OBJECTIVE_LABELS = {"memory": "smallest weights in memory", "latency": "lowest p50 latency"}


def _percent(raw: str) -> float:
    v = float(raw)
    if not 50.0 <= v <= 100.0:
        raise ValueError(raw)
    return v


def positive(raw: str) -> float:
    """A link's positive number (a budget, a price, a constraint), or ValueError: its `nan` / `inf` is none, as a
    typo is."""
    v = float(raw)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(raw)
    return v


def _objective(raw: str) -> str:
    if raw not in OBJECTIVE_LABELS:
        raise ValueError(raw)
    return raw


def rules() -> Rules:
    """The rules the user set on the report page (or the URL, or the defaults) — pages without the inputs too."""
    budget = value("budget", None, positive)
    return Rules(min_agreement=value("min_agree", DEFAULT_MIN_AGREE, _percent) / 100,
                 vram_budget_gib=budget or None,  # 0 (the input cleared to zero) means no budget
                 objective=value("objective", "memory", _objective))


def price() -> float | None:
    """The price per GPU hour (USD) the user set on the report page (or the URL); None: no cost shown."""
    return value("price", None, positive) or None  # 0 (the input cleared to zero) means no price


def price_input() -> float | None:
    """`--price-per-gpu-hour`: turns time into cost per 1M decisions in the tables."""
    start("price", None, positive)
    st.number_input("Price per GPU hour (USD)", min_value=0.0, step=0.5, key="price", placeholder="no price",
                    help="adds cost per 1M decisions: from the mean model time per decision at batch 1, or "
                         "decisions/s in the throughput table; leave empty for none")
    publish("price", lambda v: f"{v:g}", 0.0)
    return price()


def rule_inputs(cpu: bool) -> Rules:
    start("min_agree", DEFAULT_MIN_AGREE, _percent)
    start("budget", None, positive)
    start("objective", "memory", _objective)
    a, b, c = st.columns(3)
    a.slider("Minimum agreement with BF16 (%)", 50.0, 100.0, step=0.5, key="min_agree",
             help="a variant whose top answer matches BF16's less often than this does not pass")
    b.number_input(f"{'Memory' if cpu else 'VRAM'} budget (GiB)", min_value=0.0, step=1.0, key="budget",
                   placeholder="no budget", help="peak memory must fit; leave empty for no budget")
    c.radio("Pick", list(OBJECTIVE_LABELS), key="objective", format_func=OBJECTIVE_LABELS.get, horizontal=True,
            help="among the variants that pass")
    publish("min_agree", lambda v: f"{v:g}", DEFAULT_MIN_AGREE)
    publish("budget", lambda v: f"{v:g}", 0.0)
    publish("objective", default="memory")
    return rules()
