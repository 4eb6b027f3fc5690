"""The dashboard's media decisions in a real browser (Debian's chromium via Playwright): the parity page cut to one
modality shows the picture, the waveform or the video frames beside the variants' probabilities, and the report
page draws agreement per modality. Screenshots of those sections go to test-artifacts/screenshots (and to
$QUANTBENCH_SCREENSHOTS: docs/img holds them)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import dashboard_media_store as dms
from tests.streamlit_server import BROWSER_TESTS, WAIT_MS, dashboard
from tests.test_dashboard_browser import ROOT, no_exception

pytestmark = BROWSER_TESTS


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mediabrowser")
    store, _ = dms.build(root / "results.duckdb", root / "suite", spec_suite=True)
    with dashboard(store.path, root / "streamlit.log", "--server.address", "127.0.0.1",
                   "--client.toolbarMode", "viewer") as (url, _):
        yield url


def settled(page) -> None:
    page.locator('[data-testid="stMain"] h1').first.wait_for(state="visible")
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    page.locator(".js-plotly-plot").first.wait_for(state="visible")
    page.wait_for_timeout(500)


def shoot_section(page, name: str, start: str, end: str | None = None) -> None:
    """A screenshot of the main area from heading `start` to heading `end` (or the page's end): the part a
    reader of the README needs, small enough to commit."""
    height = page.evaluate('document.querySelector("[data-testid=stMain]").scrollHeight')
    page.set_viewport_size({"width": 1400, "height": height})
    page.wait_for_timeout(1500)  # plotly and the data grid redraw at the new size
    main = page.get_by_test_id("stMain").bounding_box()
    top = page.get_by_role("heading", name=start, exact=True).bounding_box()["y"] - 16
    bottom = (page.get_by_role("heading", name=end, exact=True).bounding_box()["y"] - 16 if end
              else main["y"] + height)
    x = page.get_by_role("heading", name=start, exact=True).bounding_box()["x"] - 24
    clip = {"x": x, "y": top, "width": main["x"] + main["width"] - x - 16, "height": bottom - top}
    dirs = [ROOT / "test-artifacts" / "screenshots"]
    if os.environ.get("QUANTBENCH_SCREENSHOTS"):
        dirs.append(ROOT / os.environ["QUANTBENCH_SCREENSHOTS"])
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(d / f"{name}.png"), clip=clip)


def parity(page, server: str, modality: str) -> None:
    page.goto(f"{server}/parity?gpu=cpu&variant={dms.VISION_BROKEN}&modality={modality}")
    settled(page)
    no_exception(page)
    page.get_by_role("heading", name="Media decisions where the variants disagree").scroll_into_view_if_needed()
    page.wait_for_timeout(800)


def test_an_image_decision_shows_the_picture_and_the_breakdown(page, server):
    parity(page, server, "image")
    assert page.get_by_role("heading", name="By modality", exact=True).is_visible()
    assert page.get_by_text("Worse than BF16 beyond the margin on image", exact=False).is_visible()
    pictures = page.locator('[data-testid="stImage"] img')
    assert pictures.count() == 1
    assert pictures.first.evaluate("img => img.naturalWidth") == 256  # the 64 px picture, enlarged 4x
    assert page.get_by_text("state.camera: image 64×64").is_visible()
    assert page.locator(".js-plotly-plot").filter(has_text="probability per option").count() == 1
    shoot_section(page, "dashboard-modality-breakdown", "By modality", "Agreement by the reference's confidence")
    shoot_section(page, "dashboard-media-image", "Media decisions where the variants disagree")


def test_an_audio_decision_draws_its_waveform(page, server):
    parity(page, server, "audio")
    assert page.locator(".js-plotly-plot").filter(has_text="state.microphone: audio").count() == 1
    assert page.locator("audio").count() == 1
    shoot_section(page, "dashboard-media-audio", "Media decisions where the variants disagree")


def test_a_video_decision_shows_its_frames_side_by_side(page, server):
    parity(page, server, "video")
    frames = page.locator('[data-testid="stImage"] img')
    assert frames.count() == 4
    boxes = [frames.nth(i).bounding_box() for i in range(4)]
    assert len({round(b["y"]) for b in boxes}) == 1 and [b["x"] for b in boxes] == sorted(b["x"] for b in boxes)
    shoot_section(page, "dashboard-media-video", "Media decisions where the variants disagree")


def test_the_report_page_draws_agreement_per_modality(page, server):
    page.goto(f"{server}/?gpu=cpu")
    settled(page)
    no_exception(page)
    chart = page.locator(".js-plotly-plot").filter(has_text="Agreement with BF16 per modality")
    chart.wait_for(state="visible")
    assert chart.locator(".scatterlayer .trace").count() == 5  # one per modality
    shoot_section(page, "dashboard-report-modality", f"{dms.MODEL} on CPU (ci-runner)",
                  f"{dms.MODEL}: the recommendation on every GPU")
