"""The "Serving under load" page over several load runs: labels that tell the runs apart in their first words (when,
variant, steps, max_batch), tables without a "None" (a run that did not saturate, or had one step, says why), and
a legend that stays clear of the x axis title."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import figures
from quantbench.store import Store
from quantbench.store.load import LoadRunRecord, LoadStepRecord, load_steps, write_load
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
KERNEL = "quantbench grouped-moe gluon-wgmma-int4+gluon-wgmma-int4-scaled-mixed +fused rmsnorm+rope+qkv +cuda-graph"


def write(store: Store, minute: int, steps: list[tuple], max_batch: int = 16, mode: str = "closed") -> str:
    """A load run at 2026-12-04 01:`minute`: steps of (clients or rate, decisions/s, sent, 503s)."""
    at = dt.datetime(2026, 12, 4, 1, minute, 30, tzinfo=dt.UTC)
    run = LoadRunRecord(created_at=at, finished_at=at, endpoint="http://127.0.0.1:8123", mode=mode,
                        requests_from="quantbench-default-v1", n_distinct_requests=364,
                        server_model="synthetic-qwen3-30b-a3b-48l-seed0", server_variant="int4",
                        server_kernel_path=KERNEL, server_gpu="NVIDIA H200", host="vm",
                        server_health={"status": "ok", "max_batch": max_batch, "metrics": {"shed": {}}})
    rows = [LoadStepRecord(step=i, concurrency=None if mode == "open" else int(x),
                           rate=float(x) if mode == "open" else None, sent=sent, ok=sent - n503,
                           errors={"503": n503} if n503 else {}, duration_s=sent / t, offered_per_s=t,
                           decisions_per_s=t, p50_ms=10.0, p99_ms=20.0)
            for i, (x, t, sent, n503) in enumerate(steps)]
    return write_load(store, run, rows)


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    store = ds.build_only_load(tmp_path_factory.mktemp("dashloadlabels") / "results.duckdb")
    write(store, 10, [(128, 183.5, 600, 536)])  # one step, mostly refused: the QA run
    write(store, 20, [(1, 73.2, 367, 0), (8, 106.7, 536, 0), (32, 135.4, 705, 0)])  # still rising
    write(store, 30, [(32, 111.7, 680, 0), (64, 136.8, 866, 0)], max_batch=32)  # the same, but max_batch 32
    write(store, 40, [(20.0, 19.9, 200, 0), (80.0, 60.2, 600, 12)], mode="open")  # arrivals a second
    return store.path


def every_run(db: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("QUANTBENCH_DB", str(db))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("page_load.py").run()
    at.multiselect[0].set_value(at.multiselect[0].options).run()
    assert not at.exception, at.exception
    return at


def test_load_run_labels_start_with_what_tells_the_runs_apart(many, monkeypatch):
    """When, variant, steps and the server's max_batch (its /healthz, read by quantbench.store.load.load_runs)."""
    options = every_run(many, monkeypatch).multiselect[0].options
    assert len(options) == 5 and len({o[:40] for o in options}) == 5  # distinct within their first 40 characters
    assert options[0].startswith("2026-12-04 01:40:30 · int4 · 20, 80 requests/s offered · max_batch 16 · synthetic")
    assert options[1].startswith("2026-12-04 01:30:30 · int4 · 32, 64 clients · max_batch 32 · synthetic-qwen3")
    assert options[2].startswith("2026-12-04 01:20:30 · int4 · 1, 8, 32 clients · max_batch 16 · synthetic-qwen3")
    assert options[3].startswith("2026-12-04 01:10:30 · int4 · 128 clients · max_batch 16 · synthetic-qwen3-30b-a3b")
    assert options[3].endswith(f"{KERNEL} · on NVIDIA H200")  # the kernel and GPU, shared by many runs, last
    assert options[4].startswith("2026-12-02 12:00:00 · int4 · 1, 8, 32, 128 clients · synthetic · ")  # no /healthz


def test_the_tables_say_why_a_run_has_no_saturation_point_and_never_show_none(many, monkeypatch):
    at = every_run(many, monkeypatch)
    sat, steps = at.dataframe[0].value, at.dataframe[1].value
    for table in (sat, steps):
        assert not table.isna().any().any()
        assert not table.astype(str).isin(["None", "nan", "NaN", "<NA>"]).any().any()
    by_run = sat.set_index(sat["Load run"].str[:19])
    assert by_run.loc["2026-12-04 01:10:30", "Saturates at"] == "one step: cannot tell; refusing load at 128 clients"
    assert by_run.loc["2026-12-04 01:10:30", "Refused (503 / 429)"] == "536 of 600 at 128 clients"
    assert by_run.loc["2026-12-04 01:10:30", "Kept at the largest load"] == "—"  # one step: nothing to keep from
    assert by_run.loc["2026-12-04 01:20:30", "Saturates at"] == "not reached (throughput still rose)"
    assert by_run.loc["2026-12-04 01:20:30", "Largest load"] == "32 clients"
    assert by_run.loc["2026-12-04 01:40:30", "Largest load"] == "80 requests/s offered"
    assert by_run.loc["2026-12-02 12:00:00", "Saturates at"] == "32 clients"
    assert steps["load"].tolist()[:5] == ["1 client", "8 clients", "32 clients", "128 clients", "128 clients"]
    assert steps["load"].tolist()[-2:] == ["20 requests/s offered", "80 requests/s offered"]
    said = " ".join(m.value for m in at.markdown)
    assert ("one step only (128 clients, 183.5 decisions/s): one step cannot show where throughput stops rising; "
            "the server refused 536 of 600 requests at 128 clients (536 × 503): it was refusing load there") in said
    assert "peak 135.4 decisions/s at the last step (32 clients): throughput still rose" in said


def test_the_legend_sits_below_the_x_axis_title_in_room_made_for_it(many):
    steps = load_steps(Store(many)).assign(label=lambda d: d["load_id"].astype(str))
    steps["legend"] = "2026-12-04 01:10:30 · int4 · 128 clients · max_batch 16 · synthetic-qwen3-30b-a3b-48l-seed0"
    steps["legend"] += steps["label"].str[-4:]
    fig = figures.throughput_latency(steps)
    legend = fig.layout.legend
    # at the figure's foot, growing upwards into a bottom margin that holds it and the axis title (at y=-0.18 of
    # the plot, anchored at its bottom, more rows grew it over the title "decisions/s (answered)")
    assert (legend.yref, legend.y, legend.yanchor, legend.orientation) == ("container", 0, "bottom", "h")
    rows = len(fig.data)
    assert fig.layout.margin.b >= 70 + 22 * rows and fig.layout.height >= 400 + 22 * rows
    assert all("<br>" not in t.name for t in fig.data)  # one row a run: short names, not the whole label
    assert fig.layout.xaxis.title.text == "decisions/s (answered)"
