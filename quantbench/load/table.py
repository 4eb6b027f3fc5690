"""The tables of a load run: one row per step, as `quantbench load` prints it (rich; to a file or a pipe it keeps
its natural width) and as `quantbench load-runs --format markdown` prints a stored one (for a README or a card)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from rich.table import Table

from quantbench.analysis.load import Saturation, saturation_sentence, step_saturation
from quantbench.store.load import LoadStepRecord


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def rate_text(per_s: float) -> str:
    """Decisions a second: one decimal, or three significant digits below 1 (a CPU at the real shape)."""
    return f"{per_s:,.1f}" if per_s >= 1 or per_s == 0 else f"{per_s:.3g}"


COLUMNS = ("sent", "decisions/s", "p50 / p99 ms", "queue p50 / p99 ms", "forward p50 ms", "overhead p50 ms",
           "mean batch", "client CPU", "errors")


def _header(steps: list[LoadStepRecord]) -> list[str]:
    return ["rate /s" if any(s.rate is not None for s in steps) else "clients", *COLUMNS]


def _cells(s: LoadStepRecord, open_loop: bool) -> list[str]:
    errors = ", ".join(f"{n} × {status}" for status, n in s.errors.items()) or "none"
    queue = "—" if s.queue_p50_ms is None else f"{_ms(s.queue_p50_ms)} / {_ms(s.queue_p99_ms)}"
    return [
        f"{s.rate:g}" if open_loop else str(s.concurrency), str(s.sent), rate_text(s.decisions_per_s),
        f"{_ms(s.p50_ms)} / {_ms(s.p99_ms)}", queue, _ms(s.model_p50_ms), _ms(s.overhead_p50_ms),
        "—" if s.mean_batch is None else f"{s.mean_batch:.2f}",
        "—" if s.client_cpu is None else f"{s.client_cpu:.0%}",
        errors + ("" if s.error_p50_ms is None else f" (p50 {_ms(s.error_p50_ms)} ms)"),
    ]


def steps_table(steps: list[LoadStepRecord], title: str) -> Table:
    """Load, sent, decisions/s, end-to-end p50 / p99, queue p50 / p99, forward p50, overhead p50, mean batch, errors."""
    t = Table(title=title, title_justify="left")
    header = _header(steps)
    for col in header:
        t.add_column(col, justify="left" if col == "errors" else "right")
    for s in steps:
        t.add_row(*_cells(s, header[0] == "rate /s"))
    return t


def run_title(run: Mapping[str, Any]) -> str:
    """What a load run measured: the endpoint, the server as its /healthz named itself, the loop, the requests."""
    server = " ".join(str(run[k]) for k in ("server_model", "server_variant", "server_kernel_path") if run.get(k))
    return (f"load on {run['endpoint']} ({server or 'no /healthz'}, {run.get('server_gpu') or 'device unknown'}), "
            f"{run['mode']} loop, requests from {run['requests_from']}")


def load_run_markdown(run: Mapping[str, Any], steps: list[LoadStepRecord], sat: Saturation) -> str:
    """One stored load run as markdown: its title, when and from where, the steps table and the saturation
    (with the steps' refusals: 503s and 429s)."""
    header = _header(steps)
    lines = [f"#### {run_title(run)}", "",
             f"Load run {run['load_id']}, {run['created_at'].astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC, generator on "
             f"{run['host']} "
             f"(quantbench {run.get('quantbench_version') or 'version unknown'}).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cells(s, header[0] == "rate /s")) + " |" for s in steps]
    if steps and not sat.refusals:  # a saturation of loads and throughput alone: add the steps' refusals
        sat = step_saturation(steps)
    return "\n".join([*lines, "", saturation_line(sat, run["mode"]) + ".", ""])


def saturation_line(sat: Saturation, mode: str) -> str:
    """One sentence: where throughput stopped rising and what was kept beyond it, where the server refused
    requests, or why one step (or a sweep still rising at its last step) cannot say
    (quantbench.analysis.load.saturation_sentence)."""
    return saturation_sentence(sat, mode)


SPANS = ("read", "prepare", "queue", "forward", "app", "outside", "e2e")


def breakdown_table(steps: list[LoadStepRecord], breakdown: list[dict[str, float]],
                    server_cpu_ms: list[float] | None = None) -> Table | None:
    """Per step, where an answered request's time went (medians, ms) by the server's Server-Timing: read,
    prepare, queue, forward, app (its handling in all), outside (end to end - app: HTTP, the network, the client),
    end to end, and `handler other` (app less the four spans: the hand-offs between the event loop and the model
    thread, the response); with `server_cpu_ms`, the server's CPU per request. None without Server-Timing."""
    if not any(breakdown):
        return None
    t = Table(title="where an answered request's time went (medians, ms; from the server's Server-Timing)",
              title_justify="left")
    columns = [_header(steps)[0], *SPANS, "handler other"] + (["server CPU / request"] if server_cpu_ms else [])
    for col in columns:
        t.add_column(col, justify="right")
    for i, (step, b) in enumerate(zip(steps, breakdown, strict=True)):
        row = [f"{step.rate:g}" if step.rate is not None else str(step.concurrency),
               *(f"{b[k]:.3f}" if k in b else "—" for k in (*SPANS, "other"))]
        if server_cpu_ms:
            row.append(f"{server_cpu_ms[i]:.2f}" if i < len(server_cpu_ms) else "—")
        t.add_row(*row)
    return t
