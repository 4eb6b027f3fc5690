"""The "Serving under load" page in a real browser (`streamlit run dashboard`, Debian's chromium): the chart's legend
stays clear of its x axis title however many rows the runs' names take. Its screenshot goes to test-artifacts/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import dashboard_store as ds
from tests.streamlit_server import BROWSER_TESTS, WAIT_MS, dashboard
from tests.test_dashboard_browser import no_exception, shoot
from tests.test_dashboard_load_labels import write

pytestmark = BROWSER_TESTS


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    store = ds.build_only_load(tmp_path_factory.mktemp("loadbrowser") / "results.duckdb")
    write(store, 10, [(128, 183.5, 600, 536)])
    write(store, 20, [(1, 73.2, 367, 0), (8, 106.7, 536, 0), (32, 135.4, 705, 0)])
    write(store, 30, [(32, 111.7, 680, 0), (64, 136.8, 866, 0)], max_batch=32)
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with dashboard(store.path, log, "--server.address", "127.0.0.1", "--client.toolbarMode", "viewer") as (url, _):
        yield url


def box(page, selector: str) -> dict:
    handle = page.locator(selector).first
    handle.wait_for(state="attached")
    return handle.bounding_box()


def test_the_legend_stays_clear_of_the_x_axis_title(page, server):
    page.goto(server)  # a store of only load runs opens on the load page (its url is the root then)
    page.get_by_role("heading", name="Serving under load", exact=True).wait_for(state="visible")
    page.locator(".js-plotly-plot").first.wait_for(state="visible")
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    page.wait_for_timeout(800)
    no_exception(page)
    assert page.locator(".js-plotly-plot .legend .traces").count() == 3  # the three newest runs
    title, legend = box(page, ".js-plotly-plot .g-xtitle text"), box(page, ".js-plotly-plot .legend")
    assert title["y"] + title["height"] <= legend["y"], (title, legend)  # the legend starts below the title
    plot = box(page, ".js-plotly-plot .main-svg")
    assert legend["y"] + legend["height"] <= plot["y"] + plot["height"] + 1  # and inside the figure
    shoot(page, "load")
