"""One keep-alive HTTP/1.1 connection of the load generator: a request prebuilt as bytes goes out in one write, and
its response (Content-Length, chunked, or up to the server's close) is read back with asyncio streams.

Not httpx: httpx's AsyncClient took 2.0-2.8 ms of the generator's CPU a request on the 2-core VM (this: 0.23), so at
128 clients one generator process was the limit of the measurement, not the server (docs/BENCHMARKS.md). A load
generator sends the same few requests many times and reads what comes back; that is all this does.

A connection the server has closed while it sat idle (keep-alive timeout) is opened again and the request sent
again, but only when not one byte of a response had come: the server had not read it. Anything else wrong is the
caller's to count (ConnectionError, TimeoutError, or HttpError for a response that is not HTTP/1.x)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 65536  # a response's status line and headers (the stream's own limit)
# A response's body: a decision's answer is a few KB. Unbounded, a server streaming chunks without end (or a
# Content-Length of terabytes) had the load client hold all of it in memory until --timeout.
MAX_BODY_BYTES = 16 << 20


class HttpError(Exception):
    """The server's bytes are not an HTTP/1.x response this client can read."""


class ConnectFailed(ConnectionError):
    """No connection could be opened (nothing listens there, or TLS failed)."""


@dataclass(frozen=True)
class Target:
    """Where requests go: host, port, TLS, and the path of /v1/systemone (with any prefix of the endpoint)."""

    host: str
    port: int
    tls: bool
    path: str

    @classmethod
    def from_url(cls, url: str) -> Target:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        return cls(parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls, parts.path or "/")

    def request(self, body: bytes, headers: dict[str, str]) -> bytes:
        """A POST of `body` with `headers`, as the bytes that go on the wire."""
        # an IPv6 address in brackets (RFC 7230): "Host: ::1:8000" named another host, and the server refused it
        host = f"[{self.host}]" if ":" in self.host else self.host
        host = host if self.port in (80, 443) else f"{host}:{self.port}"
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]  # names lower case
    body: bytes


class Connection:
    """One connection, one request at a time."""

    def __init__(self, target: Target):
        self.target = target
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.used = False  # has answered a request: a failure before any byte may be a stale keep-alive

    @property
    def open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing() and not self._reader.at_eof()  # type: ignore[union-attr]

    async def connect(self) -> None:
        t = self.target
        context = ssl.create_default_context() if t.tls else None
        try:
            self._reader, self._writer = await asyncio.open_connection(
                t.host, t.port, ssl=context, limit=MAX_HEAD_BYTES, server_hostname=t.host if t.tls else None)
        except OSError as e:  # refused, unreachable, TLS
            raise ConnectFailed(f"{t.host}:{t.port}: {e}") from e
        self.used = False

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def send(self, request: bytes) -> Response:
        """Send one prebuilt request and read its response. Closes the connection on any failure (its state is
        then unknown) and when the server says it will close it."""
        if not self.open:
            self.close()
            await self.connect()
        try:
            try:
                response = await self._exchange(request)
            except _NothingBack:
                if not self.used:
                    raise ConnectionError("the server closed the connection without answering") from None
                self.close()  # closed by the server while idle: it never read the request
                await self.connect()
                response = await self._exchange(request)
        except BaseException:
            self.close()
            raise
        self.used = True
        if response.headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return response

    async def _exchange(self, request: bytes) -> Response:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        writer.write(request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise _NothingBack from None
            raise ConnectionError("the server closed the connection within a response's headers") from None
        except asyncio.LimitOverrunError:
            raise HttpError(f"a response's headers are over {MAX_HEAD_BYTES} bytes") from None
        status, headers = _parse_head(head)
        while 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            status, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
        body = b"" if status in (204, 304) else await _read_body(reader, headers)
        return Response(status, headers, body)


class _NothingBack(Exception):
    """The connection ended before any byte of the response."""


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
        raise HttpError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError(f"not a header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if version == b"HTTP/1.0" and headers.get(b"connection", b"").lower() != b"keep-alive":
        headers[b"connection"] = b"close"  # an HTTP/1.0 server closes after each response unless it says otherwise
    return int(rest[:3]), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> bytes:
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        chunks, received = [], 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError(f"not a chunk size: {size_line[:20]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, up to the empty line
                    pass
                return b"".join(chunks)
            received += size
            if received > MAX_BODY_BYTES:
                raise HttpError(f"a response's body is over {MAX_BODY_BYTES >> 20} MiB (chunked)")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = headers.get(b"content-length")
    if length is not None:
        if not length.isdigit():
            raise HttpError(f"Content-Length {length[:20]!r} is not a number")
        if int(length) > MAX_BODY_BYTES:
            raise HttpError(f"a response's body is over {MAX_BODY_BYTES >> 20} MiB (Content-Length {int(length):,})")
        return await reader.readexactly(int(length))
    headers[b"connection"] = b"close"  # neither: the body is what comes until the server closes
    body = await reader.read(MAX_BODY_BYTES + 1)
    while len(body) <= MAX_BODY_BYTES and (more := await reader.read(MAX_BODY_BYTES + 1 - len(body))):
        body += more
    if len(body) > MAX_BODY_BYTES:
        raise HttpError(f"a response's body is over {MAX_BODY_BYTES >> 20} MiB (read until the server closes)")
    return body
