"""`run --backend http` against servers that are not quantbench, or misbehave (QA): each test is a server that once
got a run stuck, a traceback, a wrong stored answer, two models under one run or a password stored or printed. The
servers are raw HTTP written byte by byte on loopback (RawHttp), so anything a hostile server can send is sent."""

from __future__ import annotations

import gzip
import json
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate

import httpx
import pytest

import backends.http as http_backend
from backends.http import HttpBackend, HttpEngine, RemoteError, normalize_endpoint
from quantbench.errors import ConfigError, LoadError
from quantbench.protocol import parse_request
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec

CARD = {"state": {"observation": "The player is facing a wall."},
        "questions": {"action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right",
                                                                "forward": "Move forward"}}}}
HEALTH = {"status": "ok", "model": "m", "variant": "v1", "weight_format": "bf16", "compute_dtype": "bf16",
          "kernel_path": "k", "device": "cuda:0", "gpu": "H200", "info": {"model_hash": "h1"}}
GOOD = {"left": 0.5, "right": 0.3, "forward": 0.2}
WAIT_S = 15.0  # what any refusal below must come well within (a wait it does not need was 600 s)

Respond = Callable[[str, str, dict[str, str], bytes], bytes | Iterable[bytes]]


class RawHttp:
    """A loopback HTTP server whose answers are raw bytes: `respond(method, path, headers, body)` returns them whole or
    as pieces (a generator may sleep between them). Each connection is closed after its answer; `seen` lists every
    request (method, path, headers). With `tls`, a (certfile, keyfile) pair, it speaks HTTPS."""

    def __init__(self, respond: Respond, host: str = "127.0.0.1", tls: tuple[str, str] | None = None):
        self.respond, self.seen = respond, []
        handler = self._handler()
        context = None
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)

        class Server(socketserver.ThreadingTCPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = allow_reuse_address = True

            def get_request(self):
                sock, addr = super().get_request()
                return (context.wrap_socket(sock, server_side=True) if context else sock), addr

            def handle_error(self, request, client_address):  # a client that refused our certificate: expected
                pass

        self.server = Server((host, 0), handler)
        name = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls else 'http'}://{name}:{self.server.server_address[1]}"

    def _handler(self) -> type[socketserver.BaseRequestHandler]:
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
                while len(body) < int(headers.get("content-length", 0)):
                    body += self.request.recv(65536)
                outer.seen.append((method, path, headers))
                out = outer.respond(method, path, headers, body)
                try:
                    for piece in [out] if isinstance(out, bytes) else out:
                        self.request.sendall(piece)
                except OSError:  # the client gave up on us: what the test wanted
                    pass

        return Handler

    def posts(self) -> int:
        return sum(1 for method, *_ in self.seen if method == "POST")

    def __enter__(self) -> RawHttp:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def reply(status: int = 200, body: bytes | dict | list = b"", headers: Iterable[tuple[str, str]] = ()) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(raw)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode("latin-1") + b"\r\n" + raw


def answering(body: bytes) -> dict:
    """A SystemOne answer to the request `body`: each question's first option at 0.6, the rest sharing 0.4."""
    questions = parse_request(json.loads(body)).questions
    answers = {}
    for name, q in questions.items():
        rest = 0.4 / (len(q.options) - 1)
        answers[name] = {"top": q.options[0], "method": "label_logit",
                         "probabilities": {o: 0.6 if i == 0 else rest for i, o in enumerate(q.options)}}
    return {"model": "m", "model_ms": 1.0, "tokens": 9, "answers": answers}


def answer(probabilities: dict | None = None, top: str = "left", model: str = "m", **over) -> dict:
    return {"model": model, "model_ms": 1.0, "tokens": 9, **over, "answers": {"action": {
        "top": top, "method": "label_logit", "probabilities": probabilities or GOOD}}}


def server(post: Callable[[int], bytes | Iterable[bytes]], health: Callable[[int], bytes] | None = None, **kw) -> RawHttp:
    """A SystemOne look-alike: /healthz answers `health(n)` (default HEALTH), the n-th POST `post(n)`."""
    counts = {"GET": 0, "POST": 0}

    def respond(method: str, path: str, headers: dict[str, str], body: bytes):
        counts[method] = counts.get(method, 0) + 1
        if path == "/healthz":
            return health(counts["GET"]) if health else reply(200, HEALTH)
        return post(counts["POST"])

    return RawHttp(respond, **kw)


def engine_for(srv: RawHttp, **kw) -> HttpEngine:
    return HttpEngine(srv.url, httpx.Client(), **kw)


def ask(engine: HttpEngine, request: dict | None = None):
    return engine.forward(engine.prepare(parse_request(request or CARD)))


def refused(srv: RawHttp, **kw) -> str:
    """The RemoteError a decision against `srv` raises (its text), in well under WAIT_S."""
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as e:
        ask(engine_for(srv, **kw))
    assert time.monotonic() - t0 < WAIT_S
    return str(e.value)


# -- answers that are no answers ---------------------------------------------------------------------------------
NAN = b'{"model":"m","model_ms":1,"tokens":9,"answers":{"action":{"top":"left","method":"label_logit",' \
      b'"probabilities":{"left":NaN,"right":0.3,"forward":0.2}}}}'


@pytest.mark.parametrize("body, says", [
    (NAN, "left=nan"),
    (answer({"left": 1.5, "right": -0.3, "forward": -0.2}), "left=1.5, right=-0.3"),
    (answer({"left": 0.9, "right": 0.9, "forward": 0.9}), "sum to 2.7, not 1"),
    (answer({"left": 0, "right": 0, "forward": 0}), "sum to 0, not 1"),
    (answer({"left": 0.1, "right": 0.8, "forward": 0.1}), "top 'left' (0.1), not its likeliest option 'right'"),
    ({**answer(), "answers": {**answer()["answers"], "other": answer()["answers"]["action"]}},
     "questions the request does not ask ('other'"),
    (answer(model_ms=-5.0), "model_ms -5.0"),
    (answer(tokens=-3), "tokens -3"),
], ids=["nan", "negative", "sum_over_1", "all_zero", "top_not_likeliest", "stray_question", "negative_ms",
        "negative_tokens"])
def test_an_answer_that_is_no_distribution_over_the_options_is_refused(body, says):
    # Each was stored as an ok answer (NaN failed the run as a checkpoint's overflow, naming --dtype).
    with server(lambda n: reply(200, body)) as srv:
        assert says in refused(srv)


def test_a_well_formed_answer_is_taken_in_the_requests_option_order():
    with server(lambda n: reply(200, answer({"forward": 0.2, "right": 0.3, "left": 0.5}))) as srv:
        got = ask(engine_for(srv))["action"]
    assert (got.top, list(got.probabilities)) == ("left", ["left", "right", "forward"])


# -- a server that changes its model -----------------------------------------------------------------------------
def test_answers_from_another_model_than_healthz_names_fail_the_decision():
    # The server restarted with another model between two decisions: the run stored both under the first.
    with server(lambda n: reply(200, answer(model="m" if n == 1 else "m-int4"))) as srv:
        engine = engine_for(srv, health=HEALTH)
        assert ask(engine)["action"].top == "left"
        with pytest.raises(RemoteError, match="answered as model 'm-int4', but /healthz said it serves 'm'"):
            ask(engine)


def test_a_server_without_a_model_in_healthz_is_held_to_its_first_answers_model():
    with server(lambda n: reply(200, answer(model="a" if n < 3 else "b"))) as srv:
        engine = engine_for(srv, health={"status": "ok"})
        ask(engine), ask(engine)
        with pytest.raises(RemoteError, match="'b', but its first answer came from 'a'"):
            ask(engine)


def run_against(health: Callable[[int], bytes], post: Callable[[int, bytes], bytes]):
    """A run of the built-in suite's first 3 records (no latency phase) against a server answering /healthz with
    `health(n)` and its n-th POST with `post(n, body)`."""
    def respond(method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        if path == "/healthz":
            return health(sum(m == "GET" for m, *_ in srv.seen))
        return post(srv.posts(), body)

    with RawHttp(respond) as srv:
        return execute(RunSpec(backend="http", endpoint=srv.url, warmup=0, latency_min_decisions=0,
                               latency_min_seconds=0.0, limit=3), echo=False)


def test_a_run_whose_server_changed_its_variant_fails_instead_of_storing_the_answers():
    # Same model name in every answer, another variant behind it: only /healthz tells. The run was stored ok.
    def health(n: int) -> bytes:
        return reply(200, HEALTH if n == 1 else {**HEALTH, "variant": "int4", "info": {"model_hash": "h2"}})

    result = run_against(health, lambda n, body: reply(200, answering(body)))
    assert (result.run.status, result.answers) == ("failed", [])
    assert "changed what it serves during the run (variant: 'v1' → 'int4'; info.model_hash: 'h1' → 'h2')" in \
        result.run.error


def test_a_run_stores_the_servers_forward_time_beside_the_clients_and_its_retries():
    # The server's model_ms was read and dropped: a run's latencies (client, end to end) had nothing to compare to.
    def post(n: int, body: bytes) -> bytes:
        if n == 2:
            return reply(429, {"detail": "queue full"}, [("Retry-After", "1")])
        return reply(200, {**answering(body), "model_ms": 7.0})

    result = run_against(lambda n: reply(200, HEALTH), post)
    assert result.run.status == "ok", result.run.error
    assert len({a.record_id for a in result.answers}) == 3
    timing = result.run.extra["server_timing"]
    assert (timing["decisions"], timing["server_model_ms_p50"], timing["retried"]) == (4, 7.0, 1)  # cold + 3
    assert timing["client_ms_p50"] > 0 and "end to end" in timing["note"]
    assert timing["identity_at_end"].startswith("the same as at load")


def test_a_run_whose_server_did_not_answer_healthz_at_its_end_says_its_identity_was_not_checked():
    # The end-of-run identity check was skipped in silence when /healthz failed: an ok run that read as checked.
    result = run_against(lambda n: reply(200, HEALTH) if n == 1 else reply(503, {"status": "loading"}),
                         lambda n, body: reply(200, answering(body)))
    assert result.run.status == "ok", result.run.error
    assert result.run.extra["server_timing"]["identity_at_end"] == "not checked: /healthz answered 503 at the run's end"


# -- bodies without end ------------------------------------------------------------------------------------------
def trickle(n: int):
    """A slow loris: the head, then a byte every 0.3 s (each resets a read timeout)."""
    body = json.dumps(answer()).encode()
    yield b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    for byte in body:
        time.sleep(0.3)
        yield bytes([byte])


def endless_chunks(n: int):
    yield b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    while True:
        yield b"4000\r\n" + b" " * 0x4000 + b"\r\n"


def declared_terabyte(n: int):
    yield b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n"
    while True:
        yield b" " * 65536


def test_a_server_trickling_its_answer_is_cut_at_the_request_timeout():
    # A byte every 0.3 s kept a 2 s timeout from ever firing: the decision hung for as long as the server liked.
    with server(trickle) as srv:
        assert "no answer within 2 s" in refused(srv, timeout_s=2.0)


@pytest.mark.parametrize("body", [endless_chunks, declared_terabyte], ids=["chunked_without_end", "a_terabyte"])
def test_an_answer_without_end_is_cut_at_its_bound(body, monkeypatch):
    monkeypatch.setattr(http_backend, "MAX_ANSWER_BYTES", 1 << 20)  # 16 MiB in a run: the same cut, sooner
    with server(body) as srv:
        assert "the answer is over 1048576 bytes" in refused(srv)


def test_a_gzip_bomb_is_cut_at_its_bound_counting_what_it_inflates_to(monkeypatch):
    monkeypatch.setattr(http_backend, "MAX_ANSWER_BYTES", 1 << 20)
    bomb = gzip.compress(b"{" + b" " * (64 << 20), compresslevel=9)  # 64 MiB of JSON whitespace in ~64 KB
    with server(lambda n: reply(200, bomb, [("Content-Encoding", "gzip")])) as srv:
        assert "the answer is over 1048576 bytes" in refused(srv)
        assert srv.seen[0][2]["accept-encoding"] == "identity"  # an uncompressed answer was asked for


def test_a_body_that_does_not_decode_is_a_remote_error_not_a_traceback():
    with server(lambda n: reply(200, b"not gzip at all", [("Content-Encoding", "gzip")])) as srv:
        assert "DecodingError" in refused(srv)


# -- statuses: retries, redirects, refusals ----------------------------------------------------------------------
def test_a_429_with_retry_after_is_waited_out_like_a_503():
    with server(lambda n: reply(429, {"detail": "slow down"}, [("Retry-After", "1")]) if n == 1
                else reply(200, answer())) as srv:
        engine = engine_for(srv)
        prepared = engine.prepare(parse_request(CARD))
        assert engine.forward(prepared)["action"].top == "left"
    assert prepared.retries == 1 and prepared.client_ms >= 1000.0


@pytest.mark.parametrize("header", ["Retry-After", "X-Quantbench-Batch"])
def test_a_header_of_digits_python_reads_but_int_does_not_is_no_traceback(header):
    # "²" is a digit to str.isdigit: int() then raised ValueError out of the run.
    status = 503 if header == "Retry-After" else 200
    with server(lambda n: reply(status, answer(), [(header, "\xb2")])) as srv:
        engine = engine_for(srv)
        if status == 503:
            assert "answered 503" in refused(srv)
        else:
            prepared = engine.prepare(parse_request(CARD))
            engine.forward(prepared)
            assert prepared.batch is None


def test_retry_after_reads_seconds_and_http_dates():
    assert http_backend.retry_after_s("3") == 3.0 and http_backend.retry_after_s("\xb2") is None and http_backend.retry_after_s(None) is None
    assert 5 < http_backend.retry_after_s(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert http_backend.retry_after_s(formatdate(time.time() - 10, usegmt=True)) == 0.0
    assert http_backend.retry_after_s("soon") is None


def test_a_redirect_is_not_followed_and_the_api_key_stays_home():
    with RawHttp(lambda *a: reply(200, answer())) as elsewhere:
        target = elsewhere.url
        with server(lambda n: reply(307, b"", [("Location", target + "/v1/systemone")])) as srv:
            client = httpx.Client(headers={"Authorization": "Bearer k3y"})
            with pytest.raises(RemoteError, match=f"answered 307: a redirect to {target}/v1/systemone; quantbench "
                               "does not follow redirects"):
                ask(HttpEngine(srv.url, client))
    assert elsewhere.seen == []


@pytest.mark.parametrize("status, says", [
    (301, "answered 301: a redirect to http://***@elsewhere.example/; quantbench does not follow redirects"),
    (400, "answered 400: Invalid host header; fix --endpoint"),
    (403, "answered 403: Invalid host header; fix --endpoint"),
])
def test_a_healthz_that_a_wait_will_not_change_is_refused_at_once(status, says):
    # Each was polled until --timeout (600 s at most) and then called "did not turn ready".
    headers = [("Location", "http://user:pw@elsewhere.example/")]
    with RawHttp(lambda *a: reply(status, {"detail": "Invalid host header"}, headers)) as srv:
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as e:
            HttpBackend().load(RunSpec(backend="http", endpoint=srv.url), None)
        assert time.monotonic() - t0 < WAIT_S
    assert says in str(e.value) and "pw" not in str(e.value)


def test_a_healthz_without_end_is_refused_not_held():
    with server(lambda n: reply(200, answer()), health=endless_chunks) as srv:
        t0 = time.monotonic()
        with pytest.raises(LoadError, match="did not answer as a SystemOne server"):
            HttpBackend().load(RunSpec(backend="http", endpoint=srv.url), None)
        assert time.monotonic() - t0 < WAIT_S


def test_a_healthz_of_another_shape_is_provenance_where_it_fits_and_kept_whole():
    # A server that is not quantbench said `variant: 5`: pydantic's ValidationError failed the run.
    odd = {"model": ["a"], "variant": 5, "gpu": {"name": "H200"}, "info": {"disk_bytes": "lots", "model_hash": "h"}}
    with server(lambda n: reply(200, answer()), health=lambda n: reply(200, odd)) as srv:
        loaded = HttpBackend().load(RunSpec(backend="http", endpoint=srv.url), None)
        loaded.engine.close()
    info = loaded.info
    assert (info.variant, info.model_id, info.disk_bytes, info.model_hash) == ("http", srv.url, None, "h")
    assert info.extra["server"] == odd


# -- endpoints: TLS, IPv6, credentials ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def self_signed(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"openssl could not make a certificate: {e}")
    return cert, key


def test_a_certificate_that_does_not_verify_is_refused_at_once_naming_the_opt_out(self_signed):
    # It was retried for 30 s as "no SystemOne server answers ... start one with `quantbench serve`".
    with server(lambda n: reply(200, answer()), tls=self_signed) as srv:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match="its TLS certificate does not verify .*--no-tls-verify"):
            HttpBackend().load(RunSpec(backend="http", endpoint=srv.url), None)
        assert time.monotonic() - t0 < WAIT_S
        loaded = HttpBackend().load(RunSpec(backend="http", endpoint=srv.url, tls_verify=False), None)
        assert ask(loaded.engine)["action"].top == "left"
        loaded.engine.close()
    assert loaded.info.extra["tls_verify"] is False and "--no-tls-verify" in loaded.info.load_note


def test_an_ipv6_literal_endpoint_is_served():
    try:
        srv = server(lambda n: reply(200, answer()), host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with srv:
        loaded = HttpBackend().load(RunSpec(backend="http", endpoint=srv.url + "/v1/systemone"), None)
        assert ask(loaded.engine)["action"].top == "left"
        loaded.engine.close()
    assert loaded.info.extra["endpoint"] == srv.url and srv.url.startswith("http://[::1]:")


@pytest.mark.parametrize("endpoint, says", [
    ("http://user:s3cret@127.0.0.1:8000", "'http://***@127.0.0.1:8000': a user or password in the URL"),
    ("ftp://user:s3cret@host", "'ftp://***@host' must start with http://"),
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://127.0.0.1:8000?model=x", "with no query or fragment"),
])
def test_an_endpoint_that_is_no_base_url_is_refused_without_printing_its_password(endpoint, says):
    with pytest.raises(ConfigError) as e:
        normalize_endpoint(endpoint)
    assert says in str(e.value) and "s3cret" not in str(e.value)


def test_a_sweeps_endpoint_with_a_password_is_refused_before_anything_is_stored(tmp_path):
    # execute() (a sweep's runs, the Python API) never saw run's check: the child refused the URL, and the failed
    # row stored it, password and all, in its spec and its provenance.
    with pytest.raises(ConfigError, match=r"\*\*\*@127.0.0.1:1") as e:
        execute(RunSpec(backend="http", endpoint="http://u:s3cret@127.0.0.1:1"), echo=False)
    assert "s3cret" not in str(e.value)


def test_a_sweep_file_whose_endpoint_holds_a_password_is_refused_as_it_is_read(tmp_path):
    # The sweep stored the refused run as a failed row: its spec column held the URL, password and all.
    from quantbench.sweep import load_sweep

    path = tmp_path / "sweep.toml"
    path.write_text('[[variants]]\nbackend = "http"\nendpoint = "http://u:s3cret@127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match=r"variants\[0\]: --endpoint 'http://\*\*\*@127.0.0.1:1': a user or "
                       "password") as e:
        load_sweep(path)
    assert "s3cret" not in str(e.value)


def test_a_sweeps_own_failed_row_masks_the_api_key():
    from quantbench.sweep import failed_result

    row = failed_result(RunSpec(backend="http", endpoint="http://127.0.0.1:1", api_key="s3cret"), "error", "lost")
    assert row.run.spec["api_key"] == "***" and row.run.spec["endpoint"] == "http://127.0.0.1:1"


@pytest.mark.parametrize("url, key, warned", [
    ("http://10.0.0.5:8000", "k", True), ("http://gpu-box.example:8000", "k", True),
    ("http://127.0.0.1:8000", "k", False), ("http://[::1]:8000", "k", False), ("http://localhost:8000", "k", False),
    ("https://gpu-box.example", "k", False), ("http://10.0.0.5:8000", None, False),
])
def test_an_api_key_bound_over_plain_http_for_another_machine_is_warned_about(url, key, warned, capsys, monkeypatch):
    # A key sent in clear text to another host got no word: anyone on the path could read it.
    monkeypatch.setattr("backends.http._WARNED", set())
    for _ in range(2):  # run's check, then the run's own: one warning
        HttpBackend().check(RunSpec(backend="http", endpoint=url, api_key=key), None)
    err = capsys.readouterr().err
    assert err.count("over plain HTTP") == int(warned), err
