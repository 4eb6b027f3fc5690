"""The load generator behind `quantbench load`: drives any SystemOne server (quantbench's own or another engine's)
over HTTP and measures, per step, decisions/s, end-to-end p50/p99, queue time and batch where the server reports
them (quantbench's: the X-Quantbench-Queue-Ms and X-Quantbench-Batch headers), errors by status, and where
throughput stops rising (quantbench.analysis.load).

    settings = LoadSettings(endpoint="http://127.0.0.1:8000", concurrency=[1, 8, 32, 128], requests=512)
    result = run_load(settings)          # ConfigError at once when nothing answers at the endpoint
    Store(db).write_load(...)            # cli/load.py stores it: quantbench.store.load

Two modes, each bounded by `requests` per step and `seconds` per step, whichever comes first:
  closed loop: N clients, each with one request in flight, sending the next when its answer comes (a concurrency
               sweep: how throughput and latency grow with N);
  open loop:   Poisson arrivals at a mean rate, sent whatever the answers do (what a server does at an offered
               load it may not keep up with).

The package, one responsibility a module (each imports only those listed before it):
    requests.py  the request bodies (a suite's records, or the card's example) and the server's /healthz
    http.py      one keep-alive HTTP/1.1 connection: a prebuilt request out, its response read
    client.py    sending: one timed request (Sample), a closed-loop step, an open-loop step
    driver.py    the generator's processes: one step on one process's connections, or split over several
    steps.py     a step's summary from its samples (percentiles, errors, queue, batch, overhead, Server-Timing)
    generator.py LoadSettings, run_load: the steps in order, the saturation point, the records to store

The names below are imported when first used: a generator worker process imports driver.py and what it needs,
not the generator's store and machine detection.
"""

from typing import Any

__all__ = ["LoadResult", "LoadSettings", "run_load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from quantbench.load import generator

        return getattr(generator, name)
    raise AttributeError(f"module 'quantbench.load' has no attribute {name!r}")
