"""The Runs page's table: what a reader compares first (when, model, variant, GPU, status, latency and throughput,
kernel) before why a run failed and where it came from; a run stored without a role reads as a candidate, and no
text cell reads "None"."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from quantbench.run.record import RunResult
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
FIRST = ["created_at", "model_id", "variant", "gpu_label", "status", "p50_ms", "p99_ms", "decisions_per_s", "batch",
         "kernel_path"]


def test_the_runs_table_leads_with_what_ran_where_and_how_fast_and_names_a_missing_role(tmp_path, monkeypatch):
    store = ds.build(tmp_path / "results.duckdb")
    no_role = store.write_run(RunResult(
        run=ds.run_row(ds.H200, 500, backend="int4", variant="int4", kernel_path="grouped_int4",
                       weight_format="int4-g128", native="native", role=None),
        answers=ds.candidate_answers(ds.reference_answers(), 3, seed=11), latencies=ds.latencies(60.0, seed=11)))
    monkeypatch.setenv("QUANTBENCH_DB", str(store.path))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("page_runs.py").run()
    assert not at.exception, at.exception
    runs = at.dataframe[0].value
    columns = list(runs.columns)
    assert columns[:len(FIRST)] == FIRST
    # why a run failed, then where it came from, after what it measured
    assert columns.index("kernel_path") < columns.index("failure") < columns.index("error") < columns.index("source")
    assert columns.index("source") < columns.index("driver_version") and columns[-1] == "run_id"
    assert runs.loc[runs["run_id"] == no_role, "role"].tolist() == ["candidate"]
    assert set(runs["role"]) == {"candidate", "reference", "noise_floor"}
    text = runs.select_dtypes(include=["object", "string"])
    assert not text.isna().any().any() and not text.isin(["None"]).any().any()
    ok = runs[runs["status"] == "ok"]
    assert ok["p50_ms"].notna().all() and (ok["failure"] == "").all() and (ok["error"] == "").all()
