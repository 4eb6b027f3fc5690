"""The dashboard's media decisions in a real browser (Debian's chromium via Playwright): the parity page cut to one
modality shows the picture, the waveform or the video frames beside the variants' probabilities, and the report
page draws agreement per modality. Screenshots go to test-artifacts/screenshots (and $QUANTBENCH_SCREENSHOTS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import dashboard_media_store as dms
from tests.streamlit_server import CHROMIUM, WAIT_MS, dashboard
from tests.test_dashboard_browser import no_exception, shoot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="chromium is not installed (apt-get install -y chromium); the browser tests need it"),
]


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
    shoot(page, "parity-image")


def test_an_audio_decision_draws_its_waveform(page, server):
    parity(page, server, "audio")
    if page.get_by_text("Every variant gives BF16's top answer", exact=False).count():
        pytest.skip("no audio question flipped in this store")
    assert page.locator(".js-plotly-plot").filter(has_text="state.microphone: audio").count() == 1
    assert page.locator("audio").count() == 1
    shoot(page, "parity-audio")


def test_a_video_decision_shows_its_frames_side_by_side(page, server):
    parity(page, server, "video")
    frames = page.locator('[data-testid="stImage"] img')
    assert frames.count() == 4
    boxes = [frames.nth(i).bounding_box() for i in range(4)]
    assert len({round(b["y"]) for b in boxes}) == 1 and [b["x"] for b in boxes] == sorted(b["x"] for b in boxes)
    shoot(page, "parity-video")


def test_the_report_page_draws_agreement_per_modality(page, server):
    page.goto(f"{server}/?gpu=cpu")
    settled(page)
    no_exception(page)
    chart = page.locator(".js-plotly-plot").filter(has_text="Agreement with BF16 per modality")
    chart.wait_for(state="visible")
    assert chart.locator(".scatterlayer .trace").count() == 5  # one per modality
    shoot(page, "report-modality")
