"""Load test of `quantbench serve`: requests/s and client-side p50 / p99 latency at 1, 4 and 16 clients.

    python benchmarks/serve_load.py                       # serves the embedded fixture (bf16 backend) itself
    python benchmarks/serve_load.py --endpoint http://127.0.0.1:8000 --clients 1,8,32

Requests are the built-in suite's, sent through the http backend's engine (`forward_many` keeps N requests in
flight, each timed end to end on the client). The server's /metrics tells how many requests shared each forward
pass. On a small machine the clients compete with the server for the same cores: say so beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from backends.http import HttpBackend
from quantbench.protocol.suite import load_suite
from quantbench.run.spec import RunSpec
from quantbench.server import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAIT_MS

ROOT = Path(__file__).resolve().parents[1]
SERVE = (
    "import sys; from quantbench.server import cli_serve; "
    "sys.exit(cli_serve({model!r}, {backend!r}, port={port}, max_batch={max_batch}, max_wait_ms={max_wait_ms}))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str | None, backend: str, log: Path, **settings: float
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    code = SERVE.format(model=model, backend=backend, port=port, **settings)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env
    )
    return proc, f"http://127.0.0.1:{port}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def measure(endpoint: str, clients: int, requests: list, n: int, api_key: str | None) -> dict[str, float]:
    loaded = HttpBackend().load(
        RunSpec(backend="http", endpoint=endpoint, concurrency=clients, api_key=api_key), None
    )
    engine = loaded.engine
    try:
        warm = [engine.prepare(r) for r in requests[: max(8, 2 * clients)]]
        engine.forward_many(warm)  # warm the connections and the model
        before = httpx.get(endpoint + "/metrics", headers=_auth(api_key), timeout=30).json()
        prepared = [engine.prepare(requests[i % len(requests)]) for i in range(n)]
        t0 = time.perf_counter()
        engine.forward_many(prepared)
        wall = time.perf_counter() - t0
        after = httpx.get(endpoint + "/metrics", headers=_auth(api_key), timeout=30).json()
    finally:
        engine.close()
    ms = [p.client_ms for p in prepared]
    batches = after.get("batches", 0) - before.get("batches", 0)
    answered = after.get("answered", 0) - before.get("answered", 0)
    return {
        "clients": clients,
        "requests": n,
        "wall_s": wall,
        "rps": n / wall,
        "p50_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 0.99),
        "server_ms_p50": statistics.median(p.server_ms for p in prepared),
        "mean_batch": answered / batches if batches else float("nan"),
        "retries": sum(p.retries for p in prepared),
    }


def wait_healthy(
    endpoint: str, api_key: str | None, proc: subprocess.Popen | None, timeout_s: float = 600
) -> dict:
    """/healthz once it answers 200; fails at once if the server this script started has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}; see its log")
        try:
            r = httpx.get(endpoint + "/healthz", headers=_auth(api_key), timeout=10)
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{endpoint}/healthz did not answer 200 within {timeout_s:.0f} s")


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--endpoint", help="an already running SystemOne server (default: start `quantbench serve`)"
    )
    ap.add_argument("--backend", default="bf16", help="backend of the server this script starts")
    ap.add_argument(
        "--model", default=None, help="checkpoint dir of the server this script starts (default: fixture)"
    )
    ap.add_argument("--clients", default="1,4,16", help="comma-separated client counts")
    ap.add_argument(
        "--requests", type=int, default=0, help="requests per client count (default: max(64, 16 x clients))"
    )
    ap.add_argument(
        "--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="of the server this script starts"
    )
    ap.add_argument(
        "--max-wait-ms", type=float, default=DEFAULT_MAX_WAIT_MS, help="of the server this script starts"
    )
    ap.add_argument("--api-key", default=os.environ.get("QUANTBENCH_API_KEY"))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()

    proc = None
    endpoint = args.endpoint
    if endpoint is None:
        log = Path(os.environ.get("TMPDIR", "/tmp")) / "serve_load_server.log"
        proc, endpoint = start_server(
            args.model, args.backend, log, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms
        )
        print(
            f"started quantbench serve --backend {args.backend} at {endpoint} (log: {log})", file=sys.stderr
        )
    try:
        requests = [r.request for r in load_suite(None).records]
        rows = []
        health = wait_healthy(endpoint, args.api_key, proc)
        for clients in (int(c) for c in args.clients.split(",")):
            n = args.requests or max(64, 16 * clients)
            rows.append(measure(endpoint, clients, requests, n, args.api_key))
            print(f"  {clients} clients: {rows[-1]['rps']:.1f} req/s", file=sys.stderr)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

    print(
        f"server: {health.get('model')} ({health.get('variant')}, {health.get('kernel_path')}) on "
        f"{health.get('gpu')}, max_batch {health.get('max_batch')}, max_wait_ms {health.get('max_wait_ms')}"
    )
    base = rows[0]
    print(
        f"{'clients':>7} {'requests':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'fwd p50':>8} "
        f"{'batch':>6} {'req/s ×':>8} {'p50 ×':>6}"
    )
    for r in rows:
        print(
            f"{r['clients']:>7} {r['requests']:>8} {r['rps']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['server_ms_p50']:>8.1f} {r['mean_batch']:>6.2f} {r['rps'] / base['rps']:>8.2f} "
            f"{r['p50_ms'] / base['p50_ms']:>6.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
