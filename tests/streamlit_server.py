"""`streamlit run dashboard` from this checkout in a subprocess, and Debian's chromium to look at it: for the tests
that need a real server or a real browser (the `browser` and `page` fixtures are in conftest.py)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The marks of every browser test module: `pytestmark = BROWSER_TESTS`.
BROWSER_TESTS = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="chromium is not installed (apt-get install -y chromium); the browser tests need it"),
]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
WAIT_MS = 60_000
VIEWPORT = {"width": 1600, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dashboard(db: Path, log: Path, *extra: str, cwd: Path = ROOT) -> Iterator[tuple[str, subprocess.Popen]]:
    """(its URL, its process) once it answers /_stcore/health, over the store `db`; `extra` are streamlit's own
    arguments (none: it listens where dashboard/.streamlit/config.toml says); `cwd`: where `streamlit run` is
    started (the checkout's dashboard/ is named by its full path). Stopped, and killed if it must, on exit."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard"), "--server.headless", "true",
             "--server.port", str(port), "--browser.gatherUsageStats", "false", *extra],
            cwd=cwd, env={**os.environ, "QUANTBENCH_DB": str(db)}, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not come up (exit {proc.poll()}); see {log}")
                time.sleep(0.3)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
