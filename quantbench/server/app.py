"""The SystemOne app: `create_app` wires the loader, the micro-batcher, the API key check and the routes
(/v1/systemone, /healthz, /metrics, the OpenAPI schema); `serve` runs it under uvicorn; `demo` answers one
decision without a server."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, is_dataclass, replace
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.auto import AutoHTTPProtocol

import quantbench
from quantbench.limits import DEFAULT_HEADER_TIMEOUT_S, MEDIA_LIMITS, Limits
from quantbench.protocol import DecisionRequest, DecisionResponse, parse_request
from quantbench.protocol.endpoint import PATH
from quantbench.run.backend import LoadedVariant
from quantbench.run.kernel import kernel_ran, planned_kernel
from quantbench.run.record import KernelPath
from quantbench.server.auth import require_api_key
from quantbench.server.batcher import MicroBatcher
from quantbench.server.endpoint import ServerState, SystemOneEndpoint
from quantbench.server.guard import HostGuard, allowed_hosts
from quantbench.server.prepare import DEFAULT_HEAVY_THREADS, DEFAULT_LIGHT_THREADS, PreparePool
from quantbench.server.schema import DEMO_REQUEST, ERROR_RESPONSES, ErrorBody, shortened
from quantbench.server.settings import ServerSettings
from quantbench.server.warm import warm_up

log = logging.getLogger("quantbench.server")

DRAIN_TIMEOUT_S = 60.0

KEEP_ALIVE_TIMEOUT_S = 5  # uvicorn's default: an idle keep-alive connection is closed after this


# -- the app ------------------------------------------------------------------------------------------------------
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


# What /healthz leaves out unless the server has an API key (and so the caller gave it): where the model lies on
# the server's disk (model_path, and any path among its facts), and the machine (its name, OS, memory, CPU). A
# client needs what is served (the model, its hashes, the kernel path, a checkpoint scorer's class and digests)
# and its limits.
PATH_SHOWN_AS = "(a path on the server)"


def _without_paths(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    if isinstance(value, str) and (value.startswith(("/", "~")) or re.match(r"[A-Za-z]:[\\/]", value)):
        return PATH_SHOWN_AS
    return value


# a path inside a message: POSIX absolute or home-relative (after a quote, space, bracket, = or the start), or a
# Windows drive path; up to the next quote, space, comma or bracket (an OSError quotes its path), a sentence's
# colon or full stop after it kept
_PATH_IN_TEXT = re.compile(r"""(?:(?<=^)|(?<=[\s'"(\[=]))(?:~?/|[A-Za-z]:[\\/])(?:[^\s'",()\[\]]*[^\s'",()\[\].:;])?""")


def without_paths_in_text(text: str) -> str:
    """A message (a load or warm-up error) with every path in it replaced by PATH_SHOWN_AS."""
    return _PATH_IN_TEXT.sub(PATH_SHOWN_AS, text)


def public_health(body: dict[str, Any]) -> dict[str, Any]:
    """/healthz as a caller without a key sees it: what a client needs (status, the model, variant, kernel path,
    device and GPU, batching, limits, counts, why the warm-up failed), without the machine, the model's path or
    any other path (an error's own text names the files it could not read; a load error: ServerState.shown_error)."""
    out = {k: v for k, v in body.items() if k != "machine"}
    if isinstance(out.get("info"), dict):
        out["info"] = _without_paths({k: v for k, v in out["info"].items() if k != "model_path"})
    if isinstance(out.get("warm_error"), str):
        out["warm_error"] = without_paths_in_text(out["warm_error"])
    return out


ROUTES = f"POST {PATH} (a JSON decision request), GET /healthz, GET /metrics, GET /openapi.json"


def route_error(method: str, path: str, e: StarletteHTTPException) -> ErrorBody:
    """The body of a 404 / 405: the method or path that is not served, and the routes that are."""
    shown = shortened(path, 200)
    if e.status_code == 405:
        return ErrorBody(detail=f"{method[:20]} is not a method {shown} answers", field="method",
                         fix=f"send {(getattr(e, 'headers', None) or {}).get('Allow', 'GET')} {shown}; routes: {ROUTES}")
    if e.status_code == 404:
        return ErrorBody(detail=f"no route {shown}", field="path", fix=f"use one of the routes: {ROUTES}")
    return ErrorBody(detail=str(e.detail), field="request")


# An app made in code (a test, a benchmark) answers at once; `quantbench serve` warms up first (--warm, its default).
APP_DEFAULTS = ServerSettings(warm=False)


def create_app(
    loader: Callable[[], LoadedVariant],
    settings: ServerSettings | None = None,
    *,
    machine: Any = None,
    prepare_threads: int = DEFAULT_LIGHT_THREADS,
    heavy_prepare_threads: int = DEFAULT_HEAVY_THREADS,
    **changes: Any,
) -> FastAPI:
    """The SystemOne app, serving with `settings` (quantbench.server.settings; None: APP_DEFAULTS), each of
    `changes` a setting by name over them (`create_app(load, max_batch=8)`). `loader` runs in a background thread
    when the app starts (the port is open meanwhile). With `warm`, the loaded model answers the demo request (on a
    GPU at each power-of-two batch up to `max_batch`, at its own width and padded to each of `warm_tokens`) before
    /healthz says ok (first-call costs, CUDA graph captures and the kernel report come before any client). It
    answers requests addressed to the Host names of `host` and `allowed_hosts` (guard.py). Requests are prepared on
    a PreparePool of `prepare_threads` light and `heavy_prepare_threads` heavy threads (prepare.py)."""
    s = replace(settings or APP_DEFAULTS, **changes)  # a bad value is refused here, naming its flag
    limits = s.limits()  # questions, options, media (quantbench.limits)
    state = ServerState()
    warmed = 0  # forward passes of the warm-up

    def loaded_ok(loaded: LoadedVariant) -> None:
        if hasattr(loaded.engine, "truncate"):
            loaded.engine.truncate = s.allow_truncation  # the server's flag decides, whatever the loader set
        if isinstance(getattr(loaded.engine, "limits", None), Limits):
            loaded.engine.limits = limits  # media is decoded under the server's limits (an engine that reads it)
        state.loaded = loaded  # load_s was taken when the loader returned: the warm-up is warm_s, apart
        state.batcher = MicroBatcher(
            loaded, max_batch=s.max_batch, max_wait_ms=s.max_wait_ms, max_queue=s.max_queue, metrics=state.metrics,
            max_batch_tokens=s.max_request_tokens, max_queue_ms=s.max_queue_ms,
        )
        state.batcher.forwards = warmed
        state.pool = PreparePool(prepare_threads, heavy_prepare_threads)
        state.batcher.start()
        log.info("model %s (%s) loaded in %.1f s", loaded.info.model_id, loaded.info.variant, state.load_s)

    def load_failed(message: str) -> None:
        state.shown_error = message if s.api_key else without_paths_in_text(message)
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
                if s.warm:
                    warmed = warm_up(loaded, state, s.max_batch, s.warm_tokens)
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
        if state.pool:
            await state.pool.shutdown()

    app = FastAPI(
        title="quantbench SystemOne server",
        version=quantbench.__version__,
        description="Per-option probabilities for decision questions (the SystemOne API).",
        lifespan=lifespan,
    )
    app.state.qb = state

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        """A wrong method or path answers as every other error does: what is wrong, where, and the fix (FastAPI
        said only {"detail": "Method Not Allowed"})."""
        return JSONResponse(route_error(request.method, request.url.path, e).model_dump(exclude_none=True),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    if s.api_key:
        require_api_key(app, s.api_key)
    allowed = allowed_hosts(s.host, s.allowed_hosts)  # None: any
    if allowed is not None:  # added last, so it runs first: no other layer sees a foreign Host
        app.add_middleware(HostGuard, allowed=allowed, on_reject=lambda: state.metrics.rejected.update([400]))

    @app.get("/healthz", responses={503: {"description": "The model is still loading, or failed to load."}})
    async def healthz() -> JSONResponse:
        if state.error:
            return JSONResponse({"status": "failed", "error": state.shown_error}, status_code=503)
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
            "max_batch": s.max_batch,
            "max_wait_ms": s.max_wait_ms,
            "max_queue": s.max_queue,
            "max_queue_ms": s.max_queue_ms,
            "warm_s": state.warm_s,
            "warm_tokens": list(s.warm_tokens),
            "warm_error": state.warm_error,
            "allow_truncation": s.allow_truncation,
            "limits": {
                "max_body_bytes": s.max_body_bytes,
                "max_questions": s.max_questions,
                "max_options": s.max_options,
                "max_total_options": s.max_total_options,
                "max_request_tokens": s.max_request_tokens,
                "request_timeout_s": s.request_timeout_s,
                **{name: getattr(limits, name) for name in MEDIA_LIMITS},
            },
            "metrics": state.metrics.to_dict(),
        }
        return JSONResponse(body if s.api_key else public_health(body))

    @app.get("/metrics")
    async def metrics() -> JSONResponse:
        queued = state.batcher.pending if state.batcher else 0
        prepare = state.pool.counts.to_dict() if state.pool else None
        return JSONResponse({**state.metrics.to_dict(), "pending": queued, "max_queue": s.max_queue,
                             "prepare": prepare})

    @app.post(
        PATH,
        response_model=DecisionResponse,
        responses=ERROR_RESPONSES,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecisionRequest"}}},
            }
        },
    )
    def systemone() -> DecisionResponse:  # what the OpenAPI schema says of the route; its ASGI app answers
        raise AssertionError("served by endpoint.SystemOneEndpoint")

    # FastAPI documents the route (the protocol's own classes, above); SystemOneEndpoint answers it as a plain ASGI
    # app, without FastAPI's request handling in between (endpoint.py says what that saves).
    route = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == PATH)
    route.app = SystemOneEndpoint(
        state, limits=limits, max_body_bytes=s.max_body_bytes, max_request_tokens=s.max_request_tokens,
        request_timeout_s=s.request_timeout_s, max_queue=s.max_queue, max_queue_ms=s.max_queue_ms,
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes,
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
class CoalescedWrites:
    """A connection's transport whose writes within one step of the event loop leave in one send. uvicorn writes a
    response's status line and headers, its body and (h11) its end in separate calls; each send on loopback woke
    the client on its own, and with the cores busy each cost 0.3-0.4 ms (docs/BENCHMARKS.md). Everything else is
    the transport's own; closing sends what is pending first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending and not self._transport.is_closing():
            self._transport.write(b"".join(self._pending))
        self._pending.clear()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools or h11, as uvicorn would choose) with a header timeout: a connection
    that has no request in flight `header_timeout_s` after it opened, or after its last response, is closed.
    uvicorn's own keep-alive timeout stops as soon as any byte arrives, so without this a client that sends
    half a request line and stalls holds its connection forever."""
    base: Any = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[misc,valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescedWrites(transport, self.loop))  # type: ignore[arg-type]
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
    access_log: bool = False,
) -> int:
    """Run the app under uvicorn until Ctrl-C / SIGTERM (in-flight requests finish). 1 if the model failed to load
    (why: app.state.qb.error, which `quantbench serve` prints). `access_log`: a line per request on stderr (off by
    default: at hundreds of requests a second it is work on the event loop that answers them)."""
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
        access_log=access_log,
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
