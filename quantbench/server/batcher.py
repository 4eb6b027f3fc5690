"""The micro-batcher: requests queue and are answered in groups, one forward pass per group on the model's own
thread, with the server's metrics and the memory the forward passes leave behind given back to the OS.

Admission comes first (`admit`, before a request is parsed or tokenized): past `max_queue` admitted requests
(being prepared, queued or answered), or when the queue's expected wait (the forward passes ahead of it, at the
recent forward time) is over `max_queue_ms`, a request is refused at once, so overload costs the server a counter
check, not a tokenization. An admitted request that still waits in the queue longer than `max_queue_ms` before its
forward pass is refused then (QueueTimeout: 503), so an admitted request's wait is bounded. A batch takes every
queued request (up to `max_batch`) and, while requests already admitted are still being prepared, waits a little for
them (at most half a mean forward pass): under saturation batches stay full instead of shrinking to what the
preparing thread happened to finish; with one client there is nothing being prepared, so nothing waits. It also
waits (at most 10 ms and a tenth of a forward pass) for the clients the previous pass just answered to come back,
a closed loop's next requests: without that, 8 clients on the H200 settled into alternating passes of 3 and 5
(87.9 decisions/s) or 7 and 1 (113.2) from one run to the next, each pass leaving behind the requests that
arrived during it. One client's own next request starts its pass at once.

Two thread hops a request, no more: the event loop puts a prepared request on the model thread's queue (which wakes
it), and the model thread hands the batch's answers back in one call (`call_soon_threadsafe`). The model thread
collects its batches itself, so no event-loop task stands between the queue and the forward pass (the asyncio
queue, task and executor this replaced cost ~0.5 ms a request in wake-ups on a busy 2-core VM: docs/BENCHMARKS.md).
Every counter is changed on the event loop only; the model thread reads them."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quantbench.limits import DEFAULT_MAX_REQUEST_TOKENS
from quantbench.protocol import DecisionResponse, non_finite_answer
from quantbench.run.backend import LoadedVariant
from quantbench.server.settings import (  # noqa: F401 - the batcher's defaults, declared with the settings
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_QUEUE_MS,
    DEFAULT_MAX_WAIT_MS,
)

log = logging.getLogger("quantbench.server")  # the whole server logs under one name (app.py uses it too)

# The longest a batch waits for requests already admitted but still being parsed and tokenized (also at most
# half the mean forward pass): the preparing thread turns a request around in about a millisecond.
FILL_WAIT_MAX_S = 0.02
# How long a batch waits for the requests the previous pass answered to be sent again (a closed loop's clients),
# when they and the queued ones would fill it further: at most RETURN_WAIT_MAX_S and RETURN_WAIT_SHARE of the
# recent forward pass. Once such a request is admitted it counts as being prepared (FILL_WAIT_MAX_S then applies).
RETURN_WAIT_MAX_S = 0.01
RETURN_WAIT_SHARE = 0.1
# The weight of the newest forward pass in the recent forward time that admission and Retry-After estimate with.
FORWARD_EWMA = 0.2


@dataclass
class Answered:
    body: bytes  # the DecisionResponse's JSON, serialized on the model thread
    batch: int  # requests in the forward pass that answered this one
    queue_ms: float  # from queued to the start of that forward pass
    forward_ms: float  # that forward pass
    error: str | None = None  # why this request's answer is no answer (a non-finite probability): a 500 instead


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
    """Refused at admission, before any work: `max_queue` requests are admitted already ("queue_full"), or the
    forward passes ahead of it would take longer than `max_queue_ms` ("expected_wait")."""

    def __init__(self, why: str, expected_ms: float = 0.0):
        super().__init__(why)
        self.why, self.expected_ms = why, expected_ms


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
    started: bool = False  # set by the model thread, under the batcher's lock, as its forward pass begins
    expired: bool = False  # set by the event loop, under the same lock, at its queue deadline


_STOP = object()  # put on the queue by `drain`: the model thread ends


@dataclass
class _Done:
    """What the model thread hands back to the event loop for one batch."""

    jobs: list[_Job]  # taken from the queue (each leaves `pending` now)
    live: list[_Job]  # those its forward pass answered
    answers: list[Answered] | None = None
    error: Exception | None = None
    forward_ms: float = 0.0


class MicroBatcher:
    """Collects concurrent requests and answers each group in one forward pass on the model's own thread.

    A group holds at most `max_batch` requests and `max_batch_tokens` padded tokens (sequences x longest), so
    a batch of large requests costs no more memory than one request at the limit. Large requests are parsed and
    tokenized on the preparation pool's threads (quantbench.server.prepare), never the model's."""

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
        self.forward_s: float | None = None  # the recent forward time (EWMA), None before the first
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a job's start (model thread) against its expiry (event loop)
        self._held: _Job | None = None  # taken from the queue but over the token budget of the batch it met
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._trim = malloc_trim()
        self._trimmed_at, self._batches_since_trim = float("-inf"), 0
        # the model thread's own: requests its last pass answered, and when it handed them back (perf_counter, the
        # clock of every time in a batch's collection: a job's queued_at, the waits' deadlines)
        self._returning, self._answered_at = 0, float("-inf")

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._work, name="quantbench-model", daemon=True)
        self._thread.start()

    # -- the event loop's side ---------------------------------------------------------------------------------
    def expected_wait_s(self, pending: int) -> float:
        """How long a request admitted behind `pending` others waits for its forward pass: the passes that answer
        them (max_batch a pass) at the recent forward time; 0 before the first pass (its time is not known)."""
        return math.ceil(pending / self.max_batch) * (self.forward_s or 0.0)

    def admit(self) -> None:
        """Take a place for a request about to be prepared, or raise QueueFull at once. Every admitted request
        is then either `submit`ted or `release`d."""
        if self.pending >= self.max_queue:
            raise QueueFull("queue_full")
        if self.max_queue_s and (wait := self.expected_wait_s(self.pending)) > self.max_queue_s:
            raise QueueFull("expected_wait", wait * 1000.0)
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
        self._queue.put(job)  # wakes the model thread if it waits
        return future

    def _expire(self, job: _Job) -> None:
        """At its queue deadline: a request whose forward pass has not begun is refused (it stays in the queue,
        done, and is skipped there)."""
        with self._lock:
            if job.started or job.future.done():
                return
            job.expired = True
        self.metrics.shed["queue_deadline"] += 1
        job.future.set_exception(QueueTimeout((time.perf_counter() - job.queued_at) * 1000.0))

    def _deliver(self, done: _Done) -> None:
        """On the event loop: a batch's answers (or its error) to its requests, and the counters."""
        self.pending -= len(done.jobs)
        for job in done.jobs:
            if job.expiry is not None:
                job.expiry.cancel()
        if done.answers is not None:
            self.forwards += 1
            self.metrics.batches += 1
            self.metrics.batch_sizes[len(done.live)] += 1
            self.metrics.forward_ms_total += done.forward_ms
            s = done.forward_ms / 1000.0
            self.forward_s = s if self.forward_s is None else self.forward_s + FORWARD_EWMA * (s - self.forward_s)
        for i, job in enumerate(done.live):
            if job.future.done():  # its client left, or its deadline passed, during the forward pass
                continue
            if done.error is not None:
                job.future.set_exception(done.error)
            else:
                job.future.set_result(done.answers[i])  # type: ignore[index]

    async def drain(self, timeout_s: float) -> None:
        """Wait for queued and running requests (graceful shutdown), then stop the model thread."""
        deadline = time.monotonic() + timeout_s
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join()

    # -- the model thread --------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            jobs = self._collect()
            if jobs is None:
                return
            with self._lock:  # from here a job's queue deadline no longer applies: its forward pass begins
                live = [j for j in jobs if not (j.expired or j.future.done())]
                for job in live:
                    job.started = True
            done = _Done(jobs, live)
            if live:
                try:
                    done.answers, done.forward_ms = self._answer(live)
                except Exception as e:  # never let one batch stop the thread: fail its requests and go on
                    log.exception("answering a batch of %d failed", len(live))
                    done.error = e
            # before the hand-back: a client's next request may be queued before this thread runs another line
            self._returning = len(live) if done.error is None else 0
            self._answered_at = time.perf_counter()
            try:
                self._loop.call_soon_threadsafe(self._deliver, done)  # type: ignore[union-attr]
            except RuntimeError:  # the event loop has closed: nobody waits for these answers
                return
            self._release_memory()

    def _collect(self) -> list[_Job] | None:
        """The next batch (blocking until a request comes), or None when `drain` stopped the thread. Requests
        already dropped (cancelled, expired) are taken too: they leave `pending` with the batch, uncomputed."""
        first, self._held = self._held, None
        # the requests the last pass answered, whose clients may send their next at once: a request queued since
        # those answers went back counts as one of them (one client: its own next request, no wait), one queued
        # before as another client's (it ran alongside the pass)
        return_until = self._answered_at + self._return_wait_s()
        if first is None:
            first = self._queue.get()
        if first is _STOP:
            return None
        jobs = [first]
        rows, width, live = first.rows, first.width, 0 if first.future.done() else 1
        back = live if first.queued_at >= self._answered_at else 0  # answered clients whose next request came
        start = time.perf_counter()
        deadline, fill_until = start + self.max_wait_s, start + self._fill_wait_s()
        while live < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                # requests admitted and still being prepared: worth a short wait under load (never at one client)
                until = max(deadline, fill_until) if self.preparing else deadline
                if back + self.preparing < self._returning:  # answered clients not back yet: a few ms for them
                    until = max(until, return_until)
                left = until - time.perf_counter()
                if left <= 0:
                    break
                try:
                    job = self._queue.get(timeout=left)
                except queue.Empty:
                    break
            if job is _STOP:
                self._queue.put(_STOP)  # answered first, then the thread ends
                break
            if job.future.done():  # cancelled by its handler, or expired: taken, not computed
                jobs.append(job)
                continue
            if live and (rows + job.rows) * max(width, job.width) > self.max_batch_tokens:
                self._held = job  # first in the next batch
                break
            if not live:
                rows, width = job.rows, job.width
            else:
                rows, width = rows + job.rows, max(width, job.width)
            jobs.append(job)
            live += 1
            back += job.queued_at >= self._answered_at
        return jobs

    def _fill_wait_s(self) -> float:
        """How long a batch may wait for requests already admitted: half the recent forward pass, at most
        FILL_WAIT_MAX_S (0 before the first forward pass, whose time is not known)."""
        return min(FILL_WAIT_MAX_S, 0.5 * (self.forward_s or 0.0))

    def _return_wait_s(self) -> float:
        """How long after a pass a batch may wait for its answered clients to send again (RETURN_WAIT_*; 0
        before the first forward pass)."""
        return min(RETURN_WAIT_MAX_S, RETURN_WAIT_SHARE * (self.forward_s or 0.0))

    def _answer(self, live: list[_Job]) -> tuple[list[Answered], float]:
        """One forward pass for all the prepared requests, and each one's response serialized. What the pass
        replays (a CUDA graph of its padded shape) is made ready first, outside its time, as `run` does."""
        prepared = [j.prepared for j in live]
        start = time.perf_counter()
        warm = getattr(self.engine, "warm", None)
        if warm is not None:
            warm(prepared)
        t0 = time.perf_counter()
        answers = self.engine.forward_many(prepared)
        self.engine.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
        out = []
        for job, a in zip(live, answers, strict=True):
            queue_ms = (start - job.queued_at) * 1000.0
            problem = next(filter(None, (non_finite_answer(q, answer) for q, answer in a.items())), None)
            if problem:  # serialized, NaN would read as null and the first option as top: refused instead
                out.append(Answered(b"", len(live), queue_ms, ms, error=problem))
                continue
            response = DecisionResponse(model=self.model_id, answers=a, model_ms=ms,
                                        tokens=self.engine.tokens(job.prepared))
            out.append(Answered(response.model_dump_json().encode(), len(live), queue_ms, ms))
        return out, ms

    def _release_memory(self) -> None:
        self._batches_since_trim += 1
        if self._trim is None:
            return
        idle = self._queue.empty() and self._held is None
        if not (
            (idle and time.monotonic() - self._trimmed_at >= TRIM_MIN_INTERVAL_S)
            or self._batches_since_trim >= TRIM_EVERY_BATCHES
        ):
            return
        t0 = time.perf_counter()
        self._trim()
        ms = (time.perf_counter() - t0) * 1000.0
        self._trimmed_at, self._batches_since_trim = time.monotonic(), 0
        try:
            self._loop.call_soon_threadsafe(self._count_trim, ms)  # type: ignore[union-attr]
        except RuntimeError:  # the event loop has closed
            pass

    def _count_trim(self, ms: float) -> None:
        self.metrics.memory_trims += 1
        self.metrics.memory_trim_ms_total += ms
