"""The dashboard's "Serving under load" page under AppTest: stored load runs drawn as throughput against latency,
with the saturation point that quantbench.analysis.load computes, and a plain note when there are none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.analysis.load import saturation
from quantbench.store import Store
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")
INT4 = ds.LOAD_STEPS  # the INT4 row on the H200: (clients, decisions/s, p50 ms, p99 ms) per step


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return ds.build(tmp_path_factory.mktemp("dashload") / "results.duckdb").path


def with_load_run(built: Path, tmp_path: Path) -> Path:
    path = tmp_path / "results.duckdb"
    shutil.copy(built, path)
    ds.write_load_run(Store(path))
    return path


def test_the_load_page_draws_throughput_against_latency_and_the_saturation(built, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTBENCH_DB", str(with_load_run(built, tmp_path)))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("page_load.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Serving under load"
    sat, steps = at.dataframe[0].value, at.dataframe[1].value
    expected = saturation([c for c, *_ in INT4], [t for _, t, *_ in INT4])
    assert sat["Saturates at"].tolist() == ["32 clients"] and sat["Peak decisions/s"].tolist() == ["95.1"]
    assert sat["Largest load"].tolist() == ["128 clients"] and sat["Refused (503 / 429)"].tolist() == [
        "238 of 500 at 128 clients"]
    assert sat["Kept at the largest load"].tolist() == [f"{expected.kept:.0%}"]
    assert steps["load"].tolist() == ["1 client", "8 clients", "32 clients", "128 clients"]
    assert steps["errors"].tolist() == ["none", "none", "none", "238 × 503"]
    assert "int4" in at.multiselect[0].value[0] and "NVIDIA H200" in at.multiselect[0].value[0]


def test_the_load_page_says_how_to_make_a_load_run_when_there_is_none(built, tmp_path, monkeypatch):
    path = tmp_path / "results.duckdb"
    shutil.copy(built, path)
    Store(path).migrate()
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("page_load.py").run()
    assert not at.exception, at.exception
    assert "quantbench load --endpoint URL" in at.info[0].value
