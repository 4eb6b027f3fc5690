"""What `quantbench load` sends, and what the server says it is: request bodies encoded once, before any timing,
and the server's /healthz (optional: a SystemOne server need not have one)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from quantbench.errors import ConfigError
from quantbench.limits import Limits
from quantbench.protocol import parse_request
from quantbench.protocol.endpoint import checked_endpoint
from quantbench.protocol.media import inline_media_paths
from quantbench.protocol.suite import load_suite
from quantbench.server.schema import DEMO_REQUEST

CARD_EXAMPLE = "card-example"
READY_POLL_S = 0.5


@dataclass(frozen=True)
class Bodies:
    """The requests a load run sends, round robin: JSON bodies ready to post."""

    source: str  # the suite's id, or card-example
    suite_hash: str | None
    bodies: list[bytes]


def endpoint_url(endpoint: str) -> str:
    """The server's base URL (`--endpoint`), checked; the full /v1/systemone URL is accepted too."""
    return checked_endpoint(endpoint)


def request_bodies(suite: str | None, card_example: bool) -> Bodies:
    """The built-in suite's records (default), a suite file's, or the card's example request alone."""
    if card_example:
        if suite is not None:
            raise ConfigError("--suite and --card-example: give one of them (the default is the built-in suite)")
        body = parse_request(DEMO_REQUEST).model_dump(mode="json", exclude_none=True)
        return Bodies(CARD_EXAMPLE, None, [json.dumps(body).encode()])
    loaded = load_suite(suite)
    base = Path(suite).parent if suite else None
    bodies = []
    for record in loaded.records:
        sent = inline_media_paths(record.request, Limits(), base=base)  # a path part travels as its data URI
        bodies.append(json.dumps(sent.model_dump(mode="json", exclude_none=True), ensure_ascii=False).encode())
    return Bodies(loaded.id, loaded.hash, bodies)


def server_health(client: httpx.Client, endpoint: str, ready_timeout_s: float) -> dict[str, Any] | None:
    """The server's /healthz once it answers 200 (its JSON, or None for a server without one: 404, not JSON).
    Refuses, naming --endpoint and the fix, a server that does not answer at all, wants a key it was not given,
    failed to load, or stays at 503 past `ready_timeout_s`. Nothing is measured or stored before this passes."""
    url = endpoint + "/healthz"
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            r = client.get(url, timeout=10.0)
        except httpx.TransportError as e:
            raise ConfigError(
                f"--endpoint {endpoint}: nothing answers there ({type(e).__name__}: {e or 'no reply'}); start the "
                "server (e.g. `quantbench serve --port 8000`) or fix the URL; nothing was measured or stored") from e
        if r.status_code == 401:
            raise ConfigError(f"--endpoint {endpoint}: the server wants an API key; pass --api-key or set "
                              "QUANTBENCH_API_KEY")
        if r.status_code in (404, 405):
            return None  # a SystemOne server without /healthz: measured all the same, its identity unknown
        if 400 <= r.status_code < 500 and r.status_code not in (408, 425, 429):
            # what a wait will not change (quantbench serve's 400 for a Host name it does not answer to): said at
            # once with the server's own words, not after --ready-timeout as "still answers 400"
            raise ConfigError(f"--endpoint {endpoint}: /healthz answers {r.status_code}: "
                              f"{_said(r)}; nothing was measured or stored")
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code == 200:
            return body if isinstance(body, dict) else None
        if r.status_code == 503 and isinstance(body, dict) and body.get("status") == "failed":
            raise ConfigError(f"--endpoint {endpoint}: the server failed to load its model: {body.get('error')}")
        if time.monotonic() > deadline:
            raise ConfigError(f"--endpoint {endpoint}: /healthz still answers {r.status_code} after "
                              f"{ready_timeout_s:g} s (--ready-timeout); nothing was measured or stored")
        time.sleep(READY_POLL_S)


def _said(r: httpx.Response) -> str:
    """What a refusal says: its JSON `detail` and `fix` (quantbench's error body), or the start of its text."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return "; ".join(str(body[k])[:300] for k in ("detail", "fix") if body.get(k))
    return r.text[:200].strip() or r.reason_phrase or "no body"
