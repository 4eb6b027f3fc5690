"""The load generator's own HTTP/1.1 client and its processes: responses with Content-Length, chunked, HTTP/1.0 and
Connection: close are read whole; a keep-alive connection the server closed while idle is opened again (and only
then is a request sent twice); Server-Timing is parsed; a closed-loop client waits out Retry-After unless told not
to; a step split over generator processes keeps its clients, requests and rate, and two processes drive a real
server to the same counts as one."""

from __future__ import annotations

import asyncio
import time

import pytest

from quantbench.load import LoadSettings, run_load
from quantbench.load.client import Pool, closed_loop, send, server_timing
from quantbench.load.driver import StepPlan, plans_for, split
from quantbench.load.http import Connection, Target
from quantbench.server import create_app
from tests.test_http_backend import ThreadServer
from tests.test_load import tiny_loaded

BODY = b'{"model": "m", "model_ms": 1.5}'


class RawServer:
    """A TCP server on loopback that answers each request with `reply(n)` (n counts the requests of the
    connection) and closes the connection after it when `close_after(n)`; it counts connections and requests."""

    def __init__(self, reply, close_after=lambda n: False):
        self.reply, self.close_after = reply, close_after
        self.connections = self.requests = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                n += 1
                self.requests += 1
                writer.write(self.reply(n))
                await writer.drain()
                if self.close_after(n):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> Target:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return Target("127.0.0.1", port, False, "/v1/systemone")

    async def __aexit__(self, *exc) -> None:
        self.server.close()


def run(coro):
    return asyncio.run(coro)


def content_length(n: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Quantbench-Queue-Ms: 0.25\r\n\r\n" % len(BODY) + BODY


@pytest.mark.parametrize("reply", [
    lambda n: content_length(n),
    lambda n: (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:9], BODY[9:])) + b"0\r\n\r\n"),
    lambda n: b"HTTP/1.1 100 Continue\r\n\r\n" + content_length(n),
], ids=["content_length", "chunked", "interim_100"])
def test_a_response_is_read_whole_and_the_connection_kept(reply):
    async def go():
        async with RawServer(reply) as target:
            conn = Connection(target)
            first = await send(conn, target.request(b"{}", {}), timeout_s=5)
            second = await send(conn, target.request(b"{}", {}), timeout_s=5)
            return first, second, conn.open

    first, second, still_open = run(go())
    assert first.status == second.status == "200" and first.model_ms == 1.5
    assert still_open


def test_connection_close_and_http_1_0_end_the_connection_and_the_next_request_opens_another():
    replies = {
        "close": lambda n: b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
        "http10": lambda n: b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
        "until_eof": lambda n: b"HTTP/1.0 200 OK\r\n\r\n" + BODY,
    }
    for name, reply in replies.items():
        async def go(reply=reply):
            server = RawServer(reply, close_after=lambda n: True)
            async with server as target:
                conn = Connection(target)
                samples = [await send(conn, target.request(b"{}", {}), timeout_s=5) for _ in range(3)]
                return samples, server.connections

        samples, connections = run(go())
        assert [s.status for s in samples] == ["200"] * 3 and samples[0].model_ms == 1.5, name
        assert connections == 3, name


def test_a_keep_alive_connection_closed_by_the_server_while_idle_is_opened_again_and_the_request_sent_once():
    async def go():
        server = RawServer(content_length, close_after=lambda n: n == 1)  # closes after its first answer
        async with server as target:
            conn = Connection(target)
            first = await send(conn, target.request(b"{}", {}), timeout_s=5)
            await asyncio.sleep(0.1)  # the server's close arrives while the connection is idle
            second = await send(conn, target.request(b"{}", {}), timeout_s=5)
            return first, second, server.requests, server.connections

    first, second, requests, connections = run(go())
    assert (first.status, second.status) == ("200", "200")
    assert requests == 2 and connections == 2  # the second request reached the server once, on a new connection


def test_a_used_connection_that_ends_before_any_byte_of_the_answer_is_opened_again_and_the_request_resent():
    async def go():
        # the second request on a connection finds it closing (the race with an idle close): nothing comes back
        server = RawServer(lambda n: content_length(n) if n == 1 else b"", close_after=lambda n: n == 2)
        async with server as target:
            conn = Connection(target)
            first = await send(conn, target.request(b"{}", {}), timeout_s=5)
            second = await send(conn, target.request(b"{}", {}), timeout_s=5)
            return first, second, server.connections

    first, second, connections = run(go())
    assert (first.status, second.status, connections) == ("200", "200", 2)


def test_a_server_that_closes_without_answering_a_fresh_connection_is_a_transport_error():
    async def go():
        async with RawServer(lambda n: b"", close_after=lambda n: True) as target:
            return await send(Connection(target), target.request(b"{}", {}), timeout_s=5)

    assert run(go()).status == "transport"


def test_nothing_listening_is_a_connect_error():
    from tests.test_server import free_port

    target = Target("127.0.0.1", free_port(), False, "/")
    assert run(send(Connection(target), target.request(b"{}", {}), timeout_s=5)).status == "connect"


def test_server_timing_spans_are_read_in_ms():
    assert server_timing(b'read;dur=0.1, prepare;dur="0.4";desc="tokenize", miss, app;dur=13') == {
        "read": 0.1, "prepare": 0.4, "app": 13.0}
    assert server_timing(None) is None


@pytest.mark.parametrize("honor", [True, False])
def test_a_closed_loop_client_waits_out_retry_after_unless_told_not_to(honor):
    refused = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\n{}"

    async def go():
        server = RawServer(lambda n: refused)
        async with server as target:
            pool = Pool(target)
            t0 = time.monotonic()
            samples, _ = await closed_loop(pool, [target.request(b"{}", {})], concurrency=1, count=1000,
                                           seconds=0.5, timeout_s=5, honor_retry_after=honor)
            pool.close()
            return samples, time.monotonic() - t0

    samples, took = run(go())
    assert all(s.status == "503" and s.retry_after_s == 1.0 for s in samples)
    if honor:
        assert len(samples) == 1 and took < 0.9  # waited (the step's end cut the 1 s wait short), sent no more
    else:
        assert len(samples) > 10


def test_a_step_split_over_processes_keeps_its_clients_requests_and_rate():
    assert split(10, 3) == [4, 3, 3] and split(2, 4) == [1, 1, 0, 0]
    closed = plans_for(StepPlan(concurrency=5, rate=None, count=100, seconds=9, offset=7), 2)
    assert [p.concurrency for p in closed] == [3, 2] and [p.count for p in closed] == [60, 40]
    assert [p.offset for p in closed] == [7, 67] and len({p.seed for p in closed}) == 2
    few = plans_for(StepPlan(concurrency=1, rate=None, count=10, seconds=9), 3)
    assert [p.concurrency for p in few] == [1, 0, 0] and [p.count for p in few] == [10, 0, 0]
    opened = plans_for(StepPlan(concurrency=None, rate=90.0, count=31, seconds=9), 3)
    assert [p.rate for p in opened] == [30.0] * 3 and [p.count for p in opened] == [11, 10, 10]


def test_two_generator_processes_drive_a_real_server_to_the_same_counts():
    loaded = tiny_loaded()
    with ThreadServer(create_app(lambda: loaded, max_batch=8)) as server:
        result = run_load(LoadSettings(endpoint=server.url, concurrency=[1, 4], requests=12, seconds=60, warmup=2,
                                       processes=2))
    assert [(s.concurrency, s.sent, s.ok) for s in result.steps] == [(1, 12, 12), (4, 12, 12)]
    assert all(0 < s.client_cpu < 2 for s in result.steps)  # the busiest generator process's share of a core
    assert result.run.settings["processes"] == 2
    # quantbench's server says where the time went: the breakdown has its spans
    assert {"read", "prepare", "queue", "forward", "app", "outside", "e2e", "other"} <= set(result.breakdown[0])
