"""`streamlit run dashboard` listens on this machine only, wherever it is started (dashboard/.streamlit/config.toml,
which Streamlit reads beside the app's script), unless told otherwise on the command line."""

from __future__ import annotations

from pathlib import Path

import psutil

from tests.streamlit_server import dashboard

ROOT = Path(__file__).resolve().parent.parent


def listening(extra: list[str], tmp_path: Path, cwd: Path = ROOT) -> set[str]:
    """The addresses a dashboard started with `extra` arguments from `cwd` listens on, once it answers."""
    with dashboard(tmp_path / "none.duckdb", tmp_path / "streamlit.log", *extra, cwd=cwd) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        return {c.laddr.ip for c in psutil.Process(proc.pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_dashboard_binds_to_localhost_by_default(tmp_path):
    assert listening([], tmp_path) == {"127.0.0.1"}


def test_the_dashboard_binds_to_localhost_when_started_outside_the_checkout(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".streamlit").mkdir(parents=True)  # a working folder that asks for every interface
    (elsewhere / ".streamlit" / "config.toml").write_text('[server]\naddress = "0.0.0.0"\n')
    assert listening([], tmp_path, cwd=elsewhere) == {"127.0.0.1"}
    assert listening([], tmp_path, cwd=tmp_path) == {"127.0.0.1"}  # and one with no config of its own


def test_the_dashboard_binds_to_every_interface_when_told(tmp_path):
    assert listening(["--server.address", "0.0.0.0"], tmp_path) == {"0.0.0.0"}


def test_the_dashboard_sends_no_usage_statistics(tmp_path):
    """`streamlit run dashboard` printed "Collecting usage statistics" and had the browser report to a third party:
    the dashboard's own config turns that off wherever it is started."""
    import tomllib

    config = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert config["browser"]["gatherUsageStats"] is False
