"""POST /v1/systemone as a plain ASGI app: the body read under its limit and deadline, admission, parsing and
tokenizing, the micro-batcher, and the answer or an error naming the field, with no framework layer between
uvicorn and the batcher (FastAPI's request handling cost ~0.2 ms a request on the 2-core VM; the schema the route
is documented with is app.py's, from the same protocol classes).

Every answer carries `Server-Timing` (read, prepare, queue, forward and app: the handler's whole time, in ms), so
a client can tell the server's overhead from its own and from the network's; a 200 also carries the batch it shared
(X-Quantbench-Batch) and its queue time (X-Quantbench-Queue-Ms), which `quantbench load` reads."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from quantbench.errors import RequestError
from quantbench.limits import Limits, flag
from quantbench.protocol import DecisionRequest
from quantbench.protocol.cancel import Cancelled
from quantbench.protocol.media_cache import request_scope
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import KernelPath
from quantbench.server.batcher import Answered, Metrics, MicroBatcher, QueueFull, QueueTimeout, padded_tokens
from quantbench.server.prepare import Job, PreparePool, Then
from quantbench.server.schema import (
    BATCH_HEADER,
    QUEUE_MS_HEADER,
    ClientGone,
    ErrorBody,
    Rejected,
    bound_long_state,
    decode_gate,
    decode_request,
    from_request_error,
    media_headers,
    over_deadline,
)

SERVER_TIMING_HEADER = "Server-Timing"
# A request body up to this size is parsed on the event loop, and tokenized there if it holds no media (well under a
# millisecond for a card request: the hop to a preparing thread and back cost more than the work); anything with
# media, and any larger body, is prepared on the preparation pool (quantbench.server.prepare), never on the loop.
INLINE_PREPARE_BYTES = 4096
# Work past these goes to the pool's heavy lane, so that it never holds up the light requests behind it: a body
# this large (parsing and checking megabytes of JSON takes tens to hundreds of milliseconds), or media that decode
# to this many bytes (a 2048 x 2048 picture is 12 MiB).
HEAVY_BODY_BYTES = 256 << 10
HEAVY_DECODED_BYTES = 16 << 20

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class ServerState:
    loaded: LoadedVariant | None = None
    batcher: MicroBatcher | None = None
    pool: PreparePool | None = None  # prepares requests off the event loop (made with the batcher)
    error: str | None = None  # why loading failed, as the server logs it
    shown_error: str | None = None  # and as a client is told it (without the server's paths unless a key is set)
    started: float = field(default_factory=time.monotonic)
    load_s: float | None = None
    metrics: Metrics = field(default_factory=Metrics)
    on_load_error: Callable[[], None] | None = None  # serve() stops the process: a server that cannot answer
    planned: KernelPath | None = None  # the kernel path planned at load, before any forward
    warm_s: float | None = None  # the warm-up forwards after load (None: none were run)
    warm_error: str | None = None  # why the warm-up failed (the server serves all the same)


# -- the ASGI plumbing ----------------------------------------------------------------------------------------------
def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """A request header's value (`name` lower case, as ASGI gives them), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def send_json(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """One JSON response: the start and the whole body (the server's transport writes them in one send)."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def error_json(e: Rejected) -> bytes:
    return e.body.model_dump_json(exclude_none=True).encode()


async def read_body(scope: dict[str, Any], receive: Receive, limit: int) -> bytes:
    """The body, refused as soon as it passes `limit` bytes (declared or streamed); ClientGone if the client
    disconnects first."""
    too_big = Rejected(
        413,
        ErrorBody(
            detail=f"request body is over the limit of {limit} bytes ({flag('max_body_bytes')})",
            field="request",
            limit=limit,
            fix=f"send a smaller state, or start the server with a larger {flag('max_body_bytes')}",
        ),
    )
    declared = header(scope, b"content-length") or b""
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has closed its connection (the body has been read: nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _first(work: asyncio.Future[Any] | Job, gone: asyncio.Future[None], deadline: float) -> Any:
    """The result of `work`; if the client goes first (ClientGone) or the deadline passes (TimeoutError), `work`
    is cancelled: a queued request is then skipped, never computed, and a preparation stops at its next check."""
    future = work.future if isinstance(work, Job) else work
    timeout = deadline - asyncio.get_running_loop().time()
    done, _ = await asyncio.wait({future, gone}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    if future in done:
        return future.result()
    if isinstance(work, Job):
        work.cancel("its client disconnected" if gone in done else "its deadline passed")
    else:
        work.cancel()
    if gone in done:
        raise ClientGone
    raise TimeoutError


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.3f}"


# -- the endpoint ---------------------------------------------------------------------------------------------------
class SystemOneEndpoint:
    """POST /v1/systemone: one decision request in, its answers (or an error naming the field and the fix) out."""

    def __init__(self, state: ServerState, *, limits: Limits, max_body_bytes: int, max_request_tokens: int,
                 request_timeout_s: float, max_queue: int, max_queue_ms: float):
        self.state, self.limits = state, limits
        self.max_body_bytes, self.max_request_tokens = max_body_bytes, max_request_tokens
        self.request_timeout_s, self.max_queue, self.max_queue_ms = request_timeout_s, max_queue, max_queue_ms

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        timing: dict[str, float] = {}
        try:
            answered = await self._answer(scope, receive, timing)
        except ClientGone:
            return  # nobody to answer: uvicorn sends nothing on a closed connection
        except Rejected as e:
            self.state.metrics.rejected[e.status] += 1
            headers = {**e.headers, SERVER_TIMING_HEADER: self._timing(timing, t0)}
            await send_json(send, e.status, error_json(e), headers)
            return
        self.state.metrics.answered += 1
        timing["queue"], timing["forward"] = answered.queue_ms / 1000.0, answered.forward_ms / 1000.0
        await send_json(send, 200, answered.body, {
            BATCH_HEADER: str(answered.batch),
            QUEUE_MS_HEADER: f"{answered.queue_ms:.3f}",
            SERVER_TIMING_HEADER: self._timing(timing, t0),
        })

    @staticmethod
    def _timing(timing: dict[str, float], t0: float) -> str:
        """The Server-Timing value: each span that was measured, then `app`, the handler's whole time."""
        spans = [f"{name};dur={_ms(s)}" for name, s in timing.items()]
        return ", ".join([*spans, f"app;dur={_ms(time.perf_counter() - t0)}"])

    def _retry_after(self, pending: int) -> int:
        """Seconds until the requests admitted now have been answered (at the recent forward time), at least 1:
        Retry-After counts whole seconds."""
        batcher = self.state.batcher
        return max(1, math.ceil(batcher.expected_wait_s(pending))) if batcher else 1

    def _overloaded(self, detail: str, limit: int, pending: int) -> Rejected:
        retry = self._retry_after(pending)
        return Rejected(
            503,
            ErrorBody(detail=detail, limit=limit, fix=f"retry after {retry} s, or send fewer requests at once"),
            headers={"Retry-After": str(retry)},
        )

    async def _answer(self, scope: dict[str, Any], receive: Receive, timing: dict[str, float]) -> Answered:
        state = self.state
        mime = (header(scope, b"content-type") or b"").split(b";", 1)[0].strip().lower()
        if mime != b"application/json":  # a web page's form or text/plain fetch needs no CORS preflight: refused
            raise Rejected(415, ErrorBody(
                detail=f"Content-Type {mime.decode('latin-1')[:60] or '(none)'} is not application/json",
                field="Content-Type", fix="send the request as JSON with the header Content-Type: application/json",
            ), headers={"Connection": "close"})
        batcher = state.batcher
        if batcher is None:
            detail = f"the model failed to load: {state.shown_error}" if state.error else "the model is still loading"
            raise Rejected(503, ErrorBody(detail=detail, fix="retry when GET /healthz answers 200"),
                           headers={"Retry-After": "5"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        t = time.perf_counter()
        try:
            async with asyncio.timeout(self.request_timeout_s):  # no task of its own, as wait_for makes in 3.11
                body = await read_body(scope, receive, self.max_body_bytes)
        except TimeoutError:
            raise over_deadline(408, "its body did not arrive", self.request_timeout_s) from None
        except ClientGone:
            state.metrics.dropped["disconnected"] += 1
            raise
        timing["read"] = time.perf_counter() - t
        try:
            batcher.admit()  # before any parsing: an overloaded server refuses at the cost of a counter check
        except QueueFull as e:
            state.metrics.shed[e.why] += 1
            if e.why == "queue_full":
                raise self._overloaded(f"the queue is full ({self.max_queue} requests waiting)", self.max_queue,
                                       batcher.pending) from None
            raise self._overloaded(
                f"the server is overloaded: the requests ahead would keep this one {e.expected_ms:.0f} ms in the "
                f"queue, over the queue deadline of {self.max_queue_ms:g} ms ({flag('max_queue_ms')})",
                math.ceil(self.max_queue_ms), batcher.pending) from None
        gone = asyncio.ensure_future(_disconnected(receive))
        queued = False
        try:
            t = time.perf_counter()
            if len(body) <= INLINE_PREPARE_BYTES:  # a small request: parsed here, no hop to a preparing thread
                step: Any = self._parse(body)
            else:
                step = Then(self._parse, body, heavy=len(body) > HEAVY_BODY_BYTES)
            if isinstance(step, Then):  # media, or a larger body: prepared on the pool, cancelled with the request
                job = state.pool.submit(step.fn, *step.args, heavy=step.heavy, deadline=deadline)  # type: ignore[union-attr]
                prepared = await _first(job, gone, deadline)
            else:
                prepared = step
            timing["prepare"] = time.perf_counter() - t
            answer = batcher.submit(prepared)
            queued = True
            answered = await _first(answer, gone, deadline)
            if answered.error:  # a NaN / infinite probability (batcher._answer): no answer to send
                raise Rejected(500, ErrorBody(
                    detail=answered.error, field="answers",
                    fix="check the served checkpoint's tensors, or serve with --dtype bfloat16 / float32"))
            return answered
        except (TimeoutError, Cancelled):
            state.metrics.dropped["deadline"] += 1
            raise over_deadline(504, "it was dropped", self.request_timeout_s) from None
        except ClientGone:
            state.metrics.dropped["disconnected"] += 1
            raise
        except QueueTimeout as e:
            raise self._overloaded(
                f"the server is overloaded: the request {e} before its forward pass, over the queue deadline of "
                f"{self.max_queue_ms:g} ms ({flag('max_queue_ms')})", math.ceil(self.max_queue_ms),
                batcher.pending) from None
        except RequestError as e:  # the prompt is over the context, or another per-request problem
            raise from_request_error(422, e) from None
        except Rejected:
            raise
        except Exception as e:
            raise Rejected(500, ErrorBody(detail=f"the model failed on this batch: {type(e).__name__}: {e}")) from e
        finally:
            gone.cancel()
            if not queued:
                batcher.release()

    # -- preparing: steps run on the event loop (a small body's parse) or on the preparation pool -----------------
    def _parse(self, body: bytes) -> Any:
        """Parse and check the body (no media decoded). A request without media is tokenized now and returned
        prepared; one with media goes on to `_media` on the pool (never decoded on the event loop)."""
        engine = self.state.batcher.engine  # type: ignore[union-attr]  # requests reach here only once loaded
        # The engine's `modalities`: the media types its model reads (none: a text-only model).
        decision, cut = bound_long_state(engine, decode_request(body, limits=self.limits,
                                                                modalities=engine.modalities))
        if decision.media_parts():
            return Then(self._media, decision, cut)
        return self._finish(engine.prepare(decision), cut)

    def _media(self, decision: DecisionRequest, cut: bool) -> Any:
        """Every part's header, checked against the limits and the request's decoded bytes before anything is
        decoded; media that decode to many bytes go on to the heavy lane."""
        headers = media_headers(decision, self.limits)
        then = Then(self._decode_and_prepare, decision, cut,
                    heavy=sum(h.decoded_bytes for h in headers) > HEAVY_DECODED_BYTES)
        return then if then.heavy else self._decode_and_prepare(decision, cut)

    def _decode_and_prepare(self, decision: DecisionRequest, cut: bool) -> Any:
        """Decode and tokenize, in one request scope: an engine that reads media checks the headers against its
        context and decodes each part once (quantbench.protocol.media_cache), the gate then finds them decoded
        (or, for an engine that does not decode, decodes them), and they are let go when the request is
        prepared: the prepared request holds the processor's tensors only."""
        engine = self.state.batcher.engine  # type: ignore[union-attr]
        with request_scope():
            prepared = engine.prepare(decision)
            decode_gate(decision, self.limits)
        return self._finish(prepared, cut)

    def _finish(self, prepared: Any, cut: bool) -> Any:
        """Check a prepared request's tokens (no model work)."""
        engine = self.state.batcher.engine  # type: ignore[union-attr]
        if cut:
            for reader in getattr(prepared, "readers", []):
                reader.truncated = True  # the state was cut here, before the engine cut it further
        rows, width = padded_tokens(prepared, engine)
        if rows * width > self.max_request_tokens:
            raise Rejected(
                413,
                ErrorBody(
                    detail=f"the request is {rows} sequences of up to {width} tokens, {rows * width} padded "
                    f"tokens, over the limit of {self.max_request_tokens} ({flag('max_request_tokens')})",
                    field="questions",
                    tokens=rows * width,
                    limit=self.max_request_tokens,
                    fix=f"send fewer questions or options or a shorter state per request, or start the server "
                    f"with a larger {flag('max_request_tokens')}",
                ),
            )
        return prepared
