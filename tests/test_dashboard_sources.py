"""The dashboard over your store with the shared results beside it: every row says where it came from (its bundle,
host and date), the Sources page lists the bundles, the Constraints page answers as `quantbench recommend`, and
the dashboard opens on this machine's runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from quantbench.analysis.constraints import Constraints, answer
from quantbench.store import Store, queries
from quantbench.store.bundle import publish
from quantbench.store.pull import pull
from tests import dashboard_store as ds
from tests.test_transfer import write_runs

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")


@pytest.fixture(scope="module")
def homes(tmp_path_factory):
    """A shipped store (the dashboard's test store), a pulled store holding one bundle of H200 runs published
    elsewhere, and your own store with two CPU runs made on this machine."""
    root = tmp_path_factory.mktemp("sources")
    shipped = ds.build(root / "shipped.duckdb")
    elsewhere = Store(root / "elsewhere.duckdb")
    ids = write_runs(elsewhere, "lab-box", n=2, gpu="NVIDIA H100")
    bundle = publish(elsewhere, root / "h100-bundle", ids, [], name="h100-lab", selection={},
                     publisher={"host": "lab-box", "quantbench_version": "0.1.0", "quantbench_git_rev": "abc"})
    home = root / "home"
    home.mkdir()
    pull(Store(home / "pulled.duckdb"), str(bundle.path))
    write_runs(Store(home / "results.duckdb"), socket.gethostname(), n=2)
    return home, shipped.path


@pytest.fixture
def env(homes, monkeypatch):
    home, shipped = homes
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    monkeypatch.setenv("QUANTBENCH_HOME", str(home))
    monkeypatch.setenv("QUANTBENCH_SHIPPED", str(shipped))
    return home, shipped


def app(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    return at.run()


def test_the_runs_page_says_where_every_row_came_from(env):
    home, shipped = env
    at = app()
    assert not at.exception
    caption = " ".join(c.value for c in at.sidebar.caption)
    assert f"your store `{home / 'results.duckdb'}`" in caption and "shipped with quantbench" in caption
    at.switch_page("page_runs.py").run()
    df = at.dataframe[0].value
    sources = set(df["source"])
    assert "your store" in sources and "shipped with quantbench" in sources
    assert any(s.startswith("bundle h100-lab (published by lab-box on ") for s in sources)
    assert set(df.loc[df["source"].str.startswith("bundle"), "host"]) == {"lab-box"}


def test_it_opens_on_this_machine_and_the_switch_reads_your_store_alone(env):
    at = app()
    assert at.selectbox(key="gpu").value == f"cpu:{socket.gethostname()}"  # your own runs first
    at.toggle(key="shared").set_value(False).run()
    assert not at.exception
    assert at.query_params["shared"] == "0"  # the link keeps it
    at.switch_page("page_runs.py").run()
    assert set(at.dataframe[0].value["source"]) == {"your store"}


def test_the_sources_page_lists_the_stores_and_the_bundle(env):
    _, shipped = env
    at = app()
    at.switch_page("page_sources.py").run()
    assert not at.exception
    stores = at.dataframe[0].value.set_index("Source")["Runs read from it"].to_dict()
    assert stores == {"your store": 2, "pulled bundles": 2, "shipped with quantbench": queries.run_count(Store(shipped))}
    bundles = at.dataframe[1].value
    assert bundles["Bundle"].tolist() == ["h100-lab"] and bundles["Published by"].tolist() == ["lab-box"]


def test_the_report_table_has_a_source_column(env):
    at = app(gpu="NVIDIA H200")
    assert not at.exception
    df = at.dataframe[0].value
    assert all(s.startswith("shipped with quantbench, measured on h200-box 2026-11-29") for s in df["Source"])


def test_the_constraints_page_answers_as_quantbench_recommend(env):
    home, shipped = env
    at = app(gpu="NVIDIA H200", max_latency_ms="100", max_vram_gib="24")
    at.switch_page("page_constraints.py").run()
    assert not at.exception
    expected = {a.report.gpu: a for a in answer(Store(shipped), Constraints(max_latency_ms=100, max_vram_gib=24))
                if not a.synthetic}
    h200 = expected["NVIDIA H200 (hopper)"]
    assert at.subheader[0].value == f"NVIDIA H200 (hopper) · {ds.MODEL} (selected)"
    assert at.success[0].value.startswith(f"**⭐ {h200.pick.label}**")
    table = at.dataframe[0].value
    assert table["Variant"].tolist() == [("⭐ " if k is h200.pick else "") + k.label for k in h200.candidates]
    assert table["Fails"].tolist() == ["; ".join(f"{n}: {w}" for n, w in k.failed.items()) for k in h200.candidates]
    at.number_input(key="max_vram_gib").set_value(1.0).run()
    assert at.warning[0].value.startswith("Nothing qualifies: peak VRAM ≤ 1 GiB: no variant; the closest")
