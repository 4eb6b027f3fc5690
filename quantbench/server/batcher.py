"""The micro-batcher: requests queue and are answered in groups, one forward pass per group on a single worker
thread, with the server's metrics and the memory the forward passes leave behind given back to the OS.

Admission comes first (`admit`, before a request is parsed or tokenized): past `max_queue` admitted requests
(being prepared, queued or answered) a request is refused at once, so overload costs the server a counter check,
not a tokenization. An admitted request that waits in the queue longer than `max_queue_ms` before its forward pass
is refused then (QueueTimeout: 503), so an admitted request's wait is bounded. A batch takes every queued request
(up to `max_batch`) and, while requests already admitted are still being prepared, waits a little for them
(at most half a mean forward pass): under saturation batches stay full instead of shrinking to what the preparing
thread happened to finish; with one client there is nothing being prepared, so nothing waits."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from quantbench.limits import DEFAULT_MAX_REQUEST_TOKENS
from quantbench.protocol import DecisionResponse
from quantbench.run.backend import LoadedVariant

log = logging.getLogger("quantbench.server")  # the whole server logs under one name (app.py uses it too)

DEFAULT_MAX_BATCH = 16
# 0: a batch is whatever queued while the previous forward pass ran. Measured with benchmarks/serve_load.py on
# the fixture: waiting 5 ms for company cost 1 client ~5 ms and bought no throughput at 4 or 16 clients.
DEFAULT_MAX_WAIT_MS = 0.0
DEFAULT_MAX_QUEUE = 64
# An admitted request that has waited this long in the queue is refused (503 with Retry-After) instead of answered
# late. The queue bound alone already bounds the wait (a full queue is max_queue / max_batch forward passes deep:
# 4 with the defaults, ~50 ms at the 30B shape on an H200); this deadline is the backstop for slow forward passes
# (a CPU's take seconds), and `--max-queue-ms` makes it a latency objective.
DEFAULT_MAX_QUEUE_MS = 10000.0
# The longest a batch waits for requests already admitted but still being parsed and tokenized (also at most
# half the mean forward pass): the preparing thread turns a request around in about a millisecond.
FILL_WAIT_MAX_S = 0.02


@dataclass
class Answered:
    response: DecisionResponse
    batch: int  # requests in the forward pass that answered this one
    queue_ms: float  # from queued to the start of that forward pass


@dataclass
class Metrics:
    answered: int = 0
    batches: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    rejected: Counter[int] = field(default_factory=Counter)  # status -> count
    dropped: Counter[str] = field(default_factory=Counter)  # why -> requests dropped before their forward pass
    forward_ms_total: float = 0.0
    shed: Counter[str] = field(default_factory=Counter)  # why -> requests refused with 503 under load
    memory_trims: int = 0
    memory_trim_ms_total: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "answered": self.answered,
            "batches": self.batches,
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "max_batch_seen": max(self.batch_sizes, default=0),
            "mean_batch": (sum(k * v for k, v in self.batch_sizes.items()) / self.batches)
            if self.batches
            else 0.0,
            "rejected": {str(k): v for k, v in sorted(self.rejected.items())},
            "dropped": dict(sorted(self.dropped.items())),
            "forward_ms_total": round(self.forward_ms_total, 3),
            "shed": dict(sorted(self.shed.items())),
            "memory_trims": self.memory_trims,
            "memory_trim_ms_total": round(self.memory_trim_ms_total, 3),
        }


class QueueFull(Exception):
    """`max_queue` requests are admitted already: refused before any work."""


class QueueTimeout(Exception):
    """An admitted request waited in the queue past `max_queue_ms` before its forward pass began."""

    def __init__(self, waited_ms: float):
        super().__init__(f"waited {waited_ms:.0f} ms in the queue")
        self.waited_ms = waited_ms


# The server's RSS grew from 0.58 to 2.0 GB over 300 varied requests on the fixture, and glibc's malloc_trim took
# it back to 1.20 GB, where it stayed over 150 more (then 2.09 -> 1.19 GB): not a leak, but memory the forward
# passes of ever-changing shapes freed and malloc kept (docs/BENCHMARKS.md). So the worker gives it back: after a
# batch that leaves the queue empty (at most once a second), and after every TRIM_EVERY_BATCHES under load.
TRIM_MIN_INTERVAL_S = 1.0
TRIM_EVERY_BATCHES = 64


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0): free heap memory back to the OS. None where there is no glibc (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def padded_tokens(prepared: Any, engine: Any) -> tuple[int, int]:
    """(sequences, longest sequence) of a prepared request: its forward pass computes over their product."""
    rows = getattr(prepared, "rows", None)
    if isinstance(rows, list) and rows:
        return len(rows), max(len(r) for r in rows)
    return 1, int(engine.tokens(prepared))


@dataclass
class _Job:
    prepared: Any  # what engine.prepare made of the request
    rows: int
    width: int
    future: asyncio.Future[Answered]
    queued_at: float
    expiry: asyncio.TimerHandle | None = None  # refuses the request at its queue deadline, unless it has started
    started: bool = False


class MicroBatcher:
    """Collects concurrent requests and answers each group in one forward pass on a single worker thread.

    A group holds at most `max_batch` requests and `max_batch_tokens` padded tokens (sequences x longest), so
    a batch of large requests costs no more memory than one request at the limit. Requests are parsed and
    tokenized on another thread (`prepare`), never the model's."""

    def __init__(
        self,
        loaded: LoadedVariant,
        *,
        max_batch: int,
        max_wait_ms: float,
        max_queue: int,
        metrics: Metrics,
        max_batch_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
        max_queue_ms: float = DEFAULT_MAX_QUEUE_MS,
    ):
        self.engine, self.model_id = loaded.engine, loaded.info.model_id
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.max_queue_s = max_queue_ms / 1000.0  # 0: no queue deadline
        self.max_batch_tokens = max_batch_tokens
        self.metrics = metrics
        self.pending = 0  # admitted: being prepared, queued or being answered
        self.preparing = 0  # admitted, not yet queued
        self.forwards = 0  # forward passes answered (warm-up ones included: the kernel report reads this)
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._held: _Job | None = None  # taken from the queue but over the token budget of the batch it met
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="quantbench-model")
        self._prep = ThreadPoolExecutor(1, thread_name_prefix="quantbench-prepare")
        self._task: asyncio.Task[None] | None = None
        self._trim = malloc_trim()
        self._trimmed_at, self._trimmed_batches = float("-inf"), 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def prepare(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `fn(*args)` (parse, validate, tokenize) on the preparing thread."""
        return asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    def admit(self) -> None:
        """Take a place for a request about to be prepared, or raise QueueFull at once. Every admitted request
        is then either `submit`ted or `release`d."""
        if self.pending >= self.max_queue:
            raise QueueFull
        self.pending += 1
        self.preparing += 1

    def release(self) -> None:
        """Give back the place of an admitted request that will not be queued (bad input, client gone)."""
        self.pending -= 1
        self.preparing -= 1

    def submit(self, prepared: Any) -> asyncio.Future[Answered]:
        """Queue an admitted, prepared request; its future is its answer. Cancel the future to drop the request
        (a client that went away, a deadline passed): it is then skipped, not computed."""
        self.preparing -= 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answered] = loop.create_future()
        rows, width = padded_tokens(prepared, self.engine)
        job = _Job(prepared, rows, width, future, time.perf_counter())
        if self.max_queue_s:
            job.expiry = loop.call_later(self.max_queue_s, self._expire, job)
        self._queue.put_nowait(job)
        return future

    def _expire(self, job: _Job) -> None:
        """At its queue deadline: a request whose forward pass has not begun is refused (it stays in the queue,
        done, and is skipped there)."""
        if not job.started and not job.future.done():
            self.metrics.shed["queue_deadline"] += 1
            job.future.set_exception(QueueTimeout((time.perf_counter() - job.queued_at) * 1000.0))

    async def _next(self, timeout: float | None) -> _Job | None:
        """The next job whose request is still wanted (None: none within `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if not self._queue.empty():
                job = self._queue.get_nowait()
            elif deadline is None:
                job = await self._queue.get()
            else:
                left = deadline - loop.time()
                if left <= 0:
                    return None
                try:
                    job = await asyncio.wait_for(self._queue.get(), left)
                except TimeoutError:
                    return None
            if job.future.done():  # cancelled by its handler: the client left or the deadline passed
                self.pending -= 1
                continue
            return job

    async def _collect(self) -> list[_Job]:
        loop = asyncio.get_running_loop()
        first, self._held = self._held, None
        if first is None or first.future.done():
            if first is not None:
                self.pending -= 1
            first = await self._next(None)
        jobs = [first]
        rows, width = first.rows, first.width
        start = loop.time()
        deadline, fill_until = start + self.max_wait_s, start + self._fill_wait_s()
        while len(jobs) < self.max_batch:
            if self.preparing and self._queue.empty():
                # requests admitted and still being prepared: worth a short wait under load (never at one client)
                deadline = max(deadline, fill_until)
            job = await self._next(max(0.0, deadline - loop.time()))
            if job is None:
                break
            if (rows + job.rows) * max(width, job.width) > self.max_batch_tokens:
                self._held = job  # first in the next batch
                break
            jobs.append(job)
            rows, width = rows + job.rows, max(width, job.width)
        return jobs

    def _fill_wait_s(self) -> float:
        """How long a batch may wait for requests already admitted: half a mean forward pass, at most
        FILL_WAIT_MAX_S (0 before the first forward pass, whose time is not known)."""
        if not self.metrics.batches:
            return 0.0
        return min(FILL_WAIT_MAX_S, 0.5 * self.metrics.forward_ms_total / 1000.0 / self.metrics.batches)

    async def _run(self) -> None:
        while True:
            jobs = await self._collect()
            try:
                await self._answer_jobs(jobs)
            except Exception as e:  # never let one batch stop the loop: fail its requests and go on
                log.exception("answering a batch of %d failed", len(jobs))
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(e)
            finally:
                self.pending -= len(jobs)
            await self._release_memory()

    async def _release_memory(self) -> None:
        if self._trim is None:
            return
        idle = self._queue.empty() and self._held is None
        if not (
            (idle and time.monotonic() - self._trimmed_at >= TRIM_MIN_INTERVAL_S)
            or self.metrics.batches - self._trimmed_batches >= TRIM_EVERY_BATCHES
        ):
            return
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(self._worker, self._trim)
        self.metrics.memory_trims += 1
        self.metrics.memory_trim_ms_total += (time.perf_counter() - t0) * 1000.0
        self._trimmed_at, self._trimmed_batches = time.monotonic(), self.metrics.batches

    async def _answer_jobs(self, jobs: list[_Job]) -> None:
        live = [j for j in jobs if not j.future.done()]  # a client that went away is not answered
        for job in live:
            job.started = True  # past its queue deadline from here on: the forward pass has begun
            if job.expiry is not None:
                job.expiry.cancel()
        if not live:
            return
        start = time.perf_counter()
        results = await asyncio.get_running_loop().run_in_executor(
            self._worker, self._answer, [j.prepared for j in live]
        )
        for job, result in zip(live, results, strict=True):
            if job.future.done():
                continue
            result.queue_ms = (start - job.queued_at) * 1000.0
            job.future.set_result(result)

    def _answer(self, prepared: list[Any]) -> list[Answered]:
        """Runs on the worker thread: one forward pass for all the prepared requests. What the pass replays (a CUDA
        graph of its padded shape) is made ready first, outside its time, as `run` does."""
        warm = getattr(self.engine, "warm", None)
        if warm is not None:
            warm(prepared)
        t0 = time.perf_counter()
        answers = self.engine.forward_many(prepared)
        self.engine.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        self.forwards += 1
        self.metrics.batches += 1
        self.metrics.batch_sizes[len(prepared)] += 1
        self.metrics.forward_ms_total += ms
        return [
            Answered(
                DecisionResponse(model=self.model_id, answers=a, model_ms=ms, tokens=self.engine.tokens(p)),
                batch=len(prepared),
                queue_ms=0.0,
            )
            for p, a in zip(prepared, answers, strict=True)
        ]

    async def drain(self, timeout_s: float) -> None:
        """Wait for queued and running requests (graceful shutdown), then stop the loop and the workers."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._task:
            self._task.cancel()
        self._worker.shutdown(wait=True)
        self._prep.shutdown(wait=True, cancel_futures=True)
