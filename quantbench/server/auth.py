"""The API key check: with a key set, every request must carry it (Authorization: Bearer, or X-API-Key)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from quantbench.server.schema import ErrorBody

API_KEY_ENV = "QUANTBENCH_API_KEY"


def require_api_key(app: FastAPI, key: str) -> None:
    """Answer 401 to every request that does not carry `key` (compared in constant time)."""
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
