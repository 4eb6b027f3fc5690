"""Abuse test of `quantbench serve`: what one oversized request costs the server and everyone else.

    python benchmarks/serve_limits.py                     # serves the embedded fixture (bf16) itself on 127.0.0.1
    python benchmarks/serve_limits.py --requests 2000 --json /tmp/limits.json
    python benchmarks/serve_limits.py --serve-arg=--max-questions=20000 ...   # extra flags for the server

Starts `quantbench serve` (the real CLI) on a free loopback port and measures, with real HTTP clients:

1. `questions`: one 0.3 MB body with 10,000 yes/no questions. Its status and time, the server's peak RSS while it is
   handled, and the wait of another client whose small request is sent 0.5 s after it (and the same request's
   time with nothing else running).
2. `near_limit_*`: bodies just under the 4 MiB body limit that are refused (422/413): one question with ~180,000
   options, ~40,000 questions, a 4 MB state. Time to the refusal each.
3. `rss`: the server's RSS over `--requests` valid requests of varied shape (seeded) from 4 clients, sampled
   every 250 requests; then after /metrics says all were answered.

Every request has a client timeout (`--timeout`), every loop a count: the script ends even when the server
does not. The server's RSS is read from /proc/PID/status (Linux).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from quantbench.server import DEMO_REQUEST

ROOT = Path(__file__).resolve().parents[1]
PATH = "/v1/systemone"
CARD = DEMO_REQUEST  # the reference card's curl example


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} for pid {pid}")


class RssSampler:
    """Peak RSS of a process over a window, sampled every 50 ms in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, rss_bytes(pid), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, RuntimeError):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def many_questions(n: int) -> dict:
    return {
        "state": {"observation": "The player is facing a wall."},
        "questions": {f"q{i}": {"type": "boolean"} for i in range(n)},
    }


def timed_post(client: httpx.Client, body: bytes) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    try:
        r = client.post(PATH, content=body, headers={"Content-Type": "application/json"})
        status, text = r.status_code, r.text[:200]
    except httpx.HTTPError as e:
        status, text = -1, f"{type(e).__name__}: {e}"
    return status, time.perf_counter() - t0, text


def big_request(url: str, pid: int, timeout: float, n: int) -> dict:
    body = json.dumps(many_questions(n)).encode()
    before = rss_bytes(pid)
    with httpx.Client(base_url=url, timeout=timeout) as big, httpx.Client(base_url=url, timeout=timeout) as other:
        other.post(PATH, json=CARD)  # connection warm: the other client's wait is the server's, not a handshake
        _, alone_s, _ = timed_post(other, json.dumps(CARD).encode())  # the same request with nothing else running
        with RssSampler(pid) as sampler, ThreadPoolExecutor(1) as pool:
            future = pool.submit(timed_post, big, body)
            time.sleep(0.5)
            other_status, other_s, _ = timed_post(other, json.dumps(CARD).encode())
            status, seconds, text = future.result()
    return {
        "body_bytes": len(body), "questions": n, "status": status, "seconds": round(seconds, 3),
        "answer": text, "rss_before_gb": round(before / 1e9, 3), "rss_peak_gb": round(sampler.peak / 1e9, 3),
        "other_status": other_status, "other_wait_s": round(other_s, 3), "other_alone_s": round(alone_s, 3),
    }


def near_limit_bodies(limit: int = 4 << 20) -> dict[str, bytes]:
    def fill(make, lo: int, hi: int) -> bytes:  # the largest body under the limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if len(make(mid)) < limit else (lo, mid)
        return make(lo)

    def options(k: int) -> bytes:
        crit = {f"tool_{i}": "x" for i in range(k)}
        return json.dumps({"state": {"o": "wall"}, "questions": {"q": {"type": "choice", "criteria": crit}}}).encode()

    def questions(k: int) -> bytes:
        qs = {f"q{i}": {"type": "boolean"} for i in range(k)}
        qs["last"] = {"type": "ranking"}  # the one bad question comes last: all the others are validated first
        return json.dumps({"state": {"o": "wall"}, "questions": qs}).encode()

    def state(k: int) -> bytes:
        return json.dumps({"state": {"o": "w " * k}, "questions": {"q": {"type": "boolean"}}}).encode()

    return {
        "options": fill(options, 1, 1 << 20),
        "questions": fill(questions, 1, 1 << 20),
        "state": fill(state, 1, 1 << 22),
    }


def near_limit(url: str, timeout: float) -> dict:
    out = {}
    with httpx.Client(base_url=url, timeout=timeout) as client:
        for name, body in near_limit_bodies().items():
            status, seconds, text = timed_post(client, body)
            out[name] = {"body_bytes": len(body), "status": status, "seconds": round(seconds, 3), "answer": text}
            print(f"  near limit, {name}: {status} in {seconds:.2f} s", file=sys.stderr)
    return out


def varied_request(rng: random.Random) -> dict:
    words = "the player sees a wall door key enemy potion river bridge".split()
    questions = {}
    for q in range(rng.randint(1, 4)):
        if rng.random() < 0.3:
            questions[f"q{q}"] = {"type": "boolean"}
        else:
            k = rng.randint(2, 8)
            questions[f"q{q}"] = {"type": "choice", "criteria": {f"opt{j}": rng.choice(words) for j in range(k)}}
    state = {"observation": " ".join(rng.choice(words) for _ in range(rng.randint(5, 300))), "hp": rng.randint(0, 99)}
    return {"state": state, "questions": questions}


def rss_over_requests(url: str, pid: int, n: int, timeout: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    bodies = [json.dumps(varied_request(rng)).encode() for _ in range(n)]
    samples = [(0, rss_bytes(pid))]
    statuses: dict[int, int] = {}
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=timeout, limits=httpx.Limits(max_connections=4)) as client:
        with ThreadPoolExecutor(4) as pool:
            for start in range(0, n, 250):
                for status, _, _ in pool.map(lambda b: timed_post(client, b), bodies[start : start + 250]):
                    statuses[status] = statuses.get(status, 0) + 1
                samples.append((min(start + 250, n), rss_bytes(pid)))
    wall = time.perf_counter() - t0
    for count, rss in samples:
        print(f"  after {count:>5} requests: RSS {rss / 1e9:.3f} GB", file=sys.stderr)
    return {"requests": n, "statuses": statuses, "wall_s": round(wall, 1),
            "rss_gb": [(c, round(r / 1e9, 3)) for c, r in samples]}


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode}; see its log")
        try:
            r = httpx.get(url + "/healthz", timeout=10)
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url}/healthz did not answer 200 within {timeout_s:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint dir (default: the embedded fixture)")
    ap.add_argument("--backend", default="bf16")
    ap.add_argument("--questions", type=int, default=10_000, help="questions in the one big request")
    ap.add_argument("--requests", type=int, default=2_000, help="valid requests of the RSS phase (0: skip it)")
    ap.add_argument("--timeout", type=float, default=300.0, help="client timeout of every request, seconds")
    ap.add_argument("--only", default="questions,near_limit,rss", help="comma-separated phases to run")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `quantbench serve` flag (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "quantbench", "serve", "--backend", args.backend, "--host", "127.0.0.1",
           "--port", str(port), *(["--model", args.model] if args.model else []), *args.serve_arg]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "serve_limits_server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    print(f"started {' '.join(cmd[2:])} (pid {proc.pid}, log {log})", file=sys.stderr)
    phases = set(args.only.split(","))
    result: dict = {"command": " ".join(cmd[2:])}
    try:
        health = wait_healthy(url, proc)
        result["server"] = {k: health.get(k) for k in ("model", "variant", "kernel_path", "gpu")}
        result["rss_idle_gb"] = round(rss_bytes(proc.pid) / 1e9, 3)
        if "questions" in phases:
            result["questions"] = big_request(url, proc.pid, args.timeout, args.questions)
            print(f"  {args.questions} questions: {json.dumps(result['questions'])}", file=sys.stderr)
        if "near_limit" in phases:
            result["near_limit"] = near_limit(url, args.timeout)
        if "rss" in phases and args.requests:
            result["rss"] = rss_over_requests(url, proc.pid, args.requests, args.timeout)
        result["rss_hwm_gb"] = round(rss_bytes(proc.pid, "VmHWM") / 1e9, 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
