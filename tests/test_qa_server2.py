"""The server, its request protocol and `quantbench load` against hostile and careless peers (QA, second round):
each test is a case that once got a traceback, a wrong answer or a useless wait. The server in process through
TestClient with the tiny model (tests/test_qa_server.py); the load generator against small fake servers."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

import quantbench.protocol
from quantbench.errors import ConfigError
from quantbench.limits import Limits
from quantbench.load.client import send
from quantbench.load.http import Connection, Target
from quantbench.load.requests import endpoint_url, server_health
from quantbench.server.guard import allowed_hosts, host_name
from quantbench.server.schema import decode_request
from quantbench.server.settings import ServerSettings
from tests.test_load_http import RawServer
from tests.test_qa_server import post, request, server  # noqa: F401 - `server` is the module's fixture

ENDPOINT = "http://127.0.0.1:8000"


# -- the server -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", [70000, -1])
def test_a_port_out_of_range_is_refused_naming_the_flag_before_the_model_loads(port):
    # uvicorn took --port 70000, loaded the model, then failed to bind it with an OverflowError traceback.
    with pytest.raises(ConfigError, match=f"--port {port}: give"):
        ServerSettings(port=port)
    assert ServerSettings(port=0).port == 0  # any free port: uvicorn logs the one it bound


@pytest.mark.parametrize("key, why", [("", "is empty"), ("  ", "is empty"), (" s3cret", "has spaces at its start or end"),
                                      ("s3cret\n", "has spaces at its start or end")])
def test_an_api_key_no_client_can_send_is_refused(key, why):
    # `--api-key "$KEY"` with KEY unset served everyone with no key at all (one warning line, on a public bind
    # only); a key with spaces at either end matched no request, since HTTP trims a header's value.
    with pytest.raises(ConfigError, match=f"--api-key / QUANTBENCH_API_KEY {why}"):
        ServerSettings(api_key=key)
    assert ServerSettings(api_key="s3 cret").api_key == "s3 cret" and ServerSettings().api_key is None


def test_a_body_that_is_no_json_object_is_refused_saying_what_it_is(server):  # noqa: F811
    # A JSON string body was parsed again as JSON text: "hi" was called invalid JSON, and a request encoded twice
    # (a careless client's json.dumps of its JSON text) was answered as if it had been sent once.
    for body, kind in [(b'"hi"', "string"), (json.dumps(json.dumps(request())).encode(), "string"),
                       (b"[1, 2]", "array"), (b"null", "null"), (b"1.5", "number")]:
        r = post(server, body)
        assert r.status_code == 422, (body[:40], r.text)
        assert r.json()["field"] == "request" and f"got a JSON {kind}" in r.json()["detail"], r.text
    assert post(server, request()).status_code == 200


def test_a_request_s_counts_and_media_are_walked_once(monkeypatch):
    # decode_request checked the limits, then parse_request checked them again: every media and count check
    # twice (a 4 MB state of small objects took 5 s to prepare where one walk takes 2.5).
    walks = []
    check_media = quantbench.protocol.check_media
    monkeypatch.setattr(quantbench.protocol, "check_media", lambda *a: (walks.append(1), check_media(*a))[1])
    decoded = decode_request(json.dumps(request(state={"o": [{}] * 10})).encode(), limits=Limits())
    assert decoded.questions["a"].options == ["l", "r"] and len(walks) == 1


# -- quantbench load ------------------------------------------------------------------------------------------------
def test_load_addresses_an_ipv6_server_by_its_bracketed_name():
    # "Host: ::1:8000" named the address ::1:8000, so quantbench serve --host ::1 refused every request with 400.
    wire = Target.from_url("http://[::1]:8000/v1/systemone").request(b"{}", {})
    assert b"\r\nHost: [::1]:8000\r\n" in wire
    host = wire.split(b"\r\nHost: ")[1].split(b"\r\n")[0].decode()
    assert host_name(host) in allowed_hosts("::1")
    assert b"\r\nHost: 127.0.0.1:8000\r\n" in Target.from_url("http://127.0.0.1:8000/v1/systemone").request(b"", {})


@pytest.mark.parametrize("endpoint, words", [
    ("http://127.0.0.1:abc", "Port could not be cast"),  # was an httpx.InvalidURL traceback
    ("http://127.0.0.1:99999", "Port out of range"),  # was "nothing answers there (Connection refused)"
    ("http://[::1", "Invalid IPv6 URL"),  # was a ValueError traceback
    ("http://127.0.0.1:8000?x=1", "no query"),  # took /healthz and /v1/systemone into the query: 404s measured
    ("http://127.0.0.1:8000/#top", "no query or fragment"),
])
def test_load_refuses_an_endpoint_that_is_no_base_url_naming_the_flag(endpoint, words):
    with pytest.raises(ConfigError, match="--endpoint") as e:
        endpoint_url(endpoint)
    assert words in str(e.value), e.value
    assert endpoint_url(ENDPOINT + "/v1/systemone/") == ENDPOINT


def test_load_reads_non_finite_numbers_from_a_server_as_not_reported():
    # A server's "X-Quantbench-Batch: inf" stopped the generator (OverflowError in int()), and a NaN model_ms or
    # queue time went into the step's percentiles as nan.
    body = b'{"model_ms": NaN}'
    reply = (b"HTTP/1.1 200 OK\r\nX-Quantbench-Batch: inf\r\nX-Quantbench-Queue-Ms: nan\r\n"
             b"Server-Timing: app;dur=nan, read;dur=-5, prepare;dur=0.5\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    async def main():
        async with RawServer(lambda n: reply) as target:
            conn = Connection(target)
            try:
                return await send(conn, target.request(b"{}", {}), 5.0)
            finally:
                conn.close()

    sample = asyncio.run(main())
    assert sample.status == "200"
    assert (sample.batch, sample.queue_ms, sample.model_ms) == (None, None, None)
    assert sample.timing == {"prepare": 0.5}


def test_load_says_at_once_why_a_server_refuses_its_healthz():
    # A 400 (quantbench serve's answer to a Host name it does not serve) was polled until --ready-timeout, then
    # reported as "/healthz still answers 400 after 60 s" without the server's reason.
    refusal = {"detail": "the Host header 'vm:8000' is not a name this server answers to", "field": "Host",
               "fix": "connect as 127.0.0.1, ::1, localhost, or start the server with --allowed-host NAME"}
    calls = []

    def answer(req: httpx.Request) -> httpx.Response:
        calls.append(req)
        return httpx.Response(400, json=refusal)

    t0 = time.monotonic()
    with httpx.Client(transport=httpx.MockTransport(answer)) as client, pytest.raises(ConfigError) as e:
        server_health(client, ENDPOINT, ready_timeout_s=30.0)
    assert time.monotonic() - t0 < 5.0 and len(calls) == 1
    assert "answers 400" in str(e.value) and "--allowed-host" in str(e.value) and "--endpoint" in str(e.value)

    loading = iter([httpx.Response(503, json={"status": "loading"}), httpx.Response(200, json={"status": "ok"})])
    with httpx.Client(transport=httpx.MockTransport(lambda req: next(loading))) as client:
        assert server_health(client, ENDPOINT, ready_timeout_s=30.0) == {"status": "ok"}  # 503 is still waited out


@pytest.mark.parametrize("head, tail", [
    (b"Transfer-Encoding: chunked\r\n\r\n", b"1100000\r\n"),  # one chunk of 17 MiB declared, never sent
    (b"Content-Length: 1000000000000\r\n\r\n", b""),  # a terabyte declared
    (b"Connection: close\r\n\r\n", b"x" * (17 << 20)),  # read until the server closes: 17 MiB of it
], ids=["chunked", "content-length", "until-close"])
def test_load_refuses_a_response_body_past_its_bound_instead_of_holding_it(head, tail):
    # A server streaming chunks without end had the client hold all of it in memory until --timeout.
    from quantbench.load.http import MAX_BODY_BYTES

    assert MAX_BODY_BYTES < 17 << 20

    async def main():
        async with RawServer(lambda n: b"HTTP/1.1 200 OK\r\n" + head + tail, close_after=lambda n: True) as target:
            conn = Connection(target)
            try:
                return await send(conn, target.request(b"{}", {}), 10.0)
            finally:
                conn.close()

    assert asyncio.run(main()).status == "transport"
