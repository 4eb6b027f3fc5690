"""An empty cell reads the same in every table of the dashboard: an em dash, never the data grid's grey "None".

Text cells were filled with "—" page by page, but a number the run did not measure (a failed run's p50, a CPU run's
energy, a load step without a queue time) is NaN, which the grid draws as "None" unless the table names a
placeholder. Every page is drawn over the test store with failed runs and a load run; every table on it must name
the placeholder, and some of them hold empty numbers (the test is about something)."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from dashboard import EMPTY
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
PAGES = ["page_report.py", "page_latency.py", "page_parity.py", "page_constraints.py", "page_load.py",
         "page_runs.py", "page_sources.py"]


def test_every_table_on_every_page_shows_an_empty_cell_as_a_dash(tmp_path, monkeypatch):
    store = ds.build(tmp_path / "results.duckdb")
    ds.write_load_run(store)
    monkeypatch.setenv("QUANTBENCH_DB", str(store.path))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert EMPTY == "—"
    seen, with_empty_numbers = 0, 0
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, at.exception[0].message if at.exception else None)
        for frame in at.dataframe:
            seen += 1
            assert frame.proto.placeholder == EMPTY, (page, list(frame.value.columns)[:6])
            numbers = frame.value.select_dtypes(include="number")
            with_empty_numbers += bool(numbers.isna().any().any())
    assert seen >= 7 and with_empty_numbers >= 1
