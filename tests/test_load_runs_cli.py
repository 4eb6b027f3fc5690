"""`quantbench load-runs`: stored load runs printed back, as a table or as markdown for a README."""

from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.store import Store
from tests.test_transfer import write_load_runs


def test_a_stored_load_run_prints_as_markdown_with_its_steps_and_saturation(tmp_path):
    db = Store(tmp_path / "r.duckdb")
    first, second = write_load_runs(db, "client-box", n=2)
    done = CliRunner().invoke(app, ["load-runs", first[:30], "--format", "markdown", "--db", str(db.path)])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0] == ("#### load on http://10.0.0.7:8000 (synthetic-qwen3-30b-a3b int4 quantbench grouped-moe "
                        "gluon-wgmma-int4 +cuda-graph, NVIDIA H200), closed loop, requests from quantbench-default-v1")
    assert f"Load run {first}, 2026-11-29 19:00 UTC, generator on client-box (quantbench 0.1.0)." in lines
    assert "| clients | sent | decisions/s | p50 / p99 ms | queue p50 / p99 ms | forward p50 ms | overhead p50 ms | " \
           "mean batch | client CPU | errors |" in lines
    assert "| 1 | 400 | 95.1 | 17.6 / 20.1 | 0.0 / — | — | — | 0.50 | — | none |" in lines
    assert "| 32 | 400 | 93.1 | 563.2 / 643.2 | 0.2 / — | — | — | 16.00 | — | 38 × 503 |" in lines
    # the saturation, and where the server refused requests (from the steps' errors)
    assert ("saturation at 1 client (peak 95.1 decisions/s); at 32 clients throughput kept 98% of the peak; the "
            "server refused 38 of 400 requests at 32 clients (38 × 503): it was refusing load there (saturated, or "
            "shedding load)." in lines)
    assert second not in done.stdout  # only the one asked for

    table = CliRunner().invoke(app, ["load-runs", "--db", str(db.path)])
    assert table.exit_code == 0 and first in table.stdout and second in table.stdout


def test_load_runs_says_what_is_missing(tmp_path):
    db = Store(tmp_path / "r.duckdb")
    db.migrate()
    done = CliRunner().invoke(app, ["load-runs", "--db", str(db.path)])
    assert done.exit_code == 2 and "no load runs in" in done.stderr and "quantbench load --endpoint URL" in done.stderr
    write_load_runs(db, "client-box", n=1)
    done = CliRunner().invoke(app, ["load-runs", "0000", "--db", str(db.path)])
    assert done.exit_code == 2 and "load id '0000': no stored load runs match" in " ".join(done.stderr.split())
    done = CliRunner().invoke(app, ["load-runs", "--format", "html", "--db", str(db.path)])
    assert done.exit_code == 2 and "--format 'html': use table or markdown" in done.stderr
