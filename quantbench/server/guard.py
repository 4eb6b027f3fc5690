"""Which requests a local server takes at all: only those addressed to a name it serves (the Host header).

A server on 127.0.0.1 is reachable from every web page the machine's browser opens. The same-origin policy stops
a page from reading the answers, but not DNS rebinding: a page at attacker.example whose name is then made to
resolve to 127.0.0.1 sends requests the browser considers same-origin, with `Host: attacker.example:8000`. Every
request whose Host is not one of the server's names is therefore refused (400, naming the header and the flag)
before any route sees it: by default the loopback names (localhost, 127.0.0.1, [::1]); `--allowed-host NAME`
adds a name (the machine's name or address when serving on the network), `--allowed-host '*'` lifts the check.
The POST route takes only `Content-Type: application/json` (endpoint.py), so a page's plain form or `text/plain`
fetch, which a browser sends without asking the server first, is refused too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from quantbench.server.schema import ErrorBody

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
ANY_HOST = "*"
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """The Host names a server bound to `bind` answers: the loopback names, `bind` itself when it is a name or
    an address (not a wildcard), and `extra` (--allowed-host). None: any (`*` among `extra`)."""
    names = {host_name(name) for name in extra}
    if ANY_HOST in names:
        return None
    if bind not in WILDCARD_BINDS:
        names.add(host_name(bind))
    return frozenset(LOOPBACK_HOSTS | names)


def host_name(value: str) -> str:
    """The name of a Host header value or a flag: without its port and brackets, lower case, no trailing dot
    (`[::1]:8000` -> `::1`, `LocalHost.:80` -> `localhost`)."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") > 1:  # a bare IPv6 address, or one with a port appended without brackets
        try:
            return str(ipaddress.IPv6Address(value))
        except ValueError:
            head, _, port = value.rpartition(":")
            return head if port.isdigit() else value
    return value.rpartition(":")[0].rstrip(".") if ":" in value else value.rstrip(".")


class HostGuard:
    """ASGI middleware: 400 to every HTTP request whose Host header is not one of `allowed` (or has none)."""

    def __init__(self, app: Any, allowed: frozenset[str], on_reject: Callable[[], None]):
        self.app, self.allowed, self.on_reject = app, allowed, on_reject

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Callable[..., Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((value for key, value in scope["headers"] if key == b"host"), b"")
        name = host_name(raw.decode("latin-1"))
        if name in self.allowed:
            await self.app(scope, receive, send)
            return
        self.on_reject()
        shown = raw.decode("latin-1")[:80]
        body = ErrorBody(
            detail=f"the Host header {shown!r} is not a name this server answers to; a request addressed to another "
            "name is refused (a web page could otherwise reach this server by DNS rebinding)",
            field="Host",
            fix=f"connect as {', '.join(sorted(self.allowed))}, or start the server with --allowed-host NAME",
        ).model_dump_json(exclude_none=True).encode()
        await send({"type": "http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]})
        await send({"type": "http.response.body", "body": body})
