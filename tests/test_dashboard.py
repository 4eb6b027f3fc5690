"""The dashboard under streamlit's AppTest: every page renders, and shows what `quantbench report` computes."""

import shutil
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.analysis import efficiency
from quantbench.report import Rules, build_report, cells, flat_rows, gpu_matrices
from quantbench.store import Store
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
PAGES = ["page_report.py", "page_latency.py", "page_parity.py", "page_runs.py"]
TITLES = ["Which quant should I use?", "Latency", "Parity detail", "Runs"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ds.build(tmp_path_factory.mktemp("dash") / "results.duckdb").path


@pytest.fixture
def store(built, monkeypatch) -> Store:
    """The shared test store (read only: the dashboard's cache serves it across tests), via QUANTBENCH_DB."""
    monkeypatch.setenv("QUANTBENCH_DB", str(built))
    return Store(built)


@pytest.fixture
def own_store(built, tmp_path, monkeypatch) -> Store:
    """A private copy, for a test that writes."""
    path = tmp_path / "results.duckdb"
    shutil.copy(built, path)
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    return Store(path)


def app(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    return at.run()


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def assert_table_is_the_report(at: AppTest, rep) -> None:
    """Every text cell equals `report.cells`, and the bar's value `report.flat_rows`' agreement."""
    df = at.dataframe[0].value
    expected = [cells(row, rep) for row in rep.rows]
    for col in expected[0]:
        assert df[col].tolist() == [e[col] for e in expected], col
    agree = flat_rows([rep])["agreement"].tolist()
    assert [None if v != v else round(v, 12) for v in df["Agreement"]] == \
        [None if v is None or v != v else round(v, 12) for v in agree]


def test_every_page_renders_without_an_exception(store):
    at = app(gpu="NVIDIA H200")
    assert not at.exception
    for page, title in zip(PAGES, TITLES, strict=True):
        at.switch_page(page).run()
        assert not at.exception, page
        assert texts(at.title) == [title]
    assert len(at.dataframe) >= 1  # the runs table


def test_the_model_opened_by_default_is_the_newest_with_trained_weights(store):
    """On the H200 the synthetic model ran last, but only trained weights answer "which quant" for quality."""
    at = app(gpu="NVIDIA H200")
    assert at.selectbox(key="model").options == [ds.MODEL, ds.SYNTHETIC_MODEL]
    assert at.selectbox(key="model").value == ds.MODEL


def test_the_table_shows_what_quantbench_report_computes_for_that_gpu(store):
    at = app(gpu="NVIDIA H200")
    assert at.selectbox(key="gpu").value == "NVIDIA H200"
    assert at.selectbox(key="family").value == "hopper"  # the link named only the GPU
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL)
    assert_table_is_the_report(at, rep)
    assert rep.recommended.label == "int4"
    assert any("Recommended: int4" in s for s in texts(at.success))


def test_changing_the_gpu_changes_the_table_and_the_url(store):
    at = app(gpu="NVIDIA H200")
    before = at.dataframe[0].value["Variant"].tolist()
    at.selectbox(key="family").set_value("blackwell").run()
    assert not at.exception
    assert at.selectbox(key="gpu").value == "NVIDIA RTX PRO 6000 Blackwell"
    assert at.query_params["gpu"] == "NVIDIA RTX PRO 6000 Blackwell" and at.query_params["family"] == "blackwell"
    [rep] = build_report(store, gpu="blackwell", model=ds.MODEL)
    assert_table_is_the_report(at, rep)
    assert at.dataframe[0].value["Variant"].tolist() != before


def test_rule_inputs_change_the_recommendation_as_the_report_rules_do(store):
    at = app(gpu="NVIDIA H200")
    at.slider(key="min_agree").set_value(99.0).run()
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL, rules=Rules(min_agreement=0.99))
    assert rep.recommended.label == "bf16"  # int4 (97.5%) and fp8 (98.5%) no longer pass
    assert_table_is_the_report(at, rep)
    assert at.query_params["min_agree"] == "99"
    at.number_input(key="budget").set_value(21.0).run()
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL, rules=Rules(min_agreement=0.99, vram_budget_gib=21))
    assert rep.recommended is None
    assert texts(at.warning) == [rep.rule[:1].upper() + rep.rule[1:]]
    assert at.query_params["budget"] == "21"


def test_rules_from_a_shared_link_apply_and_survive_a_page_switch(store):
    at = app(gpu="NVIDIA H200", min_agree="99")
    assert at.slider(key="min_agree").value == 99.0
    assert any("Recommended: bf16" in s for s in texts(at.success))
    at.switch_page("page_runs.py").run()
    at.switch_page("page_report.py").run()
    assert at.slider(key="min_agree").value == 99.0


def test_every_gpu_gets_its_recommendation_side_by_side(store):
    at = app(gpu="NVIDIA H200")
    reports = build_report(store, model=ds.MODEL)
    got = {m.label.removesuffix(" (selected)"): m.value for m in at.metric}
    assert got == {r.gpu: r.recommended.label for r in reports if r.model_id == ds.MODEL}
    assert got["NVIDIA RTX PRO 6000 Blackwell (blackwell)"] == "nvfp4-packed"


def test_a_failed_run_shows_with_its_reason(store):
    at = app(gpu="blackwell")
    df = at.dataframe[0].value
    assert df.loc[df["Variant"] == "bf16 (batched_mm)", "Best for"].tolist() == ["failed here (oom)"]
    # one variant under several kernels: named by variant and kernel, the whole kernel path in its own column
    assert df.loc[df["Variant"] == "bf16 (batched_mm)", "Kernel"].tolist() == ["batched_mm"]
    assert "Kernel differs by" not in df.columns  # only with History, where the labels are whole kernel paths
    at.switch_page("page_runs.py").run()
    runs = at.dataframe[0].value
    failed = runs[runs["status"] == "failed"]
    assert failed["failure"].tolist() == ["oom"]
    assert failed["error"].iloc[0].startswith("torch.OutOfMemoryError")
    assert any("oom" in e.label for e in at.expander)


def test_synthetic_weights_show_speed_and_memory_only(store):
    at = app(gpu="NVIDIA H200", model=ds.SYNTHETIC_MODEL)
    assert not at.exception
    assert any("speed and memory only" in s for s in texts(at.info))
    assert at.dataframe[0].value["Agrees with BF16 (95% CI)"].tolist() == ["synthetic weights: speed/memory only"]
    at.switch_page("page_parity.py").run()
    assert not at.exception and any("speed and memory only" in s for s in texts(at.info))
    at.switch_page("page_latency.py").run()
    assert not at.exception and len(at.dataframe) == 1


def test_latency_page_percentiles_are_the_stores(store):
    at = app(gpu="NVIDIA H200")
    at.switch_page("page_latency.py").run()
    table = at.dataframe[0].value.set_index("Variant")
    summary = store.read("SELECT variant, p50_ms, p99_ms, cold_ms FROM run_summary WHERE gpu_name = 'NVIDIA H200' "
                         "AND model_id = ? AND role <> 'noise_floor'", [ds.MODEL]).set_index("variant")
    assert sorted(table.index) == sorted(summary.index)
    for v in summary.index:
        assert table.at[v, "p50 (ms)"] == pytest.approx(summary.at[v, "p50_ms"])
        assert table.at[v, "p99 (ms)"] == pytest.approx(summary.at[v, "p99_ms"])
        assert table.at[v, "Cold start (ms)"] == pytest.approx(summary.at[v, "cold_ms"])
    assert set(table["Suite"]) == {ds.SUITE[0]}  # every row says which decisions it timed


def test_parity_page_lists_the_flips_and_searches_them(store):
    at = app(gpu="NVIDIA H200", variant="nvfp4-packed")
    at.switch_page("page_parity.py").run()
    assert at.selectbox(key="variant").value == "nvfp4-packed"
    comp = next(r.comparison for r in build_report(store, gpu="NVIDIA H200", model=ds.MODEL)[0].rows
                if r.label == "nvfp4-packed")
    flips = at.dataframe[1].value
    assert len(flips) == (~comp.per_question["agree"]).sum() == 18
    first = flips.iloc[0]
    assert first["top_ref"] != first["top_cand"]
    assert first["BF16 distribution"].split()[::2] == ds.OPTIONS  # "A 0.08  B 0.03 ..." for every option
    at.text_input(key="flip_search").set_value("safety").run()
    searched = at.dataframe[1].value
    assert 0 < len(searched) < len(flips) and set(searched["benchmark"]) == {"safety"}
    deltas = at.dataframe[2].value
    assert deltas["delta"].tolist() == pytest.approx((100 * comp.paired.by_benchmark["delta"]).tolist())


def test_parity_page_shows_the_verdict_with_its_margins_and_intervals(store):
    at = app(gpu="NVIDIA H200", variant="nvfp4-packed")
    at.switch_page("page_parity.py").run()
    comp = next(r.comparison for r in build_report(store, gpu="NVIDIA H200", model=ds.MODEL)[0].rows
                if r.label == "nvfp4-packed")
    metric = next(m for m in at.metric if m.label == "Against the noise floor")
    assert metric.value == comp.verdict.label and comp.verdict.label != "no noise floor"
    why = [m.value for m in next(e for e in at.expander if e.label == "Why this verdict").markdown]
    assert any("95% interval [" in w and "margin 2 points" in w for w in why)
    assert any("margin 0.01" in w for w in why)


@pytest.mark.parametrize("make, expect", [
    (None, "No results store at"),
    (ds.build_empty, "has no runs yet"),
    (ds.build_old_schema, "has schema version 1"),
    (lambda path: path.write_text("not a database"), "Cannot read"),
])
def test_stores_it_cannot_use_get_a_message_on_every_page(tmp_path, monkeypatch, make, expect):
    path = tmp_path / "results.duckdb"
    if make is not None:
        make(path)
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    at = app()
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, page
        assert any(expect in s for s in texts(at.info)), page
    assert make is not None or not path.exists()  # reading never creates a store


def test_a_store_of_only_failed_runs_explains_and_lists_them(tmp_path, monkeypatch):
    ds.build_only_failed(tmp_path / "results.duckdb")
    monkeypatch.setenv("QUANTBENCH_DB", str(tmp_path / "results.duckdb"))
    at = app()
    assert not at.exception
    assert any("Every run in this store failed" in s for s in texts(at.warning))
    assert at.dataframe[0].value["failure"].tolist() == ["load_error"]
    for page in PAGES[1:]:
        at.switch_page(page).run()
        assert not at.exception, page


def test_a_writer_is_not_blocked_by_the_open_dashboard_and_its_run_shows(own_store):
    store = own_store
    at = app(gpu="cpu")
    at.switch_page("page_runs.py").run()
    n = len(at.dataframe[0].value)
    t0 = time.monotonic()
    ds.append_run(store)  # the dashboard has queried and stays open: the write must not wait on it
    assert time.monotonic() - t0 < 5
    at.run()
    assert len(at.dataframe[0].value) == n + 1


def test_runs_since_a_day_comes_from_the_link_and_cuts_runs_as_the_report_does(store):
    import pandas as pd

    from dashboard.store_cache import runs_since

    at = app(gpu="NVIDIA H200", since="2026-11-29")
    assert not at.exception
    assert at.selectbox(key="since").value == "2026-11-29" and at.query_params["since"] == "2026-11-29"
    assert at.selectbox(key="since").options == ["all runs", "2026-11-29"]  # the days the store has runs from
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL, since="2026-11-29")
    assert_table_is_the_report(at, rep)
    at.selectbox(key="since").set_value("all").run()
    assert "since" not in at.query_params
    runs = pd.DataFrame({"created_at": pd.to_datetime(["2026-11-29T23:59Z", "2026-11-30T00:00Z"])})
    assert runs_since(runs, "2026-11-30")["created_at"].tolist() == [runs["created_at"][1]]
    assert runs_since(runs, None) is runs


def test_latency_boxes_lie_along_rows_and_go_log_when_the_times_span_over_20x():
    import pandas as pd

    from dashboard import figures

    names = ["int4 · suite-512", "bf16 (transformers experts=eager +fused rmsnorm+rope) · suite-512"]
    lat = pd.DataFrame({"variant": [names[0]] * 3 + [names[1]] * 3, "model_ms": [19.0, 19.2, 19.3, 390, 393, 456],
                        "weight_format": ["int4"] * 3 + ["bfloat16"] * 3})
    fig = figures.latency_box(lat, names)
    assert [t.orientation for t in fig.data] == ["h", "h"]
    assert [t.name.replace("<br>", " ") for t in fig.data] == names[::-1]  # the first variant on the top row
    assert "<br>" in fig.data[0].name and max(len(line) for line in fig.data[0].name.split("<br>")) <= 44
    assert fig.layout.xaxis.type == "log"
    close = figures.latency_box(lat[lat["variant"] == names[0]], names[:1], "violin")
    assert close.layout.xaxis.type == "linear" and close.data[0].type == "violin"
    outlier = pd.concat([lat[lat["variant"] == names[0]], lat.iloc[[0]].assign(model_ms=900.0)])
    assert figures.latency_box(outlier, names[:1]).layout.xaxis.type == "log"  # one slow decision squeezes the box


def test_point_labels_keep_only_the_words_that_tell_a_variants_runs_apart():
    import pandas as pd

    from dashboard.figures import point_labels

    v = pd.Series(["bf16 (transformers experts=grouped_mm +fused rmsnorm+rope +cuda-graph)",
                   "bf16 (transformers experts=eager +fused rmsnorm+rope)", "fp8",
                   "int4 (quantbench grouped-moe triton-fused-int4 +fused rmsnorm+rope +cuda-graph)",
                   "int4 (quantbench grouped-moe triton-fused-int4 +fused rmsnorm+rope+qkv +cuda-graph)",
                   "nvfp4 (only one run)"], index=[4, 2, 9, 7, 1, 3])
    assert point_labels(v).to_dict() == {
        4: "bf16 · experts=grouped_mm +cuda-graph", 2: "bf16 · experts=eager", 9: "fp8",
        7: "int4 · rmsnorm+rope", 1: "int4 · rmsnorm+rope+qkv", 3: "nvfp4"}


def test_a_crowded_speed_memory_chart_numbers_its_points_and_names_them_in_the_legend():
    from types import SimpleNamespace

    import pandas as pd

    from dashboard import figures

    def flat(n: int) -> pd.DataFrame:
        return pd.DataFrame({"status": "ok", "p50_ms": [30.0 - i for i in range(n)],
                             "weights_memory_bytes": [float(2**30 * (10 + i)) for i in range(n)],
                             "variant": [f"int4 (quantbench grouped-moe path{i} +cuda-graph)" for i in range(n)],
                             "weight_format": "int4 w4a16"})

    rep = SimpleNamespace(cpu=False)
    few = figures.speed_memory(rep, flat(figures.CROWDED))
    assert len(few.data) == 1 and list(few.data[0].text)[0].startswith("int4 · path")  # labels on the points
    many = figures.speed_memory(rep, flat(figures.CROWDED + 2))
    assert [t.text[0] for t in many.data] == [str(i) for i in range(1, figures.CROWDED + 3)]
    assert [t.x[0] for t in many.data] == sorted(t.x[0] for t in many.data)  # numbered fastest first
    assert many.data[0].name == f"1 · int4 · path{figures.CROWDED + 1}"
    assert many.data[0].hovertext[0] == f"int4 (quantbench grouped-moe path{figures.CROWDED + 1} +cuda-graph)"


def test_point_labels_at_the_plot_edges_run_inwards_and_long_ones_wrap():
    from types import SimpleNamespace

    import pandas as pd

    from dashboard import figures

    x = pd.Series([1291.2, 12.3, 50.0], index=[5, 6, 7])
    assert figures.label_positions(x).to_dict() == {5: "top left", 6: "top right", 7: "bottom center"}
    assert figures.label_positions(pd.Series([3.0])).tolist() == ["top center"]
    two = pd.DataFrame({"status": "ok", "p50_ms": [1291.2, 12.3], "weights_memory_bytes": [16.9 * 2**30, 17 * 2**30],
                        "variant": ["int4 (auto-round per-expert loop qlinear_tritonv2_zp +fused rmsnorm+rope+qkv)",
                                    "int4 (quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope+qkv+nextnorm)"],
                        "weight_format": "int4 w4a16"})
    fig = figures.speed_memory(SimpleNamespace(cpu=False), two)
    assert all("<br>" in t and max(len(line) for line in t.split("<br>")) <= 44 for t in fig.data[0].text)
    assert fig.layout.yaxis.range[1] > 17 * 1.2  # headroom above the top point for its label


# -- issue #22 item 11: the newest run of each variant by default, history behind a toggle, the cross-GPU matrix --
def test_history_is_behind_a_toggle_that_the_link_keeps(own_store):
    ref = ds.reference_answers()
    for minutes, gen in ((400, "triton-fused-int4"), (410, "gluon-wgmma-int4 +fused rmsnorm+rope")):
        own_store.write_run(ds.RunResult(
            run=ds.run_row(ds.H200, minutes, backend="int4", variant="int4", kernel_path=f"quantbench grouped-moe {gen}",
                           weight_format="int4-g128", native="native", role="candidate", **ds._memory(ds.H200, 16.4, 16.9)),
            answers=ds.candidate_answers(ref, 7, seed=500 + minutes), latencies=ds.latencies(12.0, seed=minutes)))
    at = app(gpu="NVIDIA H200")
    labels = at.dataframe[0].value["Variant"].tolist()
    assert [v for v in labels if v.startswith("int4")] == ["int4 (grouped_int4)", "int4 (quantbench engine)"]
    df = at.dataframe[0].value
    assert df.loc[df["Variant"] == "int4 (quantbench engine)", "Kernel"].tolist() == [
        "quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope"]
    assert at.toggle(key="history").value is False and "history" not in at.query_params
    at.toggle(key="history").set_value(True).run()
    labels = at.dataframe[0].value["Variant"].tolist()
    assert "int4 (quantbench grouped-moe triton-fused-int4)" in labels and len(labels) == 6
    assert at.query_params["history"] == "1"
    assert app(gpu="NVIDIA H200", history="1").toggle(key="history").value is True


def test_the_cross_gpu_matrix_shows_every_variant_on_every_gpu_and_each_pick(store):
    at = app(gpu="NVIDIA H200")
    [matrix] = gpu_matrices([r for r in build_report(store) if r.model_id == ds.MODEL])
    [df] = [d.value for d in at.dataframe if "Variant" in d.value and "Pick" in d.value["Variant"].tolist()]
    assert list(df.columns) == ["Variant", *matrix.gpus]
    pick = df.set_index("Variant").loc["Pick"].to_dict()
    assert pick == matrix.picks and pick["NVIDIA RTX PRO 6000 Blackwell (blackwell)"] == "nvfp4-packed"
    int4 = df.set_index("Variant").loc["int4"].to_dict()
    assert int4 == {g: matrix.cells["int4"].get(g, "not run") for g in matrix.gpus}
    assert int4["NVIDIA H200 (hopper)"] == "⭐ 61.7 ms · 16.4 GiB · 97.5% agree"  # the pick on the H200


# -- issue #22 item 12: a variant made elsewhere, selected by its own model id, shows in its base's table --------
def test_a_variant_made_elsewhere_is_shown_in_its_bases_table(own_store):
    own_store.write_run(ds.RunResult(
        run=ds.run_row(ds.H200, 400, backend="int4", variant="int4", kernel_path="quantbench grouped-moe gluon-wgmma-int4",
                       weight_format="int4 w4a16 g128 (auto_round:auto_gptq)", native="native", role="candidate",
                       model_id="someone/moe-a3b-int4-AutoRound", base_model="teststore/moe-a3b",
                       base_model_how="model_card", **ds._memory(ds.H200, 15.0, 16.0)),
        answers=ds.candidate_answers(ds.reference_answers(), 2, seed=77), latencies=ds.latencies(50.0, seed=77)))
    at = app(gpu="NVIDIA H200", model="someone/moe-a3b-int4-AutoRound")
    assert at.selectbox(key="model").value == "someone/moe-a3b-int4-AutoRound"
    assert any("is a variant of teststore/moe-a3b" in i.value for i in at.info)
    df = at.dataframe[0].value
    assert df.loc[df["Variant"] == "int4 (quantbench engine)", "Agreement"].round(3).tolist() == [0.99]
    assert any("int4 (quantbench engine) is the checkpoint someone/moe-a3b-int4-AutoRound, compared with this "
               "model's BF16 run because of its model card's base_model (teststore/moe-a3b)" in c.value
               for c in at.caption)


def test_the_table_shows_joules_per_decision_beside_latency_and_na_on_a_cpu(store):
    at = app(gpu="NVIDIA H200")
    df = at.dataframe[0].value.set_index("Variant")
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL)
    energy = {r.label: r.efficiency for r in rep.rows}
    # 450 W over the phase, 120 W idle (tests/dashboard_store.py); the nvfp4 run's phase was too short
    assert df.at["int4", "Energy per decision"] == efficiency.energy_text(energy["int4"])
    assert df.at["int4", "Energy per decision"].endswith("above idle)") and energy["int4"].j_per_decision > 0
    assert df.at["nvfp4-packed", "Energy per decision"] == "n/a"
    assert "Cost per 1M decisions" not in df.columns  # no price: no cost
    order = list(at.dataframe[0].value.columns)
    assert order.index("Energy per decision") == order.index("Latency p50 / p90 (per decision)") + 1
    at = app(gpu="cpu:ci-runner")
    assert set(at.dataframe[0].value["Energy per decision"]) == {"n/a"}


def test_a_price_per_gpu_hour_adds_cost_as_the_report_computes_it_and_goes_in_the_url(store):
    at = app(gpu="NVIDIA H200")
    at.number_input(key="price").set_value(3.6).run()
    assert not at.exception and at.query_params["price"] == "3.6"
    [rep] = build_report(store, gpu="NVIDIA H200", model=ds.MODEL, price_per_gpu_hour=3.6)
    assert_table_is_the_report(at, rep)  # every cell, the cost column too
    df = at.dataframe[0].value.set_index("Variant")
    assert df.at["int4", "Cost per 1M decisions"].startswith("$")
    at = app(gpu="cpu:ci-runner", price="3.6")  # a shared link carries the price
    assert at.number_input(key="price").value == 3.6
    assert set(at.dataframe[0].value["Cost per 1M decisions"]) == {"n/a"}  # a price per GPU hour prices GPUs only


def test_latency_page_shows_energy_and_power_beside_the_percentiles(store):
    at = app(gpu="NVIDIA H200")
    at.switch_page("page_latency.py").run()
    table = at.dataframe[0].value.set_index("Variant")
    assert table.at["int4", "Mean power (W)"] == "450" and table.at["int4", "Idle power (W)"] == "120"
    assert table.at["nvfp4-packed", "Energy per decision"] == "n/a"
    assert table.at["nvfp4-packed", "Mean power (W)"] == table.at["nvfp4-packed", "Idle power (W)"] == "n/a"
    assert any("NVML's total-energy counter" in c for c in texts(at.caption))


def test_a_run_timed_on_a_busy_machine_is_flagged_and_its_repeats_show_an_interval(own_store):
    """Issue #35 item 6 and 3 on the report page: a run whose timed phase shared the machine gets a warning naming
    why, and a `run --repeat 3` group shows p50 ± its t interval, as `quantbench report` prints them."""
    ref = ds.reference_answers()
    for i, ms in enumerate((11.0, 12.0, 13.0), 1):
        own_store.write_run(ds.RunResult(
            run=ds.run_row(ds.H200, 500 + i, backend="int4", variant="int4", kernel_path="quantbench grouped-moe x",
                           weight_format="int4-g128", native="native", role="candidate", repeat_id="rep-1",
                           repeat_index=i, repeat_count=3, cpu_others_share=0.6, load_avg_1m=7.5, cpu_cores=16,
                           **ds._memory(ds.H200, 16.4, 16.9)),
            answers=ds.candidate_answers(ref, 7, seed=600 + i), latencies=ds.latencies(ms, seed=600 + i)))
    at = app(gpu="NVIDIA H200")
    warnings = " ".join(w.value for w in at.warning)
    assert "Measured on a busy machine" in warnings and "other processes used 60% of the CPUs" in warnings
    df = at.dataframe[0].value
    label = "int4 (quantbench engine)"  # beside the store's own int4 (another kernel)
    cell = df.loc[df["Variant"] == label, "Latency p50 / p90 (per decision)"].iloc[0]
    assert "±" in cell and "(3 runs, CV" in cell and cell.endswith("⚠ busy")
    [rep] = [r for r in build_report(own_store) if r.gpu.startswith("NVIDIA H200") and r.model_id == ds.MODEL]
    assert cell == cells(next(r for r in rep.rows if r.label == label), rep)["Latency p50 / p90 (per decision)"]
