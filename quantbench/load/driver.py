"""The generator's processes: a `Driver` runs steps on its own event loop and connections, in this process or, with
`processes` > 1, one in each of that many worker processes, the step's clients (or its arrival rate) and its
request count split between them, started together and merged into one step.

One Python process sending and reading HTTP tops out at a few thousand requests a second on a fast core and far fewer
on a slow one; at 128 clients the single-process generator used 97-99% of a core on the H200 host, so its step
measured the generator as much as the server (docs/BENCHMARKS.md). Each process reports its own CPU time, and the
busiest one's share of a core is the step's `client_cpu`: near 100%, the generator was the limit."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import dataclass, field, replace
from typing import Any

from quantbench.load.client import Pool, Sample, closed_loop, open_loop
from quantbench.load.http import Target

START_MARGIN_S = 0.05  # the processes are told to start a step this far ahead, so that they start together
WORKER_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StepPlan:
    """One step for one process: `concurrency` clients (closed loop) or arrivals at `rate` (open loop)."""

    concurrency: int | None
    rate: float | None
    count: int  # requests to send at most
    seconds: float
    offset: int = 0  # where in the request bodies to begin (round robin)
    seed: int = 0
    start_at: float = 0.0  # time.monotonic() at which to begin (0: at once)


@dataclass
class StepRun:
    samples: list[Sample]
    start: float  # time.monotonic()
    end: float  # when its last answer had been read
    cpu_s: list[float] = field(default_factory=list)  # each process's CPU time in the step


@dataclass(frozen=True)
class DriverSettings:
    url: str  # the full /v1/systemone URL
    requests: list[bytes]  # prebuilt HTTP requests, round robin
    timeout_s: float
    honor_retry_after: bool


class Driver:
    """One process's part: its event loop, its connections, its steps."""

    def __init__(self, settings: DriverSettings):
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.pool = Pool(Target.from_url(settings.url))

    def warm(self, count: int, seconds: float) -> None:
        """Untimed requests at one client: a connection, and the server's first-call costs."""
        self.step(StepPlan(concurrency=1, rate=None, count=count, seconds=seconds))

    def step(self, plan: StepPlan) -> StepRun:
        s = self.settings
        if plan.start_at:
            time.sleep(max(0.0, plan.start_at - time.monotonic()))
        cpu0 = time.process_time()
        if plan.rate is not None:
            run = open_loop(self.pool, s.requests, rate=plan.rate, count=plan.count, seconds=plan.seconds,
                            timeout_s=s.timeout_s, seed=plan.seed, offset=plan.offset)
        else:
            run = closed_loop(self.pool, s.requests, concurrency=plan.concurrency or 1, count=plan.count,
                              seconds=plan.seconds, timeout_s=s.timeout_s, offset=plan.offset,
                              honor_retry_after=s.honor_retry_after)
        samples, start = self.loop.run_until_complete(run)
        end = max((x.done_at for x in samples), default=start)
        return StepRun(samples, start, end, [time.process_time() - cpu0])

    def close(self) -> None:
        self.pool.close()
        self.loop.run_until_complete(asyncio.sleep(0))  # let the transports close
        self.loop.close()


def _worker(conn: Any, settings: DriverSettings) -> None:
    """A worker process: a Driver answering the plans that come down its pipe until None."""
    driver = Driver(settings)
    conn.send("ready")
    try:
        while (message := conn.recv()) is not None:
            kind, plan = message
            if kind == "warm":
                driver.warm(*plan)
                conn.send(None)
            else:
                conn.send(driver.step(plan))
    finally:
        driver.close()


def split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal whole shares, the larger first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def plans_for(plan: StepPlan, processes: int) -> list[StepPlan]:
    """The step for each process: its share of the clients (none for a process beyond them), of the requests
    (in proportion), and of the arrival rate (a sum of independent Poisson arrivals is Poisson at the summed
    rate); each its own seed and its own place in the request bodies."""
    if plan.rate is not None:
        counts = split(plan.count, processes)
        shares = [(None, plan.rate / processes, c) for c in counts]
    else:
        clients = split(plan.concurrency or 1, processes)
        total = sum(clients)
        counts = split(plan.count, total)  # a share per client, then summed per process
        shares, at = [], 0
        for c in clients:
            shares.append((c, None, sum(counts[at:at + c])))
            at += c
    out, offset = [], plan.offset
    for i, (concurrency, rate, count) in enumerate(shares):
        out.append(replace(plan, concurrency=concurrency, rate=rate, count=count, offset=offset,
                           seed=plan.seed * 1000 + i))
        offset += count
    return out


class Drivers:
    """`processes` worker processes driving one server together (spawned: the generator's own state is not
    copied into them)."""

    def __init__(self, settings: DriverSettings, processes: int):
        context = multiprocessing.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(processes):
            ours, theirs = context.Pipe()
            proc = context.Process(target=_worker, args=(theirs, settings), daemon=True)
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)
        for pipe in self.pipes:
            if not pipe.poll(WORKER_START_TIMEOUT_S) or pipe.recv() != "ready":
                self.close()
                raise RuntimeError("a load generator process did not start")

    def warm(self, count: int, seconds: float) -> None:
        for pipe in self.pipes:
            pipe.send(("warm", (max(1, count // len(self.pipes)), seconds)))
        for pipe in self.pipes:
            pipe.recv()

    def step(self, plan: StepPlan) -> StepRun:
        plans = plans_for(replace(plan, start_at=time.monotonic() + START_MARGIN_S), len(self.pipes))
        busy = [(pipe, p) for pipe, p in zip(self.pipes, plans, strict=True) if p.count and (p.concurrency or p.rate)]
        for pipe, p in busy:
            pipe.send(("step", p))
        runs: list[StepRun] = [pipe.recv() for pipe, _ in busy]
        samples = [s for run in runs for s in run.samples]
        return StepRun(samples, min(r.start for r in runs), max(r.end for r in runs),
                       [c for r in runs for c in r.cpu_s])

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
