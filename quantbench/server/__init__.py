"""The SystemOne HTTP server: `quantbench serve` answers POST /v1/systemone with any backend's loaded model.

    app = create_app(lambda: get_backend("int4").load(spec, machine))   # the loader runs in the background
    serve(app, host="127.0.0.1", port=8000)

The port opens at once; GET /healthz answers 503 {"status": "loading"} until the loader returns, then 200 with
what is served. Requests are validated with the protocol's own classes (one definition), queued, and answered
in micro-batches: requests that queued while the model was busy (and, with `max_wait_ms` > 0, those arriving
that much later), up to `max_batch` of them, go through ONE `engine.forward_many` call, on one worker thread
so the event loop never runs the model. A request is admitted before it is parsed: past `max_queue` admitted
requests it gets 503 with Retry-After at once, and one still queued after `max_queue_ms` gets it then (batcher.py);
bad input gets a 4xx naming the field, and the server keeps serving. The model is loaded as `run`'s child loads it
(`quantbench serve` builds the same RunSpec), and /healthz reports the kernel path its forward passes ran
(quantbench.run.kernel, as `run` stores it).
A response's `model_ms` is the forward pass that answered it (shared by its batch; the batch size is in the
X-Quantbench-Batch header, and GET /metrics counts batch sizes).

One request cannot take the server down (quantbench.limits, each a flag of `quantbench serve`): the body size,
the questions, the options per question and in total are checked on the parsed JSON (413 / 422 naming the limit
and its flag), then the tokens of its sequences after tokenizing, all before any model work. Parsing and
tokenizing a body over 4 KB run on their own thread, so a large request does not hold up the forward passes of
others (a small one is done on the event loop: the hop cost more than the work); a batch
holds at most max_request_tokens padded tokens. Every request has a deadline (--request-timeout: 408 while its
body is read, 504 after); a request whose client has gone, or whose deadline has passed, is dropped before its
forward pass. A connection that sends no complete request headers within --header-timeout is closed.
The model worker gives memory that malloc kept back to the OS when the queue empties (see
batcher.TRIM_MIN_INTERVAL_S).

The package, one responsibility a module (each imports only those listed before it):
    settings.py ServerSettings: every setting of the server declared once (the `serve` flags derive from it)
    schema.py   the wire schema: request decoding, error bodies, the state's prefix and bound
    batcher.py  the micro-batcher (its own model thread), its metrics, admission and queue, malloc_trim
    auth.py     the API key check
    endpoint.py POST /v1/systemone as a plain ASGI app, with Server-Timing; the server's state
    app.py      create_app (the routes, /healthz, /metrics, the OpenAPI schema), serve, demo
    command.py  cli_serve, behind `quantbench serve` (the only part that prints)
"""

from importlib import import_module
from typing import Any

# Each name from its module, imported when first used: the load generator's worker processes read the wire schema
# (schema.py) without loading the app, uvicorn and the backends.
_HOME = {
    "DEFAULT_MAX_BATCH": "batcher",
    "DEFAULT_MAX_WAIT_MS": "batcher",
    "DEMO_REQUEST": "schema",
    "cli_serve": "command",
    "create_app": "app",
    "demo": "app",
    "malloc_trim": "batcher",
    "serve": "app",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(import_module(f"quantbench.server.{_HOME[name]}"), name)
    raise AttributeError(f"module 'quantbench.server' has no attribute {name!r}")
