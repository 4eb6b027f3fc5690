"""`streamlit run dashboard` from a checkout listens on this machine only (.streamlit/config.toml), unless told."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.test_dashboard_browser import free_port

ROOT = Path(__file__).resolve().parent.parent


def listening(extra: list[str], tmp_path: Path) -> set[str]:
    """The addresses a dashboard started with `extra` arguments listens on, once it answers."""
    port = free_port()
    with (tmp_path / "streamlit.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "dashboard", "--server.headless", "true", "--server.port",
             str(port), "--browser.gatherUsageStats", "false", *extra],
            cwd=ROOT, env={**os.environ, "QUANTBENCH_DB": str(tmp_path / "none.duckdb")}, stdout=log,
            stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not come up (exit {proc.poll()}); see {log.name}")
                time.sleep(0.3)
            return {c.laddr.ip for c in psutil.Process(proc.pid).net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_the_dashboard_binds_to_localhost_by_default(tmp_path):
    assert listening([], tmp_path) == {"127.0.0.1"}


def test_the_dashboard_binds_to_every_interface_when_told(tmp_path):
    assert listening(["--server.address", "0.0.0.0"], tmp_path) == {"0.0.0.0"}
