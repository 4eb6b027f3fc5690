"""The API key check: with a key set, every request must carry it (Authorization: Bearer, or X-API-Key).

A plain ASGI middleware, not a FastAPI `@app.middleware("http")` one: that kind hands every request and response
through memory streams on their own task, a cost each request would pay before the key is even read."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI

from quantbench.server.schema import ErrorBody

UNAUTHORIZED = ErrorBody(
    detail="missing or wrong API key",
    field="Authorization",
    fix="send the header 'Authorization: Bearer <key>' (or 'X-API-Key: <key>')",
).model_dump_json(exclude_none=True).encode()


class ApiKeyMiddleware:
    """Answers 401 to every HTTP request that does not carry `key` (compared in constant time); `on_reject` counts
    them."""

    def __init__(self, app: Any, key: str, on_reject: Callable[[], None]):
        self.app, self.expected, self.on_reject = app, key.encode(), on_reject

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Callable[..., Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        auth, given, twice = b"", b"", None
        for name, value in scope["headers"]:
            if name == b"authorization":
                twice, auth = twice or (name if auth else None), value
            elif name == b"x-api-key":
                twice, given = twice or (name if given else None), value
        if auth[:7].lower() == b"bearer ":
            given = auth[7:]
        # A header sent twice is refused whatever its values: which one counts would otherwise depend on the order
        # (the last one did: a wrong key then the right one was let in, the right one then a wrong one was not).
        if twice is None and hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        self.on_reject()
        body = UNAUTHORIZED if twice is None else duplicated(twice.decode("latin-1"))
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]})
        await send({"type": "http.response.body", "body": body})


def duplicated(header: str) -> bytes:
    """The 401 body for a request that sends its key header more than once."""
    shown = "Authorization" if header == "authorization" else "X-API-Key"
    return ErrorBody(
        detail=f"the {shown} header is sent more than once; a request carries its API key once",
        field=shown,
        fix=f"send one {shown} header ('Authorization: Bearer <key>' or 'X-API-Key: <key>')",
    ).model_dump_json(exclude_none=True).encode()


def require_api_key(app: FastAPI, key: str) -> None:
    """Answer 401 to every request that does not carry `key`."""

    def count() -> None:
        app.state.qb.metrics.rejected[401] += 1

    app.add_middleware(ApiKeyMiddleware, key=key, on_reject=count)
