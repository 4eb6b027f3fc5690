"""A store holding only `quantbench load` runs (no benchmark run yet): the dashboard opens on the load page,
and every other page says what the store holds and links there, instead of "no runs yet"."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
OTHER_PAGES = ["page_report.py", "page_latency.py", "page_parity.py", "page_runs.py"]


def test_a_store_of_only_load_runs_opens_on_the_load_page_and_says_what_it_holds(tmp_path, monkeypatch):
    ds.build_only_load(tmp_path / "results.duckdb")
    monkeypatch.setenv("QUANTBENCH_DB", str(tmp_path / "results.duckdb"))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, at.exception
    assert [t.value for t in at.title] == ["Serving under load"]
    saturation = at.dataframe[0].value
    assert saturation["Saturates at"].tolist() == ["32 clients"] and saturation["Peak decisions/s"].tolist() == [
        "95.1"]
    assert any("1 load run, no benchmark runs" in c.value for c in at.sidebar.caption)
    for page in OTHER_PAGES:
        at.switch_page(page).run()
        assert not at.exception, page
        [info] = [i.value for i in at.info]
        assert "holds 1 load run (`quantbench load`" in info and "no benchmark runs" in info, page
        assert "no runs yet" not in info
    at.switch_page("page_load.py").run()
    assert not at.exception and len(at.dataframe) == 2  # back on the load page: saturation and steps
