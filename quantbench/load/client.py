"""Sending: one timed request, and the two ways of driving a server (closed loop, open loop) for one step, on the
connections of one generator process (quantbench.load.http).

Every request is timed on the client from just before it is sent to its whole answer read (end to end); a status
that is not 200, or a transport error (`connect`, `timeout`, `transport`), is kept as it is, never retried: the
load generator measures what the server does, and retrying would hide the 503s it is there to see. A closed-loop
client that gets a 503 or 429 with Retry-After waits that long before its next request when told to honour it (what
a well-behaved client does, and what the server asks for); otherwise it sends the next at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from dataclasses import dataclass
from typing import Any

from quantbench.load.http import ConnectFailed, Connection, HttpError, Target
from quantbench.server.schema import BATCH_HEADER, QUEUE_MS_HEADER

_QUEUE = QUEUE_MS_HEADER.lower().encode()
_BATCH = BATCH_HEADER.lower().encode()
_TIMING = b"server-timing"
_RETRY_AFTER = b"retry-after"


@dataclass
class Sample:
    """One request: its outcome ("200", "503", … or a transport error's name) and what the answer told."""

    status: str
    ms: float  # end to end on the client
    queue_ms: float | None = None  # the server's queue time (X-Quantbench-Queue-Ms), where reported
    model_ms: float | None = None  # the forward pass that answered it (the body's model_ms), where reported
    batch: int | None = None  # requests in that forward pass (X-Quantbench-Batch), where reported
    timing: dict[str, float] | None = None  # the server's Server-Timing spans in ms (read, prepare, ... app)
    retry_after_s: float | None = None  # a 503 / 429's Retry-After
    done_at: float = 0.0  # time.monotonic() when its answer had been read


def _number(value: Any) -> float | None:
    """A time or count the server reports, or None when it is not a finite number of 0 or more: `inf` as the batch
    stopped the generator (OverflowError in int()) and NaN as a time made the step's percentiles nan."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _float(text: bytes | None) -> float | None:
    try:
        return _number(float(text)) if text is not None else None
    except ValueError:
        return None


def server_timing(value: bytes | None) -> dict[str, float] | None:
    """`Server-Timing: read;dur=0.1, prepare;dur=0.4` -> {"read": 0.1, "prepare": 0.4}; spans without a duration
    are left out; None when there is no header."""
    if value is None:
        return None
    spans = {}
    for part in value.decode("latin-1").split(","):
        name, _, params = part.strip().partition(";")
        for param in params.split(";"):
            key, _, dur = param.strip().partition("=")
            if key == "dur" and (ms := _float(dur.strip('"').encode())) is not None:
                spans[name] = ms
    return spans


async def send(conn: Connection, request: bytes, timeout_s: float) -> Sample:
    """Send one prebuilt request on `conn` and time it end to end."""
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            r = await conn.send(request)
    except TimeoutError:
        conn.close()  # its answer may still come: the connection cannot carry another request
        status = "timeout"
    except ConnectFailed:
        status = "connect"
    except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        status = "transport"
    else:
        sample = Sample(str(r.status), (time.perf_counter() - t0) * 1000.0, done_at=time.monotonic())
        if r.status == 200:
            sample.queue_ms = _float(r.headers.get(_QUEUE))
            batch = _float(r.headers.get(_BATCH))
            sample.batch = int(batch) if batch is not None else None
            sample.timing = server_timing(r.headers.get(_TIMING))
            try:
                model_ms = json.loads(r.body).get("model_ms")
            except (ValueError, AttributeError):
                model_ms = None
            sample.model_ms = _number(model_ms)
        elif r.status in (429, 503):
            sample.retry_after_s = _float(r.headers.get(_RETRY_AFTER))
        return sample
    return Sample(status, (time.perf_counter() - t0) * 1000.0, done_at=time.monotonic())


class Pool:
    """One generator process's connections to the server, kept open across steps."""

    def __init__(self, target: Target):
        self.target = target
        self.connections: list[Connection] = []

    async def ready(self, n: int) -> list[Connection]:
        """`n` connections, opened before a step starts (so that its timing holds no TCP handshakes); one the server
        closed while idle is opened again. One that cannot be opened is left closed: its first request fails as
        `connect`."""
        while len(self.connections) < n:
            self.connections.append(Connection(self.target))
        chosen = self.connections[:n]

        async def reopen(conn: Connection) -> None:
            if not conn.open:
                conn.close()
                with contextlib.suppress(ConnectFailed):
                    await conn.connect()

        await asyncio.gather(*(reopen(c) for c in chosen))
        return chosen

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


async def closed_loop(pool: Pool, requests: list[bytes], *, concurrency: int, count: int, seconds: float,
                      timeout_s: float, offset: int = 0, honor_retry_after: bool = True) -> tuple[list[Sample], float]:
    """`concurrency` clients, each on its own connection, sending its next request when its answer comes, until
    `count` have been sent or `seconds` have passed. Returns the samples and the step's start (time.monotonic())."""
    samples: list[Sample] = []
    sent = 0
    conns = await pool.ready(concurrency)
    all_sent = asyncio.Event()  # wakes the clients waiting out a Retry-After: there is nothing left to send
    start = time.monotonic()
    stop_at = start + seconds

    async def one_client(conn: Connection) -> None:
        nonlocal sent
        while sent < count and time.monotonic() < stop_at:
            request = requests[(offset + sent) % len(requests)]
            sent += 1
            if sent == count:
                all_sent.set()
            sample = await send(conn, request, timeout_s)
            samples.append(sample)
            if honor_retry_after and sample.retry_after_s and not all_sent.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(sample.retry_after_s, max(0.0, stop_at - time.monotonic()))):
                        await all_sent.wait()

    await asyncio.gather(*(one_client(c) for c in conns))
    return samples, start


async def open_loop(pool: Pool, requests: list[bytes], *, rate: float, count: int, seconds: float, timeout_s: float,
                    seed: int = 0, offset: int = 0) -> tuple[list[Sample], float]:
    """Poisson arrivals at `rate` a second (seeded exponential gaps), each sent at its time on an idle connection
    (a new one when none is idle) whatever is in flight, until `count` have been sent or `seconds` have passed.
    Returns the samples and the step's start (time.monotonic())."""
    rng = random.Random(seed)
    idle = list(await pool.ready(min(count, max(1, int(rate)))))
    tasks: list[asyncio.Task[Sample]] = []

    async def one(request: bytes) -> Sample:
        conn = idle.pop() if idle else Connection(pool.target)
        try:
            return await send(conn, request, timeout_s)
        finally:
            idle.append(conn)
            if conn not in pool.connections:
                pool.connections.append(conn)

    start = time.monotonic()
    due = start
    while len(tasks) < count:
        due += rng.expovariate(rate)
        if due - start > seconds:
            break
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(requests[(offset + len(tasks)) % len(requests)])))
    return list(await asyncio.gather(*tasks)), start
