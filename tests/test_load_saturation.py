"""What `quantbench load` says about saturation: one step cannot show where throughput stops rising (it says so, and
which steps to add, never "throughput still rose"); a step at which the server refused requests (503 / 429) is named
as refusing load; a sweep still rising at its last step, and one that saturated, read as before."""

from __future__ import annotations

from typer.testing import CliRunner

from quantbench.analysis.load import saturation, saturation_cell, step_saturation
from quantbench.cli import app as cli_app
from quantbench.load.table import load_run_markdown, saturation_line
from quantbench.server import create_app
from quantbench.store.load import LoadStepRecord
from tests.test_http_backend import ThreadServer
from tests.test_load import tiny_loaded


def one_line(text: str) -> str:
    return " ".join(text.split())


def step(i: int, clients: int, per_s: float, sent: int = 600, errors: dict[str, int] | None = None,
         rate: float | None = None) -> LoadStepRecord:
    refused = sum((errors or {}).values())
    return LoadStepRecord(step=i, concurrency=None if rate else clients, rate=rate, sent=sent, ok=sent - refused,
                          errors=errors or {}, duration_s=sent / per_s, offered_per_s=per_s, decisions_per_s=per_s)


def test_one_step_that_the_server_mostly_refused_says_it_was_refusing_load_not_that_throughput_rose():
    # the QA run: --concurrency 128 --requests 600 --no-retry-after, 536 answered 503 (shed.queue_full 536)
    sat = step_saturation([step(0, 128, 183.5, errors={"503": 536})])
    line = saturation_line(sat, "closed")
    assert "still rose" not in line and "not reached" not in line
    assert line == ("one step only (128 clients, 183.5 decisions/s): one step cannot show where throughput stops "
                    "rising; the server refused 536 of 600 requests at 128 clients (536 × 503): it was refusing "
                    "load there (saturated, or shedding load); add smaller steps, e.g. --concurrency 1,8,32,128")
    assert saturation_cell(sat, "closed") == "one step: cannot tell; refusing load at 128 clients"


def test_one_step_without_refusals_asks_for_smaller_and_larger_steps():
    line = saturation_line(saturation([8.0], [71.6]), "closed")
    assert line == ("one step only (8 clients, 71.6 decisions/s): one step cannot show where throughput stops "
                    "rising; add smaller and larger steps, e.g. --concurrency 1,2,8,32")
    assert saturation_line(saturation([1.0], [56.3]), "closed").endswith("add larger steps, e.g. --concurrency 1,4")
    assert saturation_line(saturation([40.0], [38.2]), "open").startswith(
        "one step only (40 requests/s offered, 38.2 decisions/s)")
    assert "still rose" not in saturation_line(saturation([40.0], [38.2]), "open")


def test_a_sweep_still_rising_at_its_last_step_reads_as_not_reached_unless_the_server_refused_there():
    rising = step_saturation([step(0, 1, 10.0), step(1, 8, 40.0), step(2, 32, 80.0)])
    assert saturation_line(rising, "closed") == ("peak 80.0 decisions/s at the last step (32 clients): throughput "
                                                 "still rose, so saturation was not reached; add a larger step")
    assert saturation_cell(rising, "closed") == "not reached (throughput still rose)"
    shedding = step_saturation([step(0, 1, 10.0), step(1, 8, 40.0), step(2, 32, 80.0, errors={"503": 40})])
    line = saturation_line(shedding, "closed")
    assert "not reached" not in line and "add a larger step" not in line
    assert line == ("peak 80.0 decisions/s at the last step (32 clients), where throughput still rose; the server "
                    "refused 40 of 600 requests at 32 clients (40 × 503): it was refusing load there (saturated, "
                    "or shedding load)")


def test_a_saturated_sweep_names_its_point_and_where_the_server_refused_requests():
    steps = [step(0, 1, 56.3), step(1, 8, 71.6), step(2, 32, 95.1, errors={"503": 3}),
             step(3, 128, 66.1, errors={"503": 238, "429": 2})]
    line = saturation_line(step_saturation(steps), "closed")
    assert line == ("saturation at 32 clients (peak 95.1 decisions/s); at 128 clients throughput kept 70% of the "
                    "peak; the server refused 3 of 600 requests at 32 clients (3 × 503) and 240 of 600 at 128 "
                    "clients (2 × 429, 238 × 503): it was refusing load there (saturated, or shedding load)")
    # without the steps' errors (a saturation of loads and throughput alone), as it read before
    assert saturation_line(saturation([1, 8, 32, 128], [56.3, 71.6, 95.1, 66.1]), "closed") == (
        "saturation at 32 clients (peak 95.1 decisions/s); at 128 clients throughput kept 70% of the peak")


def test_stored_markdown_of_one_step_adds_the_refusals_from_its_steps():
    import datetime as dt

    run = {"load_id": "x", "created_at": dt.datetime(2026, 12, 4, tzinfo=dt.UTC), "host": "h", "mode": "closed",
           "endpoint": "http://127.0.0.1:8765", "requests_from": "quantbench-default-v1"}
    steps = [step(0, 128, 183.5, errors={"503": 536})]
    text = load_run_markdown(run, steps, saturation([128.0], [183.5]))
    assert "the server refused 536 of 600 requests at 128 clients (536 × 503): it was refusing load there" in text


def test_quantbench_load_of_one_step_against_a_shedding_server_says_it_refused_load(tmp_path):
    loaded = tiny_loaded(forward_s=0.3)
    with ThreadServer(create_app(lambda: loaded, max_batch=2, max_queue=2)) as server:
        done = CliRunner().invoke(cli_app, ["load", "--endpoint", server.url, "--concurrency", "8", "--requests",
                                            "24", "--warmup", "0", "--no-retry-after", "--no-store"])
    assert done.exit_code == 0, done.output
    text = one_line(done.output)
    assert "one step only (8 clients, " in text and "one step cannot show where throughput stops rising" in text
    assert "of 24 requests at 8 clients (" in text and "× 503): it was refusing load there" in text
    assert "still rose" not in text and "saturation was not reached" not in text
