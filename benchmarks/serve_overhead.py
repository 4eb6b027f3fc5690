"""Serving overhead and behaviour under load with a fake engine of fixed forward time (no model time to hide in).

    python benchmarks/serve_overhead.py --forward-ms 12.5 --concurrency 1,8,32,128 --requests 400

Starts `quantbench.server.create_app` in its own process on a free loopback port, serving the embedded fixture's
real engine for everything but the forward pass: requests are parsed, checked and tokenized for real, and the
forward pass is a sleep of --forward-ms that answers every question with uniform probabilities (a sleep releases
the GIL, as a GPU wait does). Then drives it with `quantbench load` (quantbench.load.run_load, closed loop) and
prints, per step, decisions/s, end-to-end p50 / p99, the server's queue and forward time, the overhead (end to end
minus queue minus forward), the mean batch per forward pass and the refusals. The ceiling is max_batch / forward
time (16 / 12.5 ms = 1,280 decisions/s): what is lost below it is the server's (and this client's) Python.
`--server-path DIR` serves another checkout's quantbench (e.g. the one before a change), for a before/after (the
client is always this checkout's). Then a second table: per step, where an answered request's time went by the
server's Server-Timing (read, prepare, queue, forward, the handler in all, and outside it: HTTP and the client) and
the server's CPU per request. `--processes N` splits the clients over N generator processes; `--no-retry-after`
has refused clients send again at once instead of waiting out Retry-After; `--max-queue-ms` sets the server's.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]

SERVER = """
import sys, time
import torch
torch.set_num_threads(1)
from quantbench.protocol import QuestionAnswer
from quantbench.run.backend import get_backend
from quantbench.run.machine import detect
from quantbench.run.spec import RunSpec
from quantbench.run.resolve import resolve
from quantbench.server import create_app, serve

port, forward_ms, max_batch, max_queue = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
settings = {"max_queue_ms": float(sys.argv[5])} if len(sys.argv) > 5 else {}

def load():
    spec = resolve(RunSpec(backend="bf16", device="cpu"))
    loaded = get_backend("bf16").load(spec, detect())
    def fixed(batch):
        time.sleep(forward_ms / 1000.0)  # the forward pass: a fixed time, the GIL released as on a GPU wait
        return [{rd.question: QuestionAnswer(top=rd.options[0], probabilities={o: 1.0 / len(rd.options)
                                             for o in rd.options}, method=rd.method, truncated=rd.truncated)
                 for rd in p.readers} for p in batch]
    loaded.engine.forward_many = fixed
    return loaded

app = create_app(load, max_batch=max_batch, max_queue=max_queue, **settings)
sys.exit(serve(app, "127.0.0.1", port, log_level="warning"))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--forward-ms", type=float, default=12.5)
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--server-path", type=Path, default=ROOT, help="the checkout whose quantbench serves")
    ap.add_argument("--max-queue-ms", type=float, default=None, help="the server's --max-queue-ms (its default: unset)")
    ap.add_argument("--processes", type=int, default=1, help="load generator processes")
    ap.add_argument("--no-retry-after", action="store_true", help="refused clients send again at once")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from rich.console import Console

    from quantbench.load import LoadSettings, run_load
    from quantbench.load.table import breakdown_table, saturation_line, steps_table

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "serve_overhead_server.log"
    env = {**os.environ, "PYTHONPATH": str(args.server_path.resolve())}
    argv = [str(port), str(args.forward_ms), str(args.max_batch), str(args.max_queue)]
    if args.max_queue_ms is not None:
        argv.append(str(args.max_queue_ms))
    proc = subprocess.Popen([sys.executable, "-c", SERVER, *argv], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env=env, cwd=args.server_path)  # `python -c` puts its cwd first on sys.path
    server = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 600
        while True:  # the port opens once the server's imports are done (the model loads behind /healthz 503)
            assert proc.poll() is None and time.monotonic() < deadline, f"the server did not start; see {log}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        settings = LoadSettings(endpoint=f"http://127.0.0.1:{port}",
                                concurrency=[int(c) for c in args.concurrency.split(",")], requests=args.requests,
                                seconds=args.seconds, warmup=16, ready_timeout_s=600, processes=args.processes,
                                honor_retry_after=not args.no_retry_after)
        while httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code != 200:  # loaded
            time.sleep(0.2)
        cpu = [sum(server.cpu_times()[:2])]  # the server's CPU (all its threads) at the end of each step

        def step_done(step) -> None:
            cpu.append(sum(server.cpu_times()[:2]))

        t0 = time.monotonic()
        result = run_load(settings, on_step=step_done)
        wall = time.monotonic() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    con = Console(width=1000 if not sys.stdout.isatty() else None)
    con.print(steps_table(result.steps, f"fake engine, forward {args.forward_ms:g} ms, max_batch {args.max_batch}, "
                                        f"max_queue {args.max_queue}, server from {args.server_path}"))
    con.print(saturation_line(result.saturation, "closed"))
    cpu_ms = [(b - a) * 1000.0 / max(1, step.sent) for a, b, step in zip(cpu, cpu[1:], result.steps, strict=False)]
    con.print(breakdown_table(result.steps, result.breakdown, cpu_ms) or "(no Server-Timing from this server)")
    one = result.steps[0]
    if one.concurrency == 1 and one.p50_ms is not None:
        con.print(f"1 client: end to end p50 {one.p50_ms:.2f} ms for a {args.forward_ms:g} ms forward: "
                  f"{one.p50_ms - args.forward_ms:.2f} ms of serving overhead (server and client); "
                  f"overhead p50 (end to end - queue - forward, per request) {one.overhead_p50_ms:.2f} ms")
    con.print(f"({wall:.0f} s; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
