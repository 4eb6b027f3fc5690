"""Sending: one timed request, and the two ways of driving a server (closed loop, open loop) for one step.

Every request is timed on the client from just before it is sent to its whole answer read (end to end); a status
that is not 200, or a transport error (`connect`, `timeout`, `read`), is kept as it is, never retried: the load
generator measures what the server does, and retrying would hide the 503s it is there to see."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

from quantbench.server.schema import BATCH_HEADER, QUEUE_MS_HEADER


@dataclass
class Sample:
    """One request: its outcome ("200", "503", … or a transport error's name) and what the answer told."""

    status: str
    ms: float  # end to end on the client
    queue_ms: float | None = None  # the server's queue time (X-Quantbench-Queue-Ms), where reported
    model_ms: float | None = None  # the forward pass that answered it (the body's model_ms), where reported
    batch: int | None = None  # requests in that forward pass (X-Quantbench-Batch), where reported


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _transport_error(e: httpx.TransportError) -> str:
    if isinstance(e, httpx.ConnectError):
        return "connect"
    if isinstance(e, httpx.TimeoutException):
        return "timeout"
    return "transport"


async def send(client: httpx.AsyncClient, url: str, body: bytes) -> Sample:
    """POST one body and time it end to end."""
    t0 = time.perf_counter()
    try:
        r = await client.post(url, content=body)
    except httpx.TransportError as e:
        return Sample(_transport_error(e), (time.perf_counter() - t0) * 1000.0)
    ms = (time.perf_counter() - t0) * 1000.0
    sample = Sample(str(r.status_code), ms)
    if r.status_code == 200:
        sample.queue_ms = _float(r.headers.get(QUEUE_MS_HEADER))
        batch = _float(r.headers.get(BATCH_HEADER))
        sample.batch = int(batch) if batch is not None else None
        try:
            model_ms = json.loads(r.content).get("model_ms")
        except (ValueError, AttributeError):
            model_ms = None
        sample.model_ms = float(model_ms) if isinstance(model_ms, int | float) else None
    return sample


async def closed_loop(client: httpx.AsyncClient, url: str, bodies: list[bytes], *, concurrency: int, requests: int,
                      seconds: float, offset: int = 0) -> tuple[list[Sample], float]:
    """`concurrency` clients, each sending its next request when its answer comes, until `requests` have been sent
    or `seconds` have passed. Returns the samples and the step's wall time (until the last answer)."""
    samples: list[Sample] = []
    sent = 0
    start = time.perf_counter()
    stop_at = start + seconds

    async def one_client() -> None:
        nonlocal sent
        while sent < requests and time.perf_counter() < stop_at:
            body = bodies[(offset + sent) % len(bodies)]
            sent += 1
            samples.append(await send(client, url, body))

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


async def open_loop(client: httpx.AsyncClient, url: str, bodies: list[bytes], *, rate: float, requests: int,
                    seconds: float, seed: int = 0, offset: int = 0) -> tuple[list[Sample], float]:
    """Poisson arrivals at `rate` a second (seeded exponential gaps), each sent at its time whatever is in flight,
    until `requests` have been sent or `seconds` have passed. Returns the samples and the step's wall time (until
    the last answer)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Sample]] = []
    start = time.perf_counter()
    due = start
    while len(tasks) < requests:
        due += rng.expovariate(rate)
        if due - start > seconds:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = bodies[(offset + len(tasks)) % len(bodies)]
        tasks.append(asyncio.create_task(send(client, url, body)))
    samples = list(await asyncio.gather(*tasks))
    return samples, time.perf_counter() - start
