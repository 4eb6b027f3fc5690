"""`--backend http`: answer the suite through any SystemOne server (`quantbench serve`, serve_clef.py, ...).

    quantbench serve --backend int4 --port 8000 &
    quantbench run --backend http --endpoint http://127.0.0.1:8000 --concurrency 4

`load` waits for GET /healthz to answer 200 and records what the server says it serves as the run's provenance.
`prepare` serialises a request (a suite's `"path"` media parts inlined as data URIs: a server never reads local
files; each file checked as a local run checks it, its mime type sniffed from its bytes), `forward` is the POST (its wall time, end to end on the client, is what the
runner times), `forward_many` keeps `concurrency` POSTs in flight. A 503 or 429 with Retry-After (queue full)
is retried within the request timeout; any other error status becomes a `RemoteError` carrying the server's reason,
a `RemoteRequestError` (a RequestError: the run names the record and the field) when the server names a field.

What comes back is not trusted: a body is read as it arrives, bounded in bytes (decoded) and in time (a server
trickling a byte a second never ends a read timeout); redirects are not followed (the API key goes to --endpoint's
origin only, and a run measures the server it names); every answer is checked against its request (its questions,
their options, probabilities finite, in [0, 1] and summing to 1, `top` the likeliest) and against the model the
server said it serves, once per answer and at the run's end (GET /healthz again): a server that changed its model
mid-run fails the run rather than storing two models' answers under one record.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import math
import os
import ssl
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from quantbench.engine.base import EngineBase, EngineReport, Prepared
from quantbench.errors import ConfigError, LoadError, QuantbenchError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import DecisionRequest, DecisionResponse, QuestionAnswer
from quantbench.protocol.endpoint import API_KEY_ENV, PATH, checked_endpoint, key_in_clear, shown_url
from quantbench.run.backend import Availability, LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.run.spec import BackendOptions, RunSpec, opt

REQUEST_TIMEOUT_S = 300.0  # one decision, retries included
READY_TIMEOUT_S = 600.0  # a server still loading its model (503) is waited for this long at most
CONNECT_GRACE_S = 30.0  # nothing listening: give a server that is still importing this long, then fail
HEALTH_TIMEOUT_S = 10.0  # one GET /healthz, its whole body included
POLL_S = 0.25
# An answer is a few KB (a 64-option question is ~3 KB); a server streaming chunks without end, declaring a terabyte
# or sending a gzip bomb is cut here, decoded bytes counted, as `quantbench load` bounds it.
MAX_ANSWER_BYTES = 16 << 20
MAX_HEALTH_BYTES = 1 << 20  # /healthz is stored whole on the run row (extra.server)
SUM_TOLERANCE = 1e-3  # a softmax in float32 sums to 1 within ~1e-6; as a checkpoint's own scorer is held to
TOP_TOLERANCE = 1e-6  # `top` may be any option as likely as the likeliest, to this much (ties)
RETRIED = (429, 503)  # "come back later" statuses, waited out when they say when (Retry-After)
# What says a server changed what it serves: compared between /healthz at load and at the run's end (the kernel
# path and the counts change as it serves, these do not).
IDENTITY = ("model", "variant", "weight_format", "compute_dtype", "device", "gpu")
IDENTITY_INFO = ("model_id", "model_hash", "model_revision", "variant", "weight_format")


class RemoteError(QuantbenchError):
    """The server answered a request with an error status (or something that is not a SystemOne answer)."""

    def __init__(self, status: int | None, message: str):
        self.status = status
        super().__init__(message)


class RemoteRequestError(RemoteError, RequestError):
    """The server refused the request with a 4xx naming a field (media its model cannot read, a prompt over its
    context, a limit): a problem of the record, not of the server."""

    def __init__(self, status: int, url: str, field: str, problem: str, fix: str):
        RequestError.__init__(self, field, f"POST {url} answered {status}: {problem}", fix)
        self.status = status


@dataclass
class Answer:
    """A response read whole: its status, headers and body (bounded by `read_bounded`)."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def read_bounded(client: httpx.Client, method: str, url: str, deadline: float, limit: int, **kw: Any) -> Answer:
    """One request and its whole body, read as it arrives. RemoteError when the body passes `limit` bytes (decoded:
    a gzip bomb counts what it inflates to) or is still arriving at `deadline` (a read timeout alone is reset by
    every byte, so a server trickling bytes, or chunks without end, held the run forever). No redirect is followed.
    Asks for an uncompressed body: a server that compresses anyway is decoded a network read at a time."""
    headers = {"Accept-Encoding": "identity", **kw.pop("headers", {})}
    timeout = max(0.1, deadline - time.monotonic())
    with client.stream(method, url, headers=headers, timeout=timeout, follow_redirects=False, **kw) as r:
        chunks, size = [], 0
        for chunk in r.iter_bytes():
            size += len(chunk)
            if size > limit:
                raise RemoteError(r.status_code, f"{method} {url}: the answer is over {limit} bytes (a SystemOne "
                                  "answer is a few KB); is --endpoint a SystemOne server?")
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(f"the answer was still arriving after {timeout:.0f} s")
            chunks.append(chunk)
    return Answer(r.status_code, r.headers, b"".join(chunks))


def _refusal(response: Answer, url: str) -> RemoteError:
    """The error of a non-200 answer: a RemoteRequestError when a 4xx body names the field (quantbench servers'
    ErrorBody: detail, field, fix), else a RemoteError with the server's reason."""
    body = _json(response)
    field, detail, fix = body.get("field"), str(body.get("detail", "")), body.get("fix") or ""
    if 400 <= response.status_code < 500 and isinstance(field, str) and field and field != "request":
        problem = detail.removeprefix(f"{field}: ").removesuffix(f" ({fix})") if detail else "refused"
        return RemoteRequestError(response.status_code, url, field, problem, str(fix))
    if 300 <= response.status_code < 400:
        return RemoteError(response.status_code, f"POST {url} answered {response.status_code}: {_redirect(response)}")
    return RemoteError(response.status_code, f"POST {url} answered {response.status_code}: {_reason(response)}")


def _redirect(response: Answer) -> str:
    """What a redirect is told: where it points, and that it is not followed."""
    location = shown_url(response.headers.get("location", "")[:300]) or "(no Location)"
    return (f"a redirect to {location}; quantbench does not follow redirects (the API key goes to --endpoint's "
            "origin only, and a run measures the server it names): give the server's own URL as --endpoint")


@dataclass
class HttpPrepared(Prepared):
    """A request's body; `rows` stays None (the server tokenizes). Filled by the POST: `client_ms`, end to end
    on the client, retries included, and the fields below."""

    request: DecisionRequest
    body: bytes
    server_ms: float | None = None  # the server's own model_ms
    tokens: int = 0  # the server's token count
    batch: int | None = None  # requests in the server's forward pass (quantbench servers say it in a header)
    retries: int = 0  # 503 + Retry-After answers waited out


def normalize_endpoint(endpoint: str | None) -> str:
    if not endpoint:
        raise ConfigError(
            "--backend http needs --endpoint, the server's base URL, e.g. http://127.0.0.1:8000"
        )
    return checked_endpoint(endpoint)


def _json(response: Answer) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _reason(response: Answer) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return json.dumps(body)[:500]


def retry_after_s(value: str | None) -> float | None:
    """The seconds a Retry-After says to wait (delay-seconds or an HTTP date), None when it says nothing usable."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():  # ASCII only: "²" is a digit to str.isdigit, and no number to int()
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _answer_problem(name: str, options: list[str], ans: QuestionAnswer) -> str | None:
    """Why the server's answer to question `name` is no answer to it, or None."""
    if set(ans.probabilities) != set(options) or ans.top not in options:
        return (f"the server answered {name!r} with options {sorted(ans.probabilities)} (top {ans.top!r}); "
                f"the request's options are {options}")
    probs = ans.probabilities
    if bad := [o for o in options if not (math.isfinite(probs[o]) and 0.0 <= probs[o] <= 1.0)]:
        shown = ", ".join(f"{o}={probs[o]}" for o in bad[:4])
        return f"the server answered {name!r} with probabilities that are none ({shown}): each must be in [0, 1]"
    total = math.fsum(probs.values())
    if abs(total - 1.0) > SUM_TOLERANCE:
        return f"the server's probabilities for {name!r} sum to {total:.6g}, not 1 (tolerance {SUM_TOLERANCE:g})"
    if probs[ans.top] < max(probs.values()) - TOP_TOLERANCE:
        likeliest = max(options, key=lambda o: probs[o])
        return (f"the server answered {name!r} with top {ans.top!r} ({probs[ans.top]:.4g}), not its likeliest "
                f"option {likeliest!r} ({probs[likeliest]:.4g})")
    return None


def check_answers(request: DecisionRequest, answers: dict[str, QuestionAnswer]) -> dict[str, QuestionAnswer]:
    """The server's answers in the request's question and option order; RemoteError if any is missing, one was
    not asked (another request's answer), or one is off (its options, its probabilities, its top)."""
    if stray := sorted(set(answers) - set(request.questions)):
        raise RemoteError(200, f"the server answered questions the request does not ask ({', '.join(map(repr, stray[:5]))}; "
                          f"asked {sorted(request.questions)}): is it answering another request?")
    out: dict[str, QuestionAnswer] = {}
    for name, question in request.questions.items():
        if name not in answers:
            raise RemoteError(
                200, f"the server did not answer question {name!r} (answered {sorted(answers)})"
            )
        if problem := _answer_problem(name, question.options, answers[name]):
            raise RemoteError(200, problem)
        probs = {o: answers[name].probabilities[o] for o in question.options}
        out[name] = answers[name].model_copy(update={"probabilities": probs})
    return out


def _counts_problem(response: DecisionResponse) -> str | None:
    """Why the server's model_ms or tokens are no figures (stored with every latency row), or None."""
    if not (math.isfinite(response.model_ms) and response.model_ms >= 0):
        return f"model_ms {response.model_ms}"
    if response.tokens < 0:
        return f"tokens {response.tokens}"
    return None


def identity(health: dict[str, Any]) -> dict[str, Any]:
    """What /healthz says is served, as far as it does not change while serving (IDENTITY, IDENTITY_INFO)."""
    info = health.get("info") if isinstance(health.get("info"), dict) else {}
    return {**{k: health.get(k) for k in IDENTITY}, **{f"info.{k}": info.get(k) for k in IDENTITY_INFO}}


class HttpEngine(EngineBase):
    """A DecisionEngine whose forward pass is a POST to a SystemOne server. It declares no optional feature:
    nothing to warm, no fused ops or CUDA graphs of its own (EngineBase's defaults)."""

    device = "remote"

    def __init__(
        self,
        endpoint: str,
        client: httpx.Client,
        *,
        concurrency: int = 1,
        timeout_s: float = REQUEST_TIMEOUT_S,
        media_base: Path | None = None,
        limits: Limits | None = None,
        health: dict[str, Any] | None = None,
    ):
        """`media_base`: the suite file's folder, where `path` media parts are read from (None: refused);
        `limits`: what those files are checked against (a local run's: the protocol's defaults); `health`: what
        GET /healthz answered at load (its model is what every answer must come from; None: the first answer's)."""
        if concurrency < 1:
            raise ConfigError(f"--concurrency {concurrency}: use 1 or more requests in flight")
        self.endpoint = normalize_endpoint(endpoint)
        self.url, self.client = self.endpoint + PATH, client
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.media_base, self.limits = media_base, limits or Limits()
        self.health = health
        self.model = _text((health or {}).get("model"))  # the model every answer must name
        self._model_lock = threading.Lock()
        self._timed: list[tuple[float, float, int]] = []  # (client_ms, server model_ms, retries) per answer
        self._pool = (
            ThreadPoolExecutor(concurrency, thread_name_prefix="quantbench-http") if concurrency > 1 else None
        )

    def prepare(self, request: DecisionRequest) -> HttpPrepared:
        from quantbench.protocol.media import inline_media_paths  # numpy: not at import (Adding a backend)

        sent = inline_media_paths(request, self.limits, base=self.media_base)
        body = sent.model_dump(mode="json", exclude_none=True)
        return HttpPrepared(request, json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def _post(self, prepared: HttpPrepared, deadline: float) -> Answer:
        """The POST's answer, a 429 / 503 with Retry-After waited out while the deadline allows."""
        prepared.retries = 0
        reconnected = False
        while True:
            try:
                r = read_bounded(self.client, "POST", self.url, deadline, MAX_ANSWER_BYTES, content=prepared.body,
                                 headers={"Content-Type": "application/json"})
            except httpx.TimeoutException as e:
                raise RemoteError(
                    None, f"POST {self.url}: no answer within {self.timeout_s:.0f} s ({e})"
                ) from e
            except httpx.RemoteProtocolError as e:
                # The server closed a kept-alive connection as this request went out on it (uvicorn drops idle
                # ones after 5 s): nothing was answered, and a decision is safe to ask again. Once.
                if reconnected:
                    raise RemoteError(None, f"POST {self.url}: {type(e).__name__}: {e}") from e
                reconnected = True
                prepared.retries += 1
                continue
            except httpx.HTTPError as e:  # a transport error, or a body that does not decode (Content-Encoding)
                raise RemoteError(None, f"POST {self.url}: {type(e).__name__}: {e}") from e
            wait_s = retry_after_s(r.headers.get("retry-after")) if r.status_code in RETRIED else None
            if wait_s is None or time.monotonic() + wait_s >= deadline:
                return r
            prepared.retries += 1
            time.sleep(max(wait_s, POLL_S))  # the server's queue is full: come back when it says

    def forward(self, prepared: HttpPrepared) -> dict[str, QuestionAnswer]:
        deadline = time.monotonic() + self.timeout_s
        t0 = time.perf_counter()
        r = self._post(prepared, deadline)
        prepared.client_ms = (time.perf_counter() - t0) * 1000.0
        if r.status_code != 200:
            raise _refusal(r, self.url)
        try:
            response = DecisionResponse.model_validate_json(r.content)
        except ValueError as e:
            raise RemoteError(200, f"POST {self.url} did not return a SystemOne answer: {e}") from e
        if problem := _counts_problem(response):
            raise RemoteError(200, f"POST {self.url} answered with {problem}: no time or count of a forward pass")
        self._check_model(response.model)
        prepared.server_ms, prepared.tokens = response.model_ms, response.tokens
        batch = r.headers.get("x-quantbench-batch", "")
        prepared.batch = int(batch) if batch.isascii() and batch.isdigit() else None
        answers = check_answers(prepared.request, response.answers)
        self._timed.append((prepared.client_ms, response.model_ms, prepared.retries))  # atomic: threads share it
        return answers

    def _check_model(self, model: str) -> None:
        """Every answer comes from the model /healthz named at load (or, without one, the first answer's): a
        server that swapped its model mid-run would store two models' answers under one run."""
        with self._model_lock:
            if self.model is None:
                self.model = model
                return
        if model != self.model:
            said = "/healthz said it serves" if _text((self.health or {}).get("model")) else "its first answer came from"
            raise RemoteError(200, f"the server at {self.endpoint} answered as model {model[:200]!r}, but {said} "
                              f"{self.model!r}: its answers would mix two models in one run (did it restart with "
                              "another model?); run again against a server serving one model")

    def forward_many(self, batch: list[HttpPrepared]) -> list[dict[str, QuestionAnswer]]:
        """Every request POSTed with `concurrency` in flight; each prepared item gets its own client_ms."""
        if self._pool is None or len(batch) < 2:
            return [self.forward(p) for p in batch]
        futures = [self._pool.submit(self.forward, p) for p in batch]
        wait(futures)  # every request finishes (or fails) before the first failure is raised
        return [f.result() for f in futures]

    def tokens(self, prepared: HttpPrepared) -> int:
        return prepared.tokens

    def synchronize(self) -> None:
        """Nothing to wait for: a POST has finished when it returns."""

    def report(self) -> EngineReport:
        """Asked once the suite is answered (quantbench.run.kernel.kernel_ran): the server must still serve what
        it served at load; the server's own forward time beside the client's becomes extra.server_timing."""
        checked = self._check_identity()
        timing = server_timing(self._timed)
        return EngineReport(server=None if timing is None else {**timing, "identity_at_end": checked})

    def _check_identity(self) -> str:
        """RemoteError when /healthz now names another model, variant, dtype, GPU or model hash than at load: a
        server restarted with another variant of the same model names the same model in every answer, and only
        /healthz tells. A server that does not answer now is not held against the run (every answer was checked),
        but the run says so: what is returned goes into extra.server_timing.identity_at_end."""
        if self.health is None:
            return "not checked: the server had no /healthz at load"
        try:
            now = get_health(self.client, self.endpoint)
        except (QuantbenchError, httpx.HTTPError) as e:
            return f"not checked: /healthz did not answer at the run's end ({type(e).__name__})"
        if now.status_code != 200:
            return f"not checked: /healthz answered {now.status_code} at the run's end"
        changed = _changed(identity(self.health), identity(_json(now)))
        if changed:
            raise RemoteError(200, f"the server at {self.endpoint} changed what it serves during the run "
                              f"({changed}): its answers may mix two models; run again against a server serving "
                              "one model")
        return "the same as at load (/healthz read again at the run's end)"

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
        self.client.close()


def server_timing(timed: list[tuple[float, float, int]]) -> dict[str, Any] | None:
    """The server's forward time (its model_ms) beside the client's end-to-end time over the same answers (cold
    and warm-up ones included), in ms, and the answers that waited out a full queue (their waits are in the
    client's time, the run's stored latencies). None before any answer."""
    if not timed:
        return None
    client, server = [t[0] for t in timed], [t[1] for t in timed]
    return {"decisions": len(timed), "client_ms_p50": statistics.median(client),
            "server_model_ms_p50": statistics.median(server), "client_ms_mean": statistics.fmean(client),
            "server_model_ms_mean": statistics.fmean(server), "retried": sum(1 for t in timed if t[2]),
            "note": "server_model_ms: the server's own forward time (its model_ms); the run's latencies are the "
                    "client's, end to end (network, queue, parsing, and the waits of answers asked again after a "
                    "full queue's Retry-After or a dropped connection: `retried`)"}


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What differs between two identities, as `key: before → after` (empty when nothing does)."""
    return "; ".join(f"{k}: {str(before[k])[:100]!r} → {str(after.get(k))[:100]!r}"
                     for k in before if before[k] != after.get(k))


def get_health(client: httpx.Client, endpoint: str) -> Answer:
    """GET /healthz, read whole within HEALTH_TIMEOUT_S and MAX_HEALTH_BYTES."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    return read_bounded(client, "GET", endpoint + "/healthz", deadline, MAX_HEALTH_BYTES)


def _tls_problem(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a connection error (a certificate that does not verify, an http server spoken TLS
    to), or None: waiting does not change it."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _tls_refusal(endpoint: str, problem: ssl.SSLError) -> ConfigError:
    if isinstance(problem, ssl.SSLCertVerificationError):
        return ConfigError(
            f"--endpoint {endpoint}: its TLS certificate does not verify ({problem.verify_message or problem}); "
            "give its CA in $SSL_CERT_FILE, or pass --no-tls-verify to accept any certificate (then anyone between "
            "here and the server can read the API key and the answers; the run records it)")
    return ConfigError(f"--endpoint {endpoint}: the TLS handshake failed ({problem}); is it an http:// server?")


def wait_ready(client: httpx.Client, endpoint: str, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """GET /healthz until 200 (a 503 means still loading); the JSON it returns, or LoadError / ConfigError.
    What a wait does not change (a redirect, a refusal, a certificate) is said at once."""
    url = endpoint + "/healthz"
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        try:
            r = get_health(client, endpoint)
        except httpx.TransportError as e:
            if problem := _tls_problem(e):
                raise _tls_refusal(endpoint, problem) from e
            if elapsed > min(CONNECT_GRACE_S, timeout_s):
                raise LoadError(
                    f"no SystemOne server answers at {endpoint} ({type(e).__name__}: {e}); "
                    "start one with `quantbench serve --backend <name> --port <port>` or fix --endpoint"
                ) from e
            time.sleep(POLL_S)
            continue
        except (httpx.HTTPError, RemoteError) as e:
            raise LoadError(f"{url} did not answer as a SystemOne server ({e})") from e
        if r.status_code == 200:
            return _json(r)
        _refuse_health(r, url, endpoint)
        if elapsed > timeout_s:
            raise LoadError(f"{url} did not turn ready within {timeout_s:.0f} s (last answer "
                            f"{r.status_code}: {r.text[:500]})")
        wait_s = retry_after_s(r.headers.get("retry-after")) if r.status_code in RETRIED else None
        time.sleep(min(max(wait_s or 0.0, POLL_S), max(POLL_S, timeout_s - elapsed)))


def _refuse_health(r: Answer, url: str, endpoint: str) -> None:
    """Raise for a /healthz answer that waiting will not change: a redirect, a key asked for, a 4xx; a 5xx and a
    408 / 425 / 429 are waited out (a proxy answers 502 while the server behind it starts)."""
    if r.status_code == 401:
        raise ConfigError(f"{url} wants an API key: pass --api-key or set {API_KEY_ENV}")
    if r.status_code == 404:
        raise LoadError(
            f"{url} is not found: is {endpoint} a SystemOne server (it must answer GET /healthz)?"
        )
    if 300 <= r.status_code < 400:
        raise ConfigError(f"{url} answered {r.status_code}: {_redirect(r)}")
    if 400 <= r.status_code < 500 and r.status_code not in (408, 425, *RETRIED):
        raise ConfigError(f"{url} answered {r.status_code}: {_reason(r)}; fix --endpoint (or the server's "
                          "--allowed-host)")
    if r.status_code == 503 and _json(r).get("status") == "failed":
        raise LoadError(f"the server at {endpoint} failed to load its model: {str(_json(r).get('error'))[:2000]}")


def _valid_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The fields of a server's VariantInfo that validate as one: a server that is not quantbench may report
    `variant: 5` or `disk_bytes: "lots"` (kept in extra.server all the same)."""
    while True:
        try:
            VariantInfo(**values)
            return values
        except ValidationError as e:
            bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]} & set(values)
            if not bad:
                raise
            values = {k: v for k, v in values.items() if k not in bad}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def variant_info(health: dict[str, Any], endpoint: str, concurrency: int, tls_verify: bool = True) -> VariantInfo:
    """The run's provenance: what the server says it serves (quantbench servers report a full VariantInfo)."""
    remote = health.get("info") if isinstance(health.get("info"), dict) else {}
    known = {f.name for f in fields(VariantInfo)} - {"extra", "load_note"}
    values = {k: v for k, v in remote.items() if k in known}
    kernel = _text(values.get("kernel_path")) or _text(health.get("kernel_path")) or "unknown"
    values.update(
        variant=_text(values.get("variant")) or _text(health.get("variant")) or "http",
        weight_format=_text(values.get("weight_format")) or _text(health.get("weight_format")) or "unknown (remote)",
        kernel_path=f"http → {kernel}",
        compute_dtype=_text(values.get("compute_dtype")) or _text(health.get("compute_dtype")) or "unknown",
        model_id=_text(values.get("model_id")) or _text(health.get("model")) or endpoint,
    )
    note = ("answers and latencies measured over HTTP, client side and end to end; the model, GPU and memory are "
            "the server's (extra.server)")
    extra = {"endpoint": endpoint, "concurrency": concurrency, "server": health, "server_gpu": health.get("gpu")}
    if not tls_verify:
        note += "; the server's TLS certificate was not verified (--no-tls-verify)"
        extra["tls_verify"] = False
    return VariantInfo(**_valid_fields(values), load_note=note, extra=extra)


class HttpOptions(BackendOptions):
    endpoint: str | None = opt(None, "http backend: base URL of a SystemOne server", after="--nvfp4-activations")
    api_key: str | None = opt(None, "http backend: API key", envvar=API_KEY_ENV, after="--concurrency", hashed=False,
                              secret=True)
    tls_verify: bool = opt(True, "http backend: check the server's TLS certificate (--no-tls-verify accepts any: "
                           "anyone between here and the server could read the API key and answers; recorded on "
                           "the run)", flag="--tls-verify/--no-tls-verify", after="--api-key", hashed=False)


_WARNED: set[str] = set()  # endpoints whose clear-text API key was warned about in this process


def _api_key(spec: RunSpec) -> str | None:
    """The key sent to the server: --api-key, else $QUANTBENCH_API_KEY (a sweep's or an API caller's spec)."""
    return spec.options.api_key or os.environ.get(API_KEY_ENV) or None


class HttpBackend:
    name = "http"
    remote = True  # answers through --endpoint: no local weights (quantbench.run.backend.Backend.remote)
    default_model = None  # a remote server: nothing to prepare here
    summary = (
        "any SystemOne HTTP server (quantbench serve, serve_clef.py): client-side latency, server's answers"
    )
    Options = HttpOptions

    def availability(self, machine: Any) -> Availability:
        return Availability(
            True, None, "sends the suite to --endpoint (a SystemOne server); needs no GPU here"
        )

    def check(self, spec: RunSpec, machine: Any) -> None:
        """In the parent, before a child starts or anything is stored: --endpoint is an http(s) base URL; an API
        key bound for it in clear text over a network is warned about (once, here)."""
        endpoint = normalize_endpoint(spec.options.endpoint)
        warning = key_in_clear(endpoint, _api_key(spec))
        if warning and endpoint not in _WARNED:  # `run` checks before its runs and each run again
            _WARNED.add(endpoint)
            print(warning, file=sys.stderr)

    def load(self, spec: RunSpec, machine: Any) -> LoadedVariant:
        endpoint = normalize_endpoint(spec.options.endpoint)
        api_key = _api_key(spec)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(
            max_connections=spec.concurrency + 2, max_keepalive_connections=spec.concurrency + 2
        )
        client = httpx.Client(headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S,
                              verify=spec.options.tls_verify)
        try:
            health = wait_ready(client, endpoint, min(READY_TIMEOUT_S, spec.timeout_s))
            engine = HttpEngine(
                endpoint,
                client,
                concurrency=spec.concurrency,
                timeout_s=min(REQUEST_TIMEOUT_S, spec.timeout_s),
                media_base=Path(spec.suite).resolve().parent if spec.suite else None,
                limits=Limits(max_options=spec.max_options),
                health=health,
            )
        except BaseException:
            client.close()
            raise
        info = variant_info(health, endpoint, spec.concurrency, spec.options.tls_verify)
        return LoadedVariant(engine=engine, info=info, model=None)
