"""QA of the dashboard as a user drives it: odd links, stores that change under it. AppTest, fast."""


import pytest
from streamlit.testing.v1 import AppTest

from quantbench.report import Rules, build_report
from quantbench.store import Store
from tests import dashboard_store as ds
from tests.test_dashboard import APP
from tests.test_dashboard import built as built  # noqa: F401  (a fixture: the shared test store)
from tests.test_dashboard import store as store  # noqa: F401  (a fixture: that store via QUANTBENCH_DB)


def app(page: str | None = None, **query) -> AppTest:
    """The app opened on a link (`query`), then on `page`; every run of the script must end without an exception
    (a link's first run draws the default page, and what it shows there is what the user sees first)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    assert not at.exception, at.exception[0].message
    if page is not None:
        at.switch_page(page).run()
        assert not at.exception, at.exception[0].message
    return at


def shown(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in (at.markdown, at.caption, at.info, at.warning, at.success, at.error)
                     for e in kind)


@pytest.mark.parametrize("page", ["page_report.py", "page_latency.py", "page_parity.py"])
@pytest.mark.parametrize("query", [{"price": "nan"}, {"price": "inf"}, {"budget": "nan"}, {"budget": "inf"}])
def test_a_link_with_a_non_finite_price_or_budget_is_ignored_not_a_traceback(store, page, query):
    """`?price=nan` raised ConfigError (a traceback on the report and latency pages); `?budget=nan` judged every
    variant against "peak VRAM ≤ nan GiB" (the CPU's card: no variant passes)."""
    at = app(None if page == "page_report.py" else page, gpu="NVIDIA H200", **query)  # the report: the first run
    assert "nan GiB" not in shown(at) and "inf GiB" not in shown(at)
    if page == "page_report.py":
        expect = build_report(store, rules=Rules())
        h200 = next(r for r in expect if r.gpu.startswith("NVIDIA H200") and r.model_id == ds.MODEL
                    and not r.batched_only)
        assert any(f"Recommended: {h200.recommended.label}" in s.value for s in at.success)


@pytest.mark.parametrize("query", [{"max_latency_ms": "nan"}, {"max_vram_gib": "inf"}, {"max_energy_j": "nan"}])
def test_a_constraints_link_with_a_non_finite_number_is_no_such_constraint(store, query):
    """Was: the input showed "no target" while the page said only `--max-latency-ms nan: give a positive number`."""
    at = app("page_constraints.py", **query)
    assert not at.exception
    assert not at.error, at.error[0].value


def test_a_constraints_link_with_a_margin_out_of_range_keeps_the_default(store):
    """Was: `?margin_pts=1000` became the input's minimum, 0.1 points: the strictest margin, not what was asked."""
    at = app("page_constraints.py", margin_pts="1000")
    assert not at.exception
    assert at.number_input(key="margin_pts").value == 2.0


def test_a_link_naming_a_gpu_and_model_the_store_has_no_runs_of_says_what_it_shows_instead(store):
    """Was: `?gpu=NVIDIA A100&model=foo/bar` opened another GPU's table with no word that the link's GPU is not
    there, so whoever opened a shared link read the Blackwell's pick as the A100's."""
    at = app(gpu="NVIDIA A100", model="foo/bar")
    said = [w.value for w in at.warning]
    gpu = at.selectbox(key="gpu")
    assert any("GPU `NVIDIA A100`" in w and f"showing **{gpu.format_func(gpu.value)}**" in w for w in said), said
    assert any("model `foo/bar`" in w and f"showing **{at.selectbox(key='model').value}**" in w for w in said), said
    at.switch_page("page_latency.py").run()  # still said on the next page, while the replacement stands
    assert any("NVIDIA A100" in w.value for w in at.warning)
    at.selectbox(key="family").set_value("hopper").run()  # the user chose another GPU: the link is answered
    assert at.selectbox(key="gpu").value == "NVIDIA H200"
    assert not any("NVIDIA A100" in w.value for w in at.warning)


def test_a_link_with_markdown_in_a_name_cannot_put_a_link_on_the_page(store):
    at = app(model="[click](http://evil.example) `x`")
    said = [w.value for w in at.warning]
    assert any("`[click](http://evil.example) 'x'`" in w for w in said), said  # inside one code span


def test_a_link_naming_a_known_gpu_says_nothing(store):
    at = app(gpu="NVIDIA H200")
    assert not [w.value for w in at.warning if "The link asks" in w.value]


def test_your_store_not_made_with_the_shared_results_switched_off_says_to_switch_them_on(built, tmp_path,
                                                                                          monkeypatch):
    """Was: `?shared=0` (or the sidebar switch off) with no store of your own said "no shared results are
    installed" while the shipped results were there, one switch away."""
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUANTBENCH_SHIPPED", str(built))
    at = app(shared="0")
    said = " ".join(i.value for i in at.info)
    assert "switched off" in said and "Shared results too" in said, said
    assert "no shared results are installed" not in said
    at.toggle(key="shared").set_value(True).run()  # the switch it names shows them
    assert not at.exception and any("Recommended" in s.value for s in at.success)


def test_your_store_not_made_and_nothing_shared_still_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUANTBENCH_SHIPPED", "")
    at = app()
    assert any("no shared results are installed" in i.value for i in at.info)


def test_a_run_written_while_the_page_draws_does_not_split_the_sidebar_from_the_page(built, tmp_path, monkeypatch):
    """Was: with `quantbench run` writing, the sidebar said "18 runs" and the Runs page below it "19 runs" in one
    view: the page took the store's stamp again after the sidebar had read it."""
    import shutil

    from dashboard import store_cache

    path = tmp_path / "results.duckdb"
    shutil.copy(built, path)
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    at = app("page_runs.py")

    def counts() -> tuple[int, int]:
        side = next(c.value for c in at.sidebar.caption if " successful; newest" in c.value)
        main = next(c.value for c in at.main.caption if " failed. Newest first" in c.value)
        return int(side.split(" runs")[0]), int(main.split(" runs")[0])

    n, _ = counts()
    stamp, calls = store_cache.stamp, []

    def writing(p):  # a writer commits just after the store's stamp was first taken in this run
        calls.append(p)
        if len(calls) == 2:
            ds.append_run(Store(path), minutes=900)
        return stamp(p)

    monkeypatch.setattr(store_cache, "stamp", writing)
    at.run()
    side, main = counts()
    assert side == main, (side, main)
    at.run()  # the next run shows the new one, everywhere
    assert counts() == (n + 1, n + 1)


def test_a_run_written_during_a_cached_read_is_not_cached_under_the_older_state(built, tmp_path, monkeypatch):
    """Was: a read that missed the cache while a writer committed (here the runs table) was kept under the stamp
    the script run took before the write, beside tables read before it: one page drawn from two states of the
    store. That read is now dropped and the page drawn again, every table from the newer state."""
    import shutil

    from dashboard import store_cache

    path = tmp_path / "results.duckdb"
    shutil.copy(built, path)
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    at = app("page_runs.py")
    side = next(c.value for c in at.sidebar.caption if " successful; newest" in c.value)
    n = int(side.split(" runs")[0])
    stored_runs, calls = store_cache.stored_runs, []

    def read_while_written(store):
        calls.append(1)
        if len(calls) == 1:
            ds.append_run(Store(path), minutes=900)
        return stored_runs(store)

    monkeypatch.setattr(store_cache, "stored_runs", read_while_written)
    ds.append_run(Store(path), minutes=800)  # a new state: every table is read again, the runs table first
    at.run()
    assert not at.exception
    side = next(c.value for c in at.sidebar.caption if " successful; newest" in c.value)
    main = next(c.value for c in at.main.caption if " failed. Newest first" in c.value)
    assert int(side.split(" runs")[0]) == int(main.split(" runs")[0]) == n + 2, (side, main)
    assert len(calls) == 2  # the read that saw the write was not kept; the page's second draw read again
