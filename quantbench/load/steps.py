"""One step's figures from its samples: what `load_steps` stores and the table prints."""

from __future__ import annotations

from collections import Counter
from statistics import fmean

from quantbench.load.client import Sample
from quantbench.store.load import LoadStepRecord


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(step: int, samples: list[Sample], duration_s: float, *, concurrency: int | None = None,
              rate: float | None = None, cpu_s: float | None = None) -> LoadStepRecord:
    """The step's record: throughput over its wall time, end-to-end percentiles of the answered requests, errors
    by status, and the server's queue, model time and batch where it reported them. The overhead is end to end
    minus queue and model time, per request that reported both: what HTTP, parsing, tokenizing and the hops
    between threads cost (the client's own share included). `cpu_s`: the generator's own CPU time in the step;
    near the wall time, the generator (one Python process) was the limit, not the server; with several generator
    processes, the busiest one's."""
    ok = [s for s in samples if s.status == "200"]
    failed = [s for s in samples if s.status != "200"]
    ms = [s.ms for s in ok]
    queue = [s.queue_ms for s in ok if s.queue_ms is not None]
    model = [s.model_ms for s in ok if s.model_ms is not None]
    batch = [s.batch for s in ok if s.batch is not None]
    overhead = [s.ms - s.queue_ms - s.model_ms for s in ok if s.queue_ms is not None and s.model_ms is not None]
    duration_s = max(duration_s, 1e-9)
    return LoadStepRecord(
        step=step, concurrency=concurrency, rate=rate, sent=len(samples), ok=len(ok),
        errors=dict(sorted(Counter(s.status for s in failed).items())), duration_s=duration_s,
        offered_per_s=len(samples) / duration_s, decisions_per_s=len(ok) / duration_s,
        p50_ms=percentile(ms, 0.5), p90_ms=percentile(ms, 0.9), p99_ms=percentile(ms, 0.99),
        mean_ms=fmean(ms) if ms else None, error_p50_ms=percentile([s.ms for s in failed], 0.5),
        queue_p50_ms=percentile(queue, 0.5), queue_p99_ms=percentile(queue, 0.99),
        model_p50_ms=percentile(model, 0.5), overhead_p50_ms=percentile(overhead, 0.5),
        # per forward pass, not per request: a pass of b requests answered b of them, so passes = sum(1 / b)
        mean_batch=len(batch) / sum(1.0 / b for b in batch) if batch else None,
        client_cpu=None if cpu_s is None else cpu_s / duration_s,
    )


def timing_breakdown(samples: list[Sample]) -> dict[str, float]:
    """Where an answered request's time went, by the server's Server-Timing (medians in ms): each span it reported
    (quantbench's: read, prepare, queue, forward, app: its handler's whole time), `e2e` on the client,
    `outside` = end to end - app (HTTP, the network and the client) and `other` = app - read - prepare - queue -
    forward (the hand-offs between threads, the response). Empty when the server sent no Server-Timing."""
    timed = [s for s in samples if s.status == "200" and s.timing]
    if not timed:
        return {}
    names = list(dict.fromkeys(name for s in timed for name in s.timing))  # type: ignore[union-attr]
    out = {name: percentile([s.timing[name] for s in timed if name in s.timing], 0.5) for name in names}  # type: ignore[index,operator]
    out["e2e"] = percentile([s.ms for s in timed], 0.5)
    with_app = [s for s in timed if "app" in s.timing]  # type: ignore[operator]
    if with_app:
        out["outside"] = percentile([s.ms - s.timing["app"] for s in with_app], 0.5)  # type: ignore[index]
        parts = ("read", "prepare", "queue", "forward")
        whole = [s.timing for s in with_app if all(p in s.timing for p in parts)]  # type: ignore[operator]
        if whole:  # per request, then the median: medians of the parts do not add up to the whole's
            out["other"] = percentile([t["app"] - sum(t[p] for p in parts) for t in whole], 0.5)
    return {k: v for k, v in out.items() if v is not None}
