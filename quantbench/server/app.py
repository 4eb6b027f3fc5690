"""The SystemOne app: `create_app` wires the loader, the micro-batcher, the API key check and the routes
(/v1/systemone, /healthz, /metrics, the OpenAPI schema); `serve` runs it under uvicorn; `demo` answers one
decision without a server."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from uvicorn.protocols.http.auto import AutoHTTPProtocol

import quantbench
from quantbench.errors import RequestError
from quantbench.limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OPTIONS,
    DEFAULT_MAX_QUESTIONS,
    DEFAULT_MAX_REQUEST_TOKENS,
    DEFAULT_MAX_TOTAL_OPTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    MEDIA_LIMITS,
    Limits,
    flag,
)
from quantbench.protocol import DecisionRequest, DecisionResponse, parse_request
from quantbench.run.backend import LoadedVariant
from quantbench.run.kernel import kernel_ran, planned_kernel
from quantbench.run.record import KernelPath
from quantbench.server.auth import require_api_key
from quantbench.server.batcher import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_QUEUE_MS,
    DEFAULT_MAX_WAIT_MS,
    Metrics,
    MicroBatcher,
    QueueFull,
    QueueTimeout,
    padded_tokens,
)
from quantbench.server.schema import (
    BATCH_HEADER,
    DEMO_REQUEST,
    ERROR_RESPONSES,
    QUEUE_MS_HEADER,
    ClientGone,
    ErrorBody,
    Rejected,
    bound_long_state,
    decode_request,
    from_request_error,
    over_deadline,
    read_body,
)

log = logging.getLogger("quantbench.server")

DRAIN_TIMEOUT_S = 60.0
# A request body up to this size is parsed and tokenized on the event loop (well under a millisecond for a card
# request: the hop to the preparing thread and back cost more than the work); a larger one on the preparing thread,
# so that it never holds up the others.
INLINE_PREPARE_BYTES = 4096

KEEP_ALIVE_TIMEOUT_S = 5  # uvicorn's default: an idle keep-alive connection is closed after this


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
    planned: KernelPath | None = None  # the kernel path planned at load, before any forward
    warm_s: float | None = None  # the warm-up forwards after load (None: none were run)
    warm_error: str | None = None  # why the warm-up failed (the server serves all the same)


def _identity(loaded: LoadedVariant, machine: Any, state: ServerState) -> dict[str, Any]:
    """What /healthz reports as served: the variant's record, the device and the GPU, and the kernel path of the
    forward passes so far (`run`'s kernel_path: quantbench.run.kernel) with the engine's facts behind it."""
    device = str(getattr(loaded.engine, "device", "cpu"))
    gpu = getattr(machine, "gpu_name", None)
    if gpu is None:
        gpu = "cpu"
        if device.startswith("cuda"):
            import torch  # lazy: only an engine on CUDA gets here, and torch is loaded by then

            gpu = torch.cuda.get_device_name(device)
    info = loaded.info
    forwards = state.batcher.forwards if state.batcher else 0
    planned = state.planned or KernelPath(base=info.kernel_path)
    kernel, engine = kernel_ran(loaded, planned, device) if loaded.model is not None else (planned, {})
    return {
        "model": info.model_id,
        "variant": info.variant,
        # what the forwards so far ran (as `run` stores it), or before the first one what is planned
        "kernel_path": str(kernel),
        "kernel": {"planned": str(planned), "ran": str(kernel) if forwards else None, "forwards": forwards},
        "engine": jsonable_encoder(engine),
        "weight_format": info.weight_format,
        "compute_dtype": info.compute_dtype,
        "device": device,
        "gpu": gpu,
        "info": jsonable_encoder(asdict(info)),
        "machine": jsonable_encoder(asdict(machine))
        if is_dataclass(machine) and not isinstance(machine, type)
        else None,
    }


def _retry_after(state: ServerState, pending: int) -> int:
    """Seconds until the requests admitted now have been answered (at the mean forward pass so far), at least 1:
    Retry-After counts whole seconds."""
    batcher = state.batcher
    batches = max(1, math.ceil(pending / (batcher.max_batch if batcher else 1)))
    per_batch_s = state.metrics.forward_ms_total / 1000.0 / max(1, state.metrics.batches)
    return max(1, math.ceil(batches * per_batch_s))


def warm_sizes(max_batch: int, cuda: bool) -> list[int]:
    """The batches the warm-up runs: on a GPU 1, 2, 4 … max_batch (a CUDA graph bucket each); on a CPU one pass
    (no graphs to capture; at the 30B shape a CPU pass takes tens of seconds)."""
    if not cuda:
        return [1]
    return sorted({min(1 << i, max_batch) for i in range(max_batch.bit_length() + 1)})


def _warm_up(loaded: LoadedVariant, state: ServerState, max_batch: int) -> int:
    """On the loading thread: the demo request at each of `warm_sizes`, untimed and uncounted. Returns the forward
    passes run. A failure is logged and reported in /healthz (warm_error); serving goes on."""
    engine = loaded.engine
    sizes = warm_sizes(max_batch, str(getattr(engine, "device", "cpu")).startswith("cuda"))
    t0, done = time.perf_counter(), 0
    try:
        prepared = engine.prepare(parse_request(DEMO_REQUEST))
        warm = getattr(engine, "warm", None)  # an engine without CUDA graphs may not have it
        for n in sizes:
            batch = [prepared] * n
            if warm is not None:
                warm(batch)
            engine.forward_many(batch)
            done += 1
        engine.synchronize()
    except Exception as e:  # noqa: BLE001 - a warm-up that fails leaves a server that may still answer
        state.warm_error = f"{type(e).__name__}: {e}"
        log.warning("the warm-up forward passes failed (serving anyway): %s", state.warm_error)
    state.warm_s = time.perf_counter() - t0
    return done


def _error_response(state: ServerState, e: Rejected) -> JSONResponse:
    state.metrics.rejected[e.status] += 1
    return JSONResponse(e.body.model_dump(exclude_none=True), status_code=e.status, headers=e.headers)


def create_app(
    loader: Callable[[], LoadedVariant],
    *,
    api_key: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_queue_ms: float = DEFAULT_MAX_QUEUE_MS,
    warm: bool = False,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allow_truncation: bool = False,
    max_options: int = DEFAULT_MAX_OPTIONS,
    max_questions: int = DEFAULT_MAX_QUESTIONS,
    max_total_options: int = DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    machine: Any = None,
    media_limits: dict[str, int] | None = None,
) -> FastAPI:
    """The SystemOne app. `loader` runs in a background thread when the app starts (the port is open meanwhile).
    With `warm`, the loaded model answers the demo request (on a GPU at each power-of-two batch up to `max_batch`)
    before /healthz says ok (first-call costs, CUDA graph captures and the kernel report come before any client)."""
    if max_batch < 1 or max_queue < 1 or max_wait_ms < 0 or max_body_bytes < 1 or max_queue_ms < 0:
        raise ValueError("max_batch, max_queue and max_body_bytes must be >= 1, max_wait_ms and max_queue_ms >= 0")
    if max_request_tokens < 1 or not request_timeout_s > 0:
        raise ValueError("max_request_tokens must be >= 1 and request_timeout_s > 0")
    limits = Limits(max_options=max_options, max_questions=max_questions, max_total_options=max_total_options,
                    **(media_limits or {}))  # max_media_bytes, max_image_pixels, ... (quantbench.limits)
    state = ServerState()
    warmed = 0  # forward passes of the warm-up

    def loaded_ok(loaded: LoadedVariant) -> None:
        if hasattr(loaded.engine, "truncate"):
            loaded.engine.truncate = allow_truncation  # the server's flag decides, whatever the loader set
        if isinstance(getattr(loaded.engine, "limits", None), Limits):
            loaded.engine.limits = limits  # media is decoded under the server's limits (an engine that reads it)
        state.loaded = loaded  # load_s was taken when the loader returned: the warm-up is warm_s, apart
        state.batcher = MicroBatcher(
            loaded, max_batch=max_batch, max_wait_ms=max_wait_ms, max_queue=max_queue, metrics=state.metrics,
            max_batch_tokens=max_request_tokens, max_queue_ms=max_queue_ms,
        )
        state.batcher.forwards = warmed
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
            nonlocal warmed
            try:
                loaded = loader()
                state.load_s = time.monotonic() - state.started
                if loaded.model is not None:
                    state.planned = planned_kernel(loaded)  # before any forward changes what the layers report
                if warm:
                    warmed = _warm_up(loaded, state, max_batch)
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
        require_api_key(app, api_key)

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
            **_identity(state.loaded, machine, state),
            "load_s": state.load_s,
            "quantbench_version": quantbench.__version__,
            "max_batch": max_batch,
            "max_wait_ms": max_wait_ms,
            "max_queue": max_queue,
            "max_queue_ms": max_queue_ms,
            "warm_s": state.warm_s,
            "warm_error": state.warm_error,
            "allow_truncation": allow_truncation,
            "limits": {
                "max_body_bytes": max_body_bytes,
                "max_questions": max_questions,
                "max_options": max_options,
                "max_total_options": max_total_options,
                "max_request_tokens": max_request_tokens,
                "request_timeout_s": request_timeout_s,
                **{name: getattr(limits, name) for name in MEDIA_LIMITS},
            },
            "metrics": state.metrics.to_dict(),
        }
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        queued = state.batcher.pending if state.batcher else 0
        return JSONResponse({**state.metrics.to_dict(), "pending": queued, "max_queue": max_queue})

    def prepare(body: bytes) -> Any:
        """On the preparing thread: parse and check the body, tokenize it, check its tokens (no model work)."""
        engine = state.batcher.engine  # type: ignore[union-attr]  # requests reach here only once loaded
        # The engine's `modalities`: the media types its model reads (none: a text-only model).
        modalities = engine.modalities
        decision, cut = bound_long_state(engine, decode_request(body, limits=limits, modalities=modalities))
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
        responses=ERROR_RESPONSES,
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
            raise over_deadline(408, "its body did not arrive", request_timeout_s) from None
        except ClientGone:
            return _dropped(state, "disconnected")
        try:
            batcher.admit()  # before any parsing: an overloaded server refuses at the cost of a counter check
        except QueueFull:
            state.metrics.shed["queue_full"] += 1
            retry = _retry_after(state, batcher.pending)
            raise Rejected(
                503,
                ErrorBody(
                    detail=f"the queue is full ({max_queue} requests waiting)",
                    limit=max_queue,
                    fix=f"retry after {retry} s, or send fewer requests at once",
                ),
                headers={"Retry-After": str(retry)},
            ) from None
        gone = asyncio.ensure_future(_disconnected(request))
        queued = False
        try:
            try:
                if len(body) <= INLINE_PREPARE_BYTES:  # a small request: no hop to the preparing thread and back
                    prepared = prepare(body)
                else:
                    prepared = await _first(batcher.prepare(prepare, body), gone, deadline)
                answer = batcher.submit(prepared)
                queued = True
                answered = await _first(answer, gone, deadline)
            except TimeoutError:
                state.metrics.dropped["deadline"] += 1
                raise over_deadline(504, "it was dropped", request_timeout_s) from None
            except ClientGone:
                return _dropped(state, "disconnected")
            finally:
                if not queued:
                    batcher.release()
        except QueueTimeout as e:
            retry = _retry_after(state, batcher.pending)
            raise Rejected(
                503,
                ErrorBody(
                    detail=f"the server is overloaded: the request {e} before its forward pass, over the queue "
                    f"deadline of {max_queue_ms:g} ms ({flag('max_queue_ms')})",
                    limit=math.ceil(max_queue_ms),
                    fix=f"retry after {retry} s, or send fewer requests at once",
                ),
                headers={"Retry-After": str(retry)},
            ) from None
        except RequestError as e:  # the prompt is over the context, or another per-request problem
            raise from_request_error(422, e) from None
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
                BATCH_HEADER: str(answered.batch),
                QUEUE_MS_HEADER: f"{answered.queue_ms:.3f}",
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
    """Run the app under uvicorn until Ctrl-C / SIGTERM (in-flight requests finish). 1 if the model failed to load
    (why: app.state.qb.error, which `quantbench serve` prints)."""
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
    return 1 if state.error else 0


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
