"""The dashboard in a real browser: `streamlit run dashboard` in a subprocess, Debian's chromium via Playwright.

Screenshots of every page go to test-artifacts/ (and to $QUANTBENCH_SCREENSHOTS when set, e.g. docs/screenshots).
"""

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import dashboard_store as ds
from tests.streamlit_server import BROWSER_TESTS, VIEWPORT, WAIT_MS, dashboard

ROOT = Path(__file__).resolve().parent.parent

pytestmark = BROWSER_TESTS


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ds.build(tmp_path_factory.mktemp("browser") / "results.duckdb")


@pytest.fixture(scope="module")
def server(store, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with dashboard(store.path, log, "--server.address", "127.0.0.1", "--client.toolbarMode", "viewer") as (url, _):
        yield url


def settled(page) -> None:
    """Wait until the script has run (the page's title and the sidebar's filters are drawn, and the running
    indicator is gone)."""
    page.locator('[data-testid="stMain"] h1').first.wait_for(state="visible")
    page.get_by_role("combobox", name="Model", exact=True).wait_for(state="visible")
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    page.wait_for_timeout(300)


def no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0, page.locator(
        '[data-testid="stException"]').first.inner_text()


def shoot(page, name: str) -> None:
    """A screenshot of the whole page (streamlit scrolls inside its main element, so grow the viewport to it)."""
    height = page.evaluate('document.querySelector("[data-testid=stMain]").scrollHeight')
    page.set_viewport_size({"width": VIEWPORT["width"], "height": max(VIEWPORT["height"], height)})
    page.wait_for_timeout(1200)  # plotly and the data grid redraw at the new size
    dirs = [ROOT / "test-artifacts" / "screenshots"]
    if os.environ.get("QUANTBENCH_SCREENSHOTS"):
        dirs.append(ROOT / os.environ["QUANTBENCH_SCREENSHOTS"])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(d / f"{name}.png"))
    page.set_viewport_size(VIEWPORT)


def selectbox(page, label: str):
    return page.get_by_role("combobox", name=label, exact=True)


def test_report_page_loads_with_its_chart_and_the_gpu_from_the_link(page, server):
    page.goto(f"{server}/?gpu=NVIDIA+H200")
    settled(page)
    no_exception(page)
    assert page.get_by_role("heading", name="Which quant should I use?", exact=True).is_visible()
    assert selectbox(page, "GPU").input_value() == "NVIDIA H200 (hopper)"
    page.locator(".js-plotly-plot").first.wait_for(state="visible")
    assert page.locator(".js-plotly-plot .scatterlayer .trace").count() >= 4  # the frontier + one per format
    assert page.get_by_test_id("stDataFrame").count() == 2  # the H200's table and the cross-GPU matrix
    assert "Recommended: int4" in page.get_by_test_id("stAlert").first.inner_text()
    assert page.get_by_text("Which quant on which GPU", exact=False).is_visible()
    shoot(page, "which-quant")


def test_the_history_toggle_puts_itself_in_the_url(page, server):
    page.goto(f"{server}/?gpu=NVIDIA+H200")
    settled(page)
    toggle = page.get_by_text("History: every kernel generation", exact=True)
    toggle.wait_for(state="visible")
    switch = page.get_by_role("switch", name="History: every kernel generation")
    assert "history=" not in page.url and not switch.is_checked()
    toggle.click()
    page.wait_for_url("**history=1**")
    settled(page)
    no_exception(page)
    page.reload()
    settled(page)
    assert switch.is_checked()


def test_changing_the_selector_changes_the_url(page, server):
    page.goto(f"{server}/?gpu=NVIDIA+H200")
    settled(page)
    selectbox(page, "GPU family").click()
    page.get_by_role("option", name="Blackwell").click()
    page.wait_for_url(lambda url: "family=blackwell" in url and "RTX+PRO+6000" in url, timeout=WAIT_MS)
    settled(page)
    no_exception(page)
    assert selectbox(page, "GPU").input_value() == "NVIDIA RTX PRO 6000 Blackwell (blackwell)"
    assert "Recommended: nvfp4-packed" in page.get_by_test_id("stAlert").first.inner_text()
    # The sidebar's page links keep the filter.
    page.get_by_test_id("stSidebarNav").get_by_text("Latency", exact=True).click()
    page.wait_for_url(lambda url: "/latency" in url, timeout=WAIT_MS)
    settled(page)
    no_exception(page)
    assert "family=blackwell" in page.url
    assert selectbox(page, "GPU").input_value() == "NVIDIA RTX PRO 6000 Blackwell (blackwell)"


@pytest.mark.parametrize("path, title, name", [
    ("latency", "Latency", "latency"),
    ("parity", "Parity detail", "parity"),
    ("runs", "Runs", "runs"),
])
def test_each_page_loads_in_the_browser(page, server, path, title, name):
    page.goto(f"{server}/{path}?gpu=NVIDIA+H200&variant=int4")
    settled(page)
    no_exception(page)
    assert page.get_by_role("heading", name=title, exact=True).is_visible()
    assert "gpu=NVIDIA+H200" in page.url  # the filter survives on every page
    if path != "runs":
        page.locator(".js-plotly-plot").first.wait_for(state="visible")
    shoot(page, name)


def test_a_run_written_while_the_dashboard_is_open_succeeds_and_appears(page, server, store):
    page.goto(f"{server}/runs")
    settled(page)
    no_exception(page)
    before = page.get_by_text("runs, ", exact=False).first.inner_text()
    t0 = time.monotonic()
    ds.append_run(store)  # what `quantbench run` does: a read-write connection on the file the page has read
    assert time.monotonic() - t0 < 5
    page.reload()
    settled(page)
    after = page.get_by_text("runs, ", exact=False).first.inner_text()
    n = len(ds.VARIANTS) + 2
    assert before.startswith(f"{n} runs") and after.startswith(f"{n + 1} runs")
