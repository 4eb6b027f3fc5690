"""The SystemOne HTTP server: `quantbench serve` answers POST /v1/systemone with any backend's loaded model.

    app = create_app(lambda: get_backend("int4").load(spec, machine))   # the loader runs in the background
    serve(app, host="127.0.0.1", port=8000)

The port opens at once; GET /healthz answers 503 {"status": "loading"} until the loader returns, then 200 with
what is served. Requests are validated with the protocol's own classes (one definition), queued, and answered
in micro-batches: requests that queued while the model was busy (and, with `max_wait_ms` > 0, those arriving
that much later), up to `max_batch` of them, go through ONE `engine.forward_many` call, on one worker thread
so the event loop never runs the model. A full queue answers 503 with Retry-After; bad input gets a 4xx
naming the field, and the server keeps serving.
A response's `model_ms` is the forward pass that answered it (shared by its batch; the batch size is in the
X-Quantbench-Batch header, and GET /metrics counts batch sizes).

One request cannot take the server down (quantbench.limits, each a flag of `quantbench serve`): the body size,
the questions, the options per question and in total are checked on the parsed JSON (413 / 422 naming the limit
and its flag), then the tokens of its sequences after tokenizing, all before any model work. Parsing and
tokenizing run on their own thread, so a large request does not hold up the forward passes of others; a batch
holds at most max_request_tokens padded tokens. Every request has a deadline (--request-timeout: 408 while its
body is read, 504 after); a request whose client has gone, or whose deadline has passed, is dropped before its
forward pass. A connection that sends no complete request headers within --header-timeout is closed.
The model worker gives memory that malloc kept back to the OS when the queue empties (see TRIM_MIN_INTERVAL_S).
"""

from __future__ import annotations

import asyncio
import ctypes
import hmac
import json
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

import quantbench
from quantbench.errors import ContextLengthError, RequestError
from quantbench.limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OPTIONS,
    DEFAULT_MAX_QUESTIONS,
    DEFAULT_MAX_REQUEST_TOKENS,
    DEFAULT_MAX_TOTAL_OPTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    Limits,
    flag,
)
from quantbench.protocol import (
    DecisionRequest,
    DecisionResponse,
    LimitError,
    check_limits,
    loads_strict,
    parse_request,
)
from quantbench.protocol.prompt import render_state
from quantbench.run.backend import LoadedVariant

log = logging.getLogger("quantbench.server")

DEFAULT_MAX_BATCH = 8
# 0: a batch is whatever queued while the previous forward pass ran. Measured with benchmarks/serve_load.py on
# the fixture: waiting 5 ms for company cost 1 client ~5 ms and bought no throughput at 4 or 16 clients.
DEFAULT_MAX_WAIT_MS = 0.0
DEFAULT_MAX_QUEUE = 64
DRAIN_TIMEOUT_S = 60.0
KEEP_ALIVE_TIMEOUT_S = 5  # uvicorn's default: an idle keep-alive connection is closed after this
API_KEY_ENV = "QUANTBENCH_API_KEY"

# The reference card's curl example: what `--demo` answers.
DEMO_REQUEST = {
    "model": "clef-omni",
    "state": {"observation": "The player is facing a wall."},
    "questions": {
        "action": {
            "type": "choice",
            "criteria": {"left": "Turn left", "right": "Turn right", "forward": "Move forward"},
        }
    },
}


class ErrorBody(BaseModel):
    """Every 4xx / 5xx body: what is wrong, where, and how to fix it."""

    detail: str
    field: str | None = None
    fix: str | None = None
    tokens: int | None = None  # context errors: the prompt's length
    limit: int | None = None  # context and size errors: the limit it broke


class Rejected(Exception):
    """A request answered with an error status (never a crash)."""

    def __init__(self, status: int, body: ErrorBody, headers: dict[str, str] | None = None):
        self.status, self.body, self.headers = status, body, headers or {}
        super().__init__(body.detail)


def _from_request_error(status: int, e: RequestError) -> Rejected:
    body = ErrorBody(detail=str(e), field=e.field, fix=e.fix or None)
    if isinstance(e, ContextLengthError):
        body.tokens, body.limit = e.tokens, e.limit
    if isinstance(e, LimitError):
        status, body.limit = e.status, e.limit
    return Rejected(status, body)


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent, the work is dropped."""


# -- the micro-batcher ------------------------------------------------------------------------------------------
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
            "memory_trims": self.memory_trims,
            "memory_trim_ms_total": round(self.memory_trim_ms_total, 3),
        }


class QueueFull(Exception):
    pass


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
    ):
        self.engine, self.model_id = loaded.engine, loaded.info.model_id
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.max_batch_tokens = max_batch_tokens
        self.metrics = metrics
        self.pending = 0  # queued or being answered
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

    def submit(self, prepared: Any) -> asyncio.Future[Answered]:
        """Queue a prepared request; its future is its answer. Cancel the future to drop the request (a client
        that went away, a deadline passed): it is then skipped, not computed."""
        if self.pending >= self.max_queue:
            raise QueueFull
        self.pending += 1
        future: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        rows, width = padded_tokens(prepared, self.engine)
        self._queue.put_nowait(_Job(prepared, rows, width, future, time.perf_counter()))
        return future

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
        deadline = loop.time() + self.max_wait_s
        while len(jobs) < self.max_batch:
            job = await self._next(max(0.0, deadline - loop.time()))
            if job is None:
                break
            if (rows + job.rows) * max(width, job.width) > self.max_batch_tokens:
                self._held = job  # first in the next batch
                break
            jobs.append(job)
            rows, width = rows + job.rows, max(width, job.width)
        return jobs

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
        """Runs on the worker thread: one forward pass for all the prepared requests."""
        t0 = time.perf_counter()
        answers = self.engine.forward_many(prepared)
        self.engine.synchronize()
        ms = (time.perf_counter() - t0) * 1000.0
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


# -- request parsing ----------------------------------------------------------------------------------------------
async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it passes `limit` bytes (declared or streamed)."""
    too_big = Rejected(
        413,
        ErrorBody(
            detail=f"request body is over the limit of {limit} bytes ({flag('max_body_bytes')})",
            field="request",
            limit=limit,
            fix=f"send a smaller state, or start the server with a larger {flag('max_body_bytes')}",
        ),
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)


def decode_request(
    body: bytes, *, max_options: int = DEFAULT_MAX_OPTIONS, limits: Limits | None = None
) -> DecisionRequest:
    """Bytes -> DecisionRequest, or Rejected: 400 for bytes that are not JSON text, 422 for a wrong request,
    413 / 422 for one over `limits` (default: the protocol's, with `max_options`)."""

    def bad(problem: str, fix: str) -> Rejected:
        return Rejected(400, ErrorBody(detail=f"request: {problem} ({fix})", field="request", fix=fix))

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(
            f"body is not UTF-8 (invalid byte at offset {e.start})", "encode the JSON as UTF-8"
        ) from None
    if not text.strip():
        raise bad("body is empty", "send a JSON decision request with state and questions")
    limits = limits or Limits(max_options=max_options)
    try:
        data = loads_strict(text)
        if isinstance(data, dict):
            check_limits(data, limits)  # counts first: a request over a limit is not walked any further
        # A \ud800 escape parses into a string no tokenizer can encode: refuse it here, not in the model thread.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as e:
        raise bad(
            f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", "send one JSON object"
        ) from None
    except RecursionError:
        raise bad("JSON nests deeper than the parser allows", "flatten the state") from None
    except UnicodeEncodeError:
        raise bad(
            "contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)", "send valid Unicode text"
        ) from None
    except RequestError as e:  # duplicate keys, a limit
        raise _from_request_error(422, e) from None
    try:
        request = parse_request(data, limits=limits)
    except RequestError as e:
        raise _from_request_error(422, e) from None
    media = request.media_fields()
    if media:
        # Every engine quantbench serves is a text-only language model: there is no tower to read media with.
        raise Rejected(
            422,
            ErrorBody(
                detail=f"state.{media[0]}: the served model reads text only and has no image/audio/video input",
                field=f"state.{media[0]}",
                fix="send a text-only state (describe the media in words) or use a server whose model has that tower",
            ),
        )
    return request


# A state this many characters per token of context is tokenized only as far as that: a 4 MB state took 13 s to
# tokenize whole (docs/BENCHMARKS.md) only to be refused as over a 512-token context, and with truncation it was
# tokenized whole twice per question.
STATE_PREFIX_CHARS_PER_TOKEN = 16
STATE_PREFIX_MARGIN_TOKENS = 64  # the prefix's cut word and the prompt's template can shift a few tokens


def state_prefix(state: dict[str, Any], chars: int) -> dict[str, Any]:
    """The state cut so that it renders (quantbench.protocol.prompt.render_state) as the first ~`chars` characters of what
    the whole state renders: the keys that fit, then the next value's text cut."""
    out: dict[str, Any] = {}
    used = len("State:")
    for key, value in state.items():
        room = chars - used - len(key) - 3  # "\n" + key + ": "
        if room <= 0:
            break
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if len(text) > room:
            out[key] = text[:room]  # a string renders verbatim, as the value's JSON text did
            break
        out[key] = value
        used += len(key) + 3 + len(text)
    return out


def bound_long_state(engine: Any, decision: DecisionRequest) -> tuple[DecisionRequest, bool]:
    """A state far longer than the model's context is never tokenized whole. Without truncation: 422 when a
    prefix of it is already over the context. With truncation: the request with its state cut to that prefix
    (the engine cuts the rest), and True (its answers must say truncated). Only for an engine that says its
    tokenizer and limit."""
    tokenizer, limit = getattr(engine, "tokenizer", None), getattr(engine, "max_tokens", None)
    if tokenizer is None or not isinstance(limit, int):
        return decision, False
    chars = limit * STATE_PREFIX_CHARS_PER_TOKEN
    text = render_state(decision.state)
    if len(text) <= chars:
        return decision, False  # short enough to tokenize whole with the prompt
    if getattr(engine, "truncate", False):
        return decision.model_copy(update={"state": state_prefix(decision.state, chars)}), True
    head = text[:chars]
    cut = head.rfind(" ")  # a prefix ending between words tokenizes as the whole text does up to there
    tokens = len(tokenizer(head[:cut] if cut > 0 else head, add_special_tokens=False)["input_ids"])
    if tokens > limit + STATE_PREFIX_MARGIN_TOKENS:
        raise Rejected(
            422,
            ErrorBody(
                detail=f"state: its first {chars} of {len(text)} characters are already {tokens} tokens, over the "
                f"model's limit of {limit}",
                field="state",
                tokens=tokens,
                limit=limit,
                fix="shorten the state, or start the server with --allow-truncation (recorded on each answer)",
            ),
        )
    return decision, False


# -- deadlines and disconnects ----------------------------------------------------------------------------------
async def _disconnected(request: Request) -> None:
    """Returns when the client has closed its connection (the body has been read: nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _first(work: asyncio.Future[Any], gone: asyncio.Future[None], deadline: float) -> Any:
    """The result of `work`; if the client goes first (ClientGone) or the deadline passes (TimeoutError), `work`
    is cancelled: a queued request is then skipped, never computed."""
    timeout = deadline - asyncio.get_running_loop().time()
    done, _ = await asyncio.wait({work, gone}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        return work.result()
    work.cancel()
    if gone in done:
        raise ClientGone
    raise TimeoutError


def _over_deadline(status: int, what: str, timeout_s: float) -> Rejected:
    return Rejected(
        status,
        ErrorBody(
            detail=f"no answer within the request deadline of {timeout_s:g} s ({flag('request_timeout')}): {what}",
            field="request",
            limit=math.ceil(timeout_s),
            fix=f"send a smaller request, retry when the server is less busy, or start it with a larger "
            f"{flag('request_timeout')}",
        ),
        headers={"Connection": "close"} if status == 408 else None,
    )


def _dropped(state: ServerState, why: str) -> Response:
    """What a handler returns for a client that has gone: nobody reads it (uvicorn sends nothing)."""
    state.metrics.dropped[why] += 1
    return Response(status_code=499)


# -- the app ------------------------------------------------------------------------------------------------------
@dataclass
class ServerState:
    loaded: LoadedVariant | None = None
    batcher: MicroBatcher | None = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    load_s: float | None = None
    metrics: Metrics = field(default_factory=Metrics)
    on_load_error: Callable[[], None] | None = None  # serve() stops the process: a server that cannot answer


def _identity(loaded: LoadedVariant, machine: Any) -> dict[str, Any]:
    """What /healthz reports as served: the variant's record, the device and the GPU."""
    device = str(getattr(loaded.engine, "device", "cpu"))
    gpu = getattr(machine, "gpu_name", None)
    if gpu is None:
        gpu = "cpu"
        if device.startswith("cuda"):
            import torch

            gpu = torch.cuda.get_device_name(device)
    info = loaded.info
    return {
        "model": info.model_id,
        "variant": info.variant,
        "kernel_path": info.kernel_path,
        "weight_format": info.weight_format,
        "compute_dtype": info.compute_dtype,
        "device": device,
        "gpu": gpu,
        "info": jsonable_encoder(asdict(info)),
        "machine": jsonable_encoder(asdict(machine))
        if is_dataclass(machine) and not isinstance(machine, type)
        else None,
    }


def _error_response(state: ServerState, e: Rejected) -> JSONResponse:
    state.metrics.rejected[e.status] += 1
    return JSONResponse(e.body.model_dump(exclude_none=True), status_code=e.status, headers=e.headers)


def _api_key_middleware(app: FastAPI, key: str) -> None:
    expected = key.encode()

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable[..., Any]) -> Any:
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), expected):
            request.app.state.qb.metrics.rejected[401] += 1
            return JSONResponse(
                ErrorBody(
                    detail="missing or wrong API key",
                    field="Authorization",
                    fix="send the header 'Authorization: Bearer <key>' (or 'X-API-Key: <key>')",
                ).model_dump(exclude_none=True),
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await call_next(request)


def create_app(
    loader: Callable[[], LoadedVariant],
    *,
    api_key: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allow_truncation: bool = False,
    max_options: int = DEFAULT_MAX_OPTIONS,
    max_questions: int = DEFAULT_MAX_QUESTIONS,
    max_total_options: int = DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    machine: Any = None,
) -> FastAPI:
    """The SystemOne app. `loader` runs in a background thread when the app starts (the port is open meanwhile)."""
    if max_batch < 1 or max_queue < 1 or max_wait_ms < 0 or max_body_bytes < 1:
        raise ValueError("max_batch, max_queue and max_body_bytes must be >= 1 and max_wait_ms >= 0")
    if max_request_tokens < 1 or not request_timeout_s > 0:
        raise ValueError("max_request_tokens must be >= 1 and request_timeout_s > 0")
    limits = Limits(max_options=max_options, max_questions=max_questions, max_total_options=max_total_options)
    state = ServerState()

    def loaded_ok(loaded: LoadedVariant) -> None:
        if hasattr(loaded.engine, "truncate"):
            loaded.engine.truncate = allow_truncation  # the server's flag decides, whatever the loader set
        state.loaded, state.load_s = loaded, time.monotonic() - state.started
        state.batcher = MicroBatcher(
            loaded, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, metrics=state.metrics,
            max_batch_tokens=max_request_tokens,
        )
        state.batcher.start()
        log.info("model %s (%s) loaded in %.1f s", loaded.info.model_id, loaded.info.variant, state.load_s)

    def load_failed(message: str) -> None:
        state.error = message
        log.error("loading the model failed: %s", message)
        if state.on_load_error:
            state.on_load_error()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        state.started = time.monotonic()

        def load() -> None:
            try:
                loaded = loader()
            except BaseException as e:  # noqa: B036 - any failure is reported through /healthz
                message = f"{type(e).__name__}: {e}"
                log.debug("loader failed", exc_info=True)
                done = (load_failed, message)
            else:
                done = (loaded_ok, loaded)
            try:
                loop.call_soon_threadsafe(*done)
            except RuntimeError:  # the server stopped while the model was still loading
                pass

        # A daemon thread, so Ctrl-C during a long load does not wait for it.
        threading.Thread(target=load, name="quantbench-load", daemon=True).start()
        yield
        # uvicorn has stopped accepting and waited for open requests; finish what is still queued.
        if state.batcher:
            await state.batcher.drain(DRAIN_TIMEOUT_S)

    app = FastAPI(
        title="quantbench SystemOne server",
        version=quantbench.__version__,
        description="Per-option probabilities for decision questions (the SystemOne API).",
        lifespan=lifespan,
    )
    app.state.qb = state
    if api_key:
        _api_key_middleware(app, api_key)

    @app.exception_handler(Rejected)
    async def rejected(request: Request, e: Rejected) -> JSONResponse:
        return _error_response(state, e)

    @app.get("/healthz", responses={503: {"description": "The model is still loading, or failed to load."}})
    async def healthz() -> JSONResponse:
        if state.error:
            return JSONResponse({"status": "failed", "error": state.error}, status_code=503)
        if state.loaded is None:
            return JSONResponse(
                {"status": "loading", "loading_s": round(time.monotonic() - state.started, 1)},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        body = {
            "status": "ok",
            **_identity(state.loaded, machine),
            "load_s": state.load_s,
            "quantbench_version": quantbench.__version__,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
            "max_queue": max_queue,
            "allow_truncation": allow_truncation,
            "limits": {
                "max_body_bytes": max_body_bytes,
                "max_questions": max_questions,
                "max_options": max_options,
                "max_total_options": max_total_options,
                "max_request_tokens": max_request_tokens,
                "request_timeout_s": request_timeout_s,
            },
            "metrics": state.metrics.to_dict(),
        }
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        queued = state.batcher.pending if state.batcher else 0
        return JSONResponse({**state.metrics.to_dict(), "pending": queued, "max_queue": max_queue})

    errors = {
        status: {"model": ErrorBody, "description": text}
        for status, text in [
            (400, "The body is not UTF-8 JSON."),
            (401, "Missing or wrong API key."),
            (408, "The body did not arrive within the request deadline."),
            (413, "The body, its questions, options or tokens are over a limit (the error names it)."),
            (422, "The request is invalid, a question has too many options, or its prompt is over the model's context."),
            (503, "The model is still loading, or the queue is full (see Retry-After)."),
            (504, "No answer within the request deadline (the request was dropped)."),
        ]
    }

    def prepare(body: bytes) -> Any:
        """On the preparing thread: parse and check the body, tokenize it, check its tokens (no model work)."""
        engine = state.batcher.engine  # type: ignore[union-attr]  # requests reach here only once loaded
        decision, cut = bound_long_state(engine, decode_request(body, limits=limits))
        prepared = engine.prepare(decision)
        if cut:
            for reader in getattr(prepared, "readers", []):
                reader.truncated = True  # the state was cut here, before the engine cut it further
        rows, width = padded_tokens(prepared, engine)
        if rows * width > max_request_tokens:
            raise Rejected(
                413,
                ErrorBody(
                    detail=f"the request is {rows} sequences of up to {width} tokens, {rows * width} padded "
                    f"tokens, over the limit of {max_request_tokens} ({flag('max_request_tokens')})",
                    field="questions",
                    tokens=rows * width,
                    limit=max_request_tokens,
                    fix=f"send fewer questions or options or a shorter state per request, or start the server "
                    f"with a larger {flag('max_request_tokens')}",
                ),
            )
        return prepared

    @app.post(
        "/v1/systemone",
        response_model=DecisionResponse,
        responses=errors,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecisionRequest"}}},
            }
        },
    )
    async def systemone(request: Request) -> JSONResponse:
        # The body is read and validated by hand: size limit, UTF-8, duplicate keys and the protocol's own
        # classes (the OpenAPI schema above is the same DecisionRequest class).
        if state.batcher is None:
            detail = (
                f"the model failed to load: {state.error}" if state.error else "the model is still loading"
            )
            raise Rejected(
                503,
                ErrorBody(detail=detail, fix="retry when GET /healthz answers 200"),
                headers={"Retry-After": "5"},
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request_timeout_s
        batcher = state.batcher
        try:
            body = await asyncio.wait_for(read_body(request, max_body_bytes), request_timeout_s)
        except TimeoutError:
            raise _over_deadline(408, "its body did not arrive", request_timeout_s) from None
        except ClientGone:
            return _dropped(state, "disconnected")
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            try:
                prepared = await _first(batcher.prepare(prepare, body), gone, deadline)
                answered = await _first(batcher.submit(prepared), gone, deadline)
            except TimeoutError:
                state.metrics.dropped["deadline"] += 1
                raise _over_deadline(504, "it was dropped", request_timeout_s) from None
            except ClientGone:
                return _dropped(state, "disconnected")
        except QueueFull:
            batches = max(1, math.ceil(batcher.pending / max_batch))
            per_batch_s = state.metrics.forward_ms_total / 1000.0 / max(1, state.metrics.batches)
            retry = max(1, math.ceil(batches * per_batch_s))
            raise Rejected(
                503,
                ErrorBody(
                    detail=f"the queue is full ({max_queue} requests waiting)",
                    limit=max_queue,
                    fix=f"retry after {retry} s, or send fewer requests at once",
                ),
                headers={"Retry-After": str(retry)},
            ) from None
        except RequestError as e:  # the prompt is over the context, or another per-request problem
            raise _from_request_error(422, e) from None
        except Rejected:
            raise
        except Exception as e:
            raise Rejected(
                500, ErrorBody(detail=f"the model failed on this batch: {type(e).__name__}: {e}")
            ) from e
        finally:
            gone.cancel()
        state.metrics.answered += 1
        return JSONResponse(
            answered.response.model_dump(mode="json"),
            headers={
                "X-Quantbench-Batch": str(answered.batch),
                "X-Quantbench-Queue-Ms": f"{answered.queue_ms:.3f}",
            },
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            request_schema = DecisionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request_schema.pop("$defs", {}))
            components["DecisionRequest"] = request_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# -- running it ---------------------------------------------------------------------------------------------------
def guarded_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools or h11, as uvicorn would choose) with a header timeout: a connection
    that has no request in flight `header_timeout_s` after it opened, or after its last response, is closed.
    uvicorn's own keep-alive timeout stops as soon as any byte arrives, so without this a client that sends
    half a request line and stalls holds its connection forever."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _header_timeout(self) -> None:
            idle = self.cycle is None or self.cycle.response_complete  # no request whose headers arrived
            if idle and not self.transport.is_closing():
                log.info("closing a connection that sent no request headers in %g s", header_timeout_s)
                self.transport.close()

    return HeaderTimeoutProtocol


def serve(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    log_level: str = "info",
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
) -> int:
    """Run the app under uvicorn until Ctrl-C / SIGTERM (in-flight requests finish). 1 if the model failed to load."""
    import uvicorn

    if not header_timeout_s > 0:
        raise ValueError("header_timeout_s must be > 0")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=guarded_protocol(header_timeout_s),
        timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S,
    )
    server = uvicorn.Server(config)
    state: ServerState = app.state.qb

    def stop() -> None:
        server.should_exit = True

    state.on_load_error = stop
    server.run()
    if state.error:
        print(f"quantbench serve: the model failed to load: {state.error}", file=sys.stderr)
        return 1
    return 0


def demo(loaded: LoadedVariant, request: dict[str, Any] | None = None) -> DecisionResponse:
    """Answer one decision (the reference card's example by default) through the loaded engine."""
    decision = parse_request(request or DEMO_REQUEST)
    engine = loaded.engine
    prepared = engine.prepare(decision)
    t0 = time.perf_counter()
    answers = engine.forward(prepared)
    engine.synchronize()
    ms = (time.perf_counter() - t0) * 1000.0
    return DecisionResponse(
        model=loaded.info.model_id, answers=answers, model_ms=ms, tokens=engine.tokens(prepared)
    )


_demo_answer = demo  # inside cli_serve the `demo` flag shadows this function


def cli_serve(
    model: str | None,
    backend: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    demo: bool = False,
    allow_truncation: bool = False,
    max_batch: int = DEFAULT_MAX_BATCH,
    trust_remote_code: bool = False,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_questions: int = DEFAULT_MAX_QUESTIONS,
    max_options: int = DEFAULT_MAX_OPTIONS,
    max_total_options: int = DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
) -> int:
    """`quantbench serve`: load `model` through `backend` (as the runner does) and serve it, or answer --demo."""
    from quantbench.errors import ConfigError
    from quantbench.run.backend import RunSpec, get_backend
    from quantbench.run.machine import detect
    from quantbench.run.resolve import resolve

    if backend == "http":
        raise ConfigError(
            "--backend http sends requests to a server; serve a local model with bf16, int4, nvfp4 or fp8"
        )
    spec = RunSpec(
        backend=backend,
        model=model,
        truncate=allow_truncation,
        trust_remote_code=trust_remote_code,
        max_options=max_options,
    )
    if max_request_tokens < 1 or max_body_bytes < 1:
        raise ConfigError("--max-request-tokens and --max-body-bytes: use 1 or more")
    if not (request_timeout_s > 0 and header_timeout_s > 0):
        raise ConfigError("--request-timeout and --header-timeout: use a number of seconds above 0")
    Limits(max_options=max_options, max_questions=max_questions, max_total_options=max_total_options)
    machine = detect(with_torch=True)
    spec.device = machine.device
    chosen = get_backend(backend)  # an unknown name fails here, before the port opens

    def load() -> LoadedVariant:
        return chosen.load(resolve(spec), machine)  # no --model: the embedded model, prepared here first

    if demo:
        loaded = load()
        response = _demo_answer(loaded)
        print(json.dumps(response.model_dump(mode="json"), indent=2))
        info = loaded.info
        for name, answer in response.answers.items():
            print(
                f"{name}: {answer.top} ({answer.probabilities[answer.top]:.1%}) — {info.model_id} {info.variant}, "
                f"{info.kernel_path}, {response.model_ms:.1f} ms, {response.tokens} tokens",
                file=sys.stderr,
            )
        return 0
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(
            f"warning: serving on {host} without an API key; anyone who reaches it can use the model "
            f"(set --api-key or {API_KEY_ENV})",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(
        load,
        api_key=api_key,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        allow_truncation=allow_truncation,
        max_body_bytes=max_body_bytes,
        max_questions=max_questions,
        max_options=max_options,
        max_total_options=max_total_options,
        max_request_tokens=max_request_tokens,
        request_timeout_s=request_timeout_s,
        machine=machine,
    )
    return serve(app, host, port, header_timeout_s=header_timeout_s)
