"""Preparing requests off the event loop: a bounded pool of threads in two lanes, each job cancellable.

Preparing a request (parsing, checking, reading its media's headers, decoding them, tokenizing, the processor) is
work the event loop must never do: a 1.1 KB WebP of 4096^2 decoded on it held every client for 0.6-2.5 s (issue
#33). So it runs here, on threads, and a request waits for it on the loop (`await job`):

    pool = PreparePool(light=2, heavy=1)
    job = pool.submit(parse_and_check, body, deadline=loop.time() + 60)   # on the light lane
    prepared = await job          # the last step's return value, or its exception
    job.cancel("the client disconnected")                                  # from the loop, at any time
    await pool.shutdown()

The lanes keep heavy work from holding up light work. A job starts on the light lane (or the heavy one with
`heavy=True`); a step that finds its request heavy (media that decode to many megabytes, a body of megabytes)
returns `Then(next_step, *args, heavy=True)`, and the pool runs `next_step` on the heavy lane, freeing its light
thread at once. So at most `heavy` threads decode big media at a time, however many such requests arrive, while
the `light` threads go on preparing the card-sized requests behind them; each lane is a FIFO.

Cancellation. A thread cannot be stopped from outside, so a job's steps run with its CancelToken current
(quantbench.protocol.cancel): the media decoders check it between frames and audio blocks, and the pool between
steps. `job.cancel(why)` (a deadline passed, the client went away) sets it: a step not yet started is skipped, a
running one stops at its next check (raising Cancelled, which the job's awaiter gets), and a `Then` is not
followed. The job's deadline cancels it by itself too, so a request that waited in a lane past its deadline is
never started. `cancelled` counts the jobs stopped this way (GET /metrics: `prepare`).

The pool knows nothing of HTTP or of the model: a step is any function. The server's endpoint submits its own
steps (quantbench.server.endpoint), and anything else that prepares ahead of the model thread (preparing the next
batch while the previous one runs) can submit its own.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from quantbench.protocol.cancel import Cancelled, CancelToken, working_for

DEFAULT_LIGHT_THREADS = 2  # this VM has 2 cores; parsing and tokenizing hold the GIL for most of their time
DEFAULT_HEAVY_THREADS = 1  # big media decode one at a time: bounded memory (each at most a request's budget)


class Then:
    """What a step returns to have `fn(*args)` run next for the same job, on the heavy lane when `heavy`."""

    __slots__ = ("args", "fn", "heavy")

    def __init__(self, fn: Callable[..., Any], *args: Any, heavy: bool = False):
        self.fn, self.args, self.heavy = fn, args, heavy


@dataclass
class PoolCounts:
    """What the pool did: steps run per lane, jobs cancelled before or while running, and what waits now."""

    steps: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    waiting: Counter[str] = field(default_factory=Counter)
    running: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": dict(self.steps), "cancelled": self.cancelled, "waiting": dict(self.waiting),
                "running": dict(self.running)}


class Job:
    """One request's preparation: await it for the result; cancel it from the event loop."""

    def __init__(self, pool: PreparePool, token: CancelToken, future: asyncio.Future[Any]):
        self.pool, self.token, self.future = pool, token, future

    def __await__(self) -> Generator[Any, None, Any]:
        return self.future.__await__()

    def cancel(self, why: str) -> None:
        """Stop the job: its next check raises Cancelled on its thread, and its awaiter gets CancelledError."""
        self.token.cancel(why)
        if not self.future.done():
            self.future.cancel()


class PreparePool:
    """`light` threads for every job's first step, `heavy` threads for the steps sent there (see the module)."""

    def __init__(self, light: int = DEFAULT_LIGHT_THREADS, heavy: int = DEFAULT_HEAVY_THREADS):
        if light < 1 or heavy < 1:
            raise ValueError("a preparation pool needs at least one light and one heavy thread")
        self._lanes = {
            "light": ThreadPoolExecutor(light, thread_name_prefix="quantbench-prepare"),
            "heavy": ThreadPoolExecutor(heavy, thread_name_prefix="quantbench-prepare-heavy"),
        }
        self.threads = {"light": light, "heavy": heavy}
        self.counts = PoolCounts()
        self._lock = threading.Lock()  # the counts, from the pool's threads
        self._jobs: weakref.WeakSet[Job] = weakref.WeakSet()  # jobs not yet settled: cancelled at shutdown

    def submit(self, fn: Callable[..., Any], *args: Any, heavy: bool = False, deadline: float | None = None,
               token: CancelToken | None = None) -> Job:
        """Run `fn(*args)` (and the `Then` steps it returns) for a new job; on the event loop. `deadline`: the
        event loop's time (loop.time()) past which the job is cancelled by itself."""
        loop = asyncio.get_running_loop()
        # asyncio's loop.time() is time.monotonic(), the clock a CancelToken's deadline is on
        job = Job(self, token or CancelToken(deadline), loop.create_future())
        self._jobs.add(job)
        job.future.add_done_callback(lambda _: self._jobs.discard(job))
        self._queue(job, Then(fn, *args, heavy=heavy), loop)
        return job

    def _queue(self, job: Job, step: Then, loop: asyncio.AbstractEventLoop) -> None:
        lane = "heavy" if step.heavy else "light"
        with self._lock:
            self.counts.waiting[lane] += 1
        self._lanes[lane].submit(self._run, job, step, lane, loop)

    def _run(self, job: Job, step: Then, lane: str, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self.counts.waiting[lane] -= 1
            self.counts.running[lane] += 1
            self.counts.steps[lane] += 1
        try:
            if job.token.cancelled:  # cancelled while it waited: never started
                raise Cancelled(job.token.why)
            with working_for(job.token):
                result = step.fn(*step.args)
            if isinstance(result, Then):
                job.token.check()
                self._queue(job, result, loop)
                return
            outcome: tuple[str, Any] = ("result", result)
        except Cancelled as e:
            with self._lock:
                self.counts.cancelled += 1
            outcome = ("error", e)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiter, whatever it is
            outcome = ("error", e)
        finally:
            with self._lock:
                self.counts.running[lane] -= 1
        try:
            loop.call_soon_threadsafe(_settle, job.future, *outcome)
        except RuntimeError:  # the event loop has closed: nobody waits for this job
            pass

    async def shutdown(self) -> None:
        """Stop taking jobs; cancel every job not yet done; wait for the running steps (each stops at its next
        check)."""
        for job in list(self._jobs):
            job.cancel("the server is stopping")
        loop = asyncio.get_running_loop()
        for executor in self._lanes.values():
            await loop.run_in_executor(None, lambda ex=executor: ex.shutdown(wait=True, cancel_futures=True))


def _settle(future: asyncio.Future[Any], how: str, value: Any) -> None:
    if future.done():  # cancelled by its awaiter meanwhile
        return
    if how == "result":
        future.set_result(value)
    else:
        future.set_exception(value)
