"""The dashboard over groups of only batched runs (`run --concurrency N` on a suite never run one decision at a time):
the report page shows each as its note and throughput table, and the pages that read per-decision rows say why
they have none instead of failing or showing an empty table."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.analysis import efficiency
from quantbench.report import build_report
from quantbench.store import Store
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
H200 = "NVIDIA H200"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    store = ds.build(tmp_path_factory.mktemp("dash-batched") / "results.duckdb")
    ds.add_batched_only(store)
    return store.path


@pytest.fixture
def store(built, monkeypatch) -> Store:
    monkeypatch.setenv("QUANTBENCH_DB", str(built))
    return Store(built)


def app(page: str | None = None, **query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, page
    return at


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def throughput_frame(at: AppTest):
    return next(d.value for d in at.dataframe if "Decisions per pass" in d.value.columns)


def test_the_report_page_shows_a_suite_run_only_batched_as_its_note_and_throughput(store):
    at = app(gpu=H200, model=ds.MODEL)
    table, alone = build_report(store, gpu=H200, model=ds.MODEL)  # suites default, then s64
    assert alone.batched_only and not table.batched_only
    assert texts(at.subheader)[:2] == [f"{ds.MODEL} on NVIDIA H200 (hopper) · suite {s}"  # a heading each
                                       for s in (ds.SUITE[0], ds.BATCHED_SUITE[0])]
    assert f"Suite {ds.BATCHED_SUITE[0]} (hash {ds.BATCHED_SUITE[1]})" in texts(at.caption)
    assert f"**No per-decision table:** {alone.no_table_note}." in texts(at.info)
    df = throughput_frame(at)
    assert df["Decisions per pass"].tolist() == [t["batch"] for t in alone.throughput] == [16, 16, 32]
    assert df["Variant"].tolist() == ["fp8", "int4", "int4"]
    assert df["Decisions/s"].tolist() == [t["decisions_per_s"] for t in alone.throughput]
    assert df["Energy per decision"].tolist() == [efficiency.energy_text(t["efficiency"]) for t in alone.throughput]
    # the batch-1 table is drawn as before, and the cards below hold only tables that can have a pick
    assert any("Recommended: int4" in s for s in texts(at.success))
    assert [m.label for m in at.metric] == ["NVIDIA H200 (hopper) (selected)", "NVIDIA RTX PRO 6000 Blackwell "
                                            "(blackwell)", "CPU (ci-runner)"]


def test_a_model_run_only_batched_shows_its_throughput_and_the_other_pages_say_why_they_are_empty(store):
    [alone] = build_report(store, gpu=H200, model=ds.BATCHED_MODEL)
    at = app(gpu=H200, model=ds.BATCHED_MODEL)
    assert at.selectbox(key="model").value == ds.BATCHED_MODEL
    assert f"**No per-decision table:** {alone.no_table_note}." in texts(at.info)
    assert throughput_frame(at)["Decisions per pass"].tolist() == [16]
    assert not at.metric and "the recommendation on every GPU" not in " ".join(texts(at.subheader))
    latency = app("page_latency.py", gpu=H200, model=ds.BATCHED_MODEL)
    assert any(s.startswith(f"Only batched runs of {ds.BATCHED_MODEL} on NVIDIA H200") for s in texts(latency.info))
    parity = app("page_parity.py", gpu=H200, model=ds.BATCHED_MODEL)
    assert any(alone.no_table_note in s for s in texts(parity.info))


def test_the_constraints_page_says_why_a_batched_only_table_has_no_pick_and_draws_no_empty_table(store):
    at = app("page_constraints.py", gpu=H200, model=ds.MODEL)
    warnings = texts(at.warning)
    assert sum(w.startswith("Nothing to pick from: only batched runs") for w in warnings) == 2
    assert all(not d.value.empty for d in at.dataframe)


def test_the_latency_page_names_the_suites_whose_batched_runs_it_leaves_out(store):
    at = app("page_latency.py", gpu=H200, model=ds.MODEL)
    assert any(f"(suite {ds.BATCHED_SUITE[0]})" in s for s in texts(at.caption))


def test_the_constraints_page_names_the_suite_where_a_model_has_several_on_that_gpu_and_marks_the_selected_model(store):
    """Two H200 answers for one model (suites default and s64) used to share the heading `GPU · model`, the suite only
    in a caption; and every answer on the selected GPU was marked selected, another model's too."""
    at = app("page_constraints.py", gpu=H200, model=ds.MODEL)
    h200 = "NVIDIA H200 (hopper)"
    assert texts(at.subheader) == [f"{h200} · {ds.MODEL} · suite {ds.SUITE[0]} (selected)",
                                   f"{h200} · {ds.MODEL} · suite {ds.BATCHED_SUITE[0]} (selected)",
                                   f"{h200} · {ds.BATCHED_MODEL}",  # one suite: the caption names it
                                   f"NVIDIA RTX PRO 6000 Blackwell (blackwell) · {ds.MODEL}",
                                   f"CPU (ci-runner) · {ds.MODEL}"]
    other = app("page_constraints.py", gpu=H200, model=ds.BATCHED_MODEL)
    heads = texts(other.subheader)
    assert heads[0] == f"{h200} · {ds.BATCHED_MODEL} (selected)"
    assert [h for h in heads if h.endswith("(selected)")] == heads[:1]
