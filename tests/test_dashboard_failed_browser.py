"""The dashboard in chromium over stores holding failed runs that quantbench itself made (no model id, no suite):
`streamlit run dashboard` in a subprocess, every page, no exception, the failures explained."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quantbench.run.machine import detect
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests import dashboard_store as ds
from tests.failing_backends import model_less_load_error
from tests.streamlit_server import BROWSER_TESTS, WAIT_MS, dashboard
from tests.test_dashboard_browser import no_exception, shoot

ROOT = Path(__file__).resolve().parent.parent
HERE = f"cpu:{detect().host}"
PAGES = [("", "Which quant should I use?"), ("latency", "Latency"), ("parity", "Parity detail"), ("runs", "Runs")]

pytestmark = BROWSER_TESTS


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> list:
    """A missing checkpoint's row as an older quantbench stored it, and, made for real, a run past its timeout and one
    whose child was SIGKILLed."""
    suite = tmp_path_factory.mktemp("suite") / "mini.jsonl"
    suite.write_text('{"id": "r0", "benchmark": "mini", "request": {"state": {"observation": "a wall"}, '
                     '"questions": {"q": {"type": "boolean"}}}}\n')
    machine = detect()
    kinds = [("bf16", {"model": "/nonexistent"}), ("tests.tiny:HangBackend", {"timeout_s": 3}),
             ("tests.failing_backends:KilledBackend", {})]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda k: execute(RunSpec(backend=k[0], suite=str(suite), gpu="cpu", **k[1]),
                                                      machine=machine, echo=False), kinds[1:]))
    # `run` now refuses a missing checkpoint in the parent and stores nothing: the row is an older store's.
    results.insert(0, model_less_load_error(RunSpec(backend="bf16", suite=str(suite), gpu="cpu", **kinds[0][1]),
                                            machine))
    assert [r.run.failure for r in results] == ["load_error", "timeout", "killed"]
    return results


def serve(db: Path, log: Path) -> Iterator[str]:
    with dashboard(db, log, "--client.toolbarMode", "viewer") as (url, _):
        yield url


@pytest.fixture(scope="module")
def mixed_server(failed, tmp_path_factory) -> Iterator[str]:
    """The test store (three machines, every variant) plus this host's failed runs."""
    d = tmp_path_factory.mktemp("mixed")
    store = ds.build(d / "results.duckdb")
    for r in failed:
        store.write_run(r)
    yield from serve(store.path, d / "streamlit.log")


@pytest.fixture(scope="module")
def failed_server(failed, tmp_path_factory) -> Iterator[str]:
    """A store holding only one failed run without a model id (`quantbench run --model /nonexistent`)."""
    d = tmp_path_factory.mktemp("failed")
    store = Store(d / "results.duckdb")
    store.write_run(failed[0])
    yield from serve(store.path, d / "streamlit.log")


def open_page(page, url: str, title: str) -> None:
    page.goto(url)
    page.locator('[data-testid="stMain"] h1').first.wait_for(state="visible")
    page.get_by_role("combobox", name="GPU", exact=True).wait_for(state="visible")
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    page.wait_for_timeout(300)
    no_exception(page)
    assert page.locator('[data-testid="stMain"] h1').first.inner_text().strip() == title


def test_every_page_of_a_machine_whose_runs_all_failed_explains_them(page, mixed_server):
    for path, title in PAGES:
        open_page(page, f"{mixed_server}/{path}?gpu={HERE}", title)
        assert page.get_by_role("combobox", name="Model", exact=True).count() == 0
        if path != "runs":
            assert page.get_by_text("failed before loading a model").count() == 1, path
        if path == "":
            shoot(page, "failed-runs-machine")
    for path, title in PAGES:  # the default view (the newest GPU) beside them
        open_page(page, f"{mixed_server}/{path}", title)


def test_a_store_of_one_failed_run_shows_the_every_run_failed_notice(page, failed_server):
    for path, title in PAGES:
        open_page(page, f"{failed_server}/{path}", title)
    open_page(page, failed_server, PAGES[0][1])
    assert page.get_by_text("nothing to compare").count() == 1
    shoot(page, "failed-runs-only")
