"""`--backend http`: answer the suite through any SystemOne server (`quantbench serve`, serve_clef.py, ...).

    quantbench serve --backend int4 --port 8000 &
    quantbench run --backend http --endpoint http://127.0.0.1:8000 --concurrency 4

`load` waits for GET /healthz to answer 200 and records what the server says it serves as the run's provenance.
`prepare` serialises a request (a suite's `"path"` media parts inlined as data URIs: a server never reads local
files; each file checked as a local run checks it, its mime type sniffed from its bytes), `forward` is the POST (its wall time, end to end on the client, is what the
runner times), `forward_many` keeps `concurrency` POSTs in flight. A 503 with Retry-After (queue full) is
retried within the request timeout; any other error status becomes a `RemoteError` carrying the server's reason,
a `RemoteRequestError` (a RequestError: the run names the record and the field) when the server names a field.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx

from quantbench.engine.base import EngineBase, Prepared
from quantbench.errors import ConfigError, LoadError, QuantbenchError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import DecisionRequest, DecisionResponse, QuestionAnswer
from quantbench.run.backend import Availability, LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.run.spec import BackendOptions, RunSpec, opt

API_KEY_ENV = "QUANTBENCH_API_KEY"
PATH = "/v1/systemone"
REQUEST_TIMEOUT_S = 300.0  # one decision, retries included
READY_TIMEOUT_S = 600.0  # a server still loading its model (503) is waited for this long at most
CONNECT_GRACE_S = 30.0  # nothing listening: give a server that is still importing this long, then fail
POLL_S = 0.25


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


def _refusal(response: httpx.Response, url: str) -> RemoteError:
    """The error of a non-200 answer: a RemoteRequestError when a 4xx body names the field (quantbench servers'
    ErrorBody: detail, field, fix), else a RemoteError with the server's reason."""
    body = _json(response)
    field, detail, fix = body.get("field"), str(body.get("detail", "")), body.get("fix") or ""
    if 400 <= response.status_code < 500 and isinstance(field, str) and field and field != "request":
        problem = detail.removeprefix(f"{field}: ").removesuffix(f" ({fix})") if detail else "refused"
        return RemoteRequestError(response.status_code, url, field, problem, str(fix))
    return RemoteError(response.status_code, f"POST {url} answered {response.status_code}: {_reason(response)}")


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
    url = endpoint.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--endpoint {endpoint!r} must start with http:// or https://, e.g. http://127.0.0.1:8000"
        )
    return url.removesuffix(PATH)  # accept the full /v1/systemone URL too


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return json.dumps(body)[:500]


def check_answers(request: DecisionRequest, answers: dict[str, QuestionAnswer]) -> dict[str, QuestionAnswer]:
    """The server's answers in the request's question and option order; RemoteError if any is missing or off."""
    out: dict[str, QuestionAnswer] = {}
    for name, question in request.questions.items():
        if name not in answers:
            raise RemoteError(
                200, f"the server did not answer question {name!r} (answered {sorted(answers)})"
            )
        ans, options = answers[name], question.options
        if set(ans.probabilities) != set(options) or ans.top not in options:
            raise RemoteError(
                200,
                f"the server answered {name!r} with options {sorted(ans.probabilities)} (top {ans.top!r}); "
                f"the request's options are {options}",
            )
        probs = {o: ans.probabilities[o] for o in options}
        out[name] = ans.model_copy(update={"probabilities": probs})
    return out


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
    ):
        """`media_base`: the suite file's folder, where `path` media parts are read from (None: refused);
        `limits`: what those files are checked against (a local run's: the protocol's defaults)."""
        if concurrency < 1:
            raise ConfigError(f"--concurrency {concurrency}: use 1 or more requests in flight")
        self.url, self.client = normalize_endpoint(endpoint) + PATH, client
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.media_base, self.limits = media_base, limits or Limits()
        self._pool = (
            ThreadPoolExecutor(concurrency, thread_name_prefix="quantbench-http") if concurrency > 1 else None
        )

    def prepare(self, request: DecisionRequest) -> HttpPrepared:
        from quantbench.protocol.media import inline_media_paths  # numpy: not at import (Adding a backend)

        sent = inline_media_paths(request, self.limits, base=self.media_base)
        body = sent.model_dump(mode="json", exclude_none=True)
        return HttpPrepared(request, json.dumps(body, ensure_ascii=False).encode("utf-8"))

    def forward(self, prepared: HttpPrepared) -> dict[str, QuestionAnswer]:
        deadline = time.monotonic() + self.timeout_s
        t0 = time.perf_counter()
        prepared.retries = 0
        reconnected = False
        while True:
            try:
                r = self.client.post(
                    self.url,
                    content=prepared.body,
                    headers={"Content-Type": "application/json"},
                    timeout=max(0.1, deadline - time.monotonic()),
                )
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
            except httpx.TransportError as e:
                raise RemoteError(None, f"POST {self.url}: {type(e).__name__}: {e}") from e
            retry_after = r.headers.get("retry-after", "")
            if (
                r.status_code == 503
                and retry_after.isdigit()
                and time.monotonic() + int(retry_after) < deadline
            ):
                prepared.retries += 1
                time.sleep(
                    max(int(retry_after), POLL_S)
                )  # the server's queue is full: come back when it says
                continue
            break
        prepared.client_ms = (time.perf_counter() - t0) * 1000.0
        if r.status_code != 200:
            raise _refusal(r, self.url)
        try:
            response = DecisionResponse.model_validate_json(r.content)
        except ValueError as e:
            raise RemoteError(200, f"POST {self.url} did not return a SystemOne answer: {e}") from e
        prepared.server_ms, prepared.tokens = response.model_ms, response.tokens
        batch = r.headers.get("x-quantbench-batch", "")
        prepared.batch = int(batch) if batch.isdigit() else None
        return check_answers(prepared.request, response.answers)

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

    def close(self) -> None:
        if self._pool:
            self._pool.shutdown(wait=True)
        self.client.close()


def wait_ready(client: httpx.Client, endpoint: str, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """GET /healthz until 200 (a 503 means still loading); the JSON it returns, or LoadError / ConfigError."""
    url = endpoint + "/healthz"
    start = time.monotonic()
    last = ""
    while True:
        elapsed = time.monotonic() - start
        try:
            r = client.get(url, timeout=10.0)
        except httpx.TransportError as e:
            if elapsed > min(CONNECT_GRACE_S, timeout_s):
                raise LoadError(
                    f"no SystemOne server answers at {endpoint} ({type(e).__name__}: {e}); "
                    "start one with `quantbench serve --backend <name> --port <port>` or fix --endpoint"
                ) from e
            time.sleep(POLL_S)
            continue
        if r.status_code == 200:
            return _json(r)
        if r.status_code == 401:
            raise ConfigError(f"{url} wants an API key: pass --api-key or set {API_KEY_ENV}")
        if r.status_code == 404:
            raise LoadError(
                f"{url} is not found: is {endpoint} a SystemOne server (it must answer GET /healthz)?"
            )
        last = f"{r.status_code}: {r.text[:500]}"
        if r.status_code == 503 and _json(r).get("status") == "failed":
            raise LoadError(f"the server at {endpoint} failed to load its model: {_json(r).get('error')}")
        if elapsed > timeout_s:
            raise LoadError(f"{url} did not turn ready within {timeout_s:.0f} s (last answer {last})")
        time.sleep(POLL_S)


def variant_info(health: dict[str, Any], endpoint: str, concurrency: int) -> VariantInfo:
    """The run's provenance: what the server says it serves (quantbench servers report a full VariantInfo)."""
    remote = health.get("info") if isinstance(health.get("info"), dict) else {}
    known = {f.name for f in fields(VariantInfo)} - {"extra", "load_note"}
    values = {k: v for k, v in remote.items() if k in known}
    kernel = values.get("kernel_path") or health.get("kernel_path") or "unknown"
    values.update(
        variant=values.get("variant") or health.get("variant") or "http",
        weight_format=values.get("weight_format") or health.get("weight_format") or "unknown (remote)",
        kernel_path=f"http → {kernel}",
        compute_dtype=values.get("compute_dtype") or health.get("compute_dtype") or "unknown",
        model_id=values.get("model_id") or health.get("model") or endpoint,
    )
    return VariantInfo(
        **values,
        load_note="answers and latencies measured over HTTP, client side and end to end; the model, GPU and "
        "memory are the server's (extra.server)",
        extra={
            "endpoint": endpoint,
            "concurrency": concurrency,
            "server": health,
            "server_gpu": health.get("gpu"),
        },
    )


class HttpOptions(BackendOptions):
    endpoint: str | None = opt(None, "http backend: base URL of a SystemOne server", after="--nvfp4-activations")
    api_key: str | None = opt(None, "http backend: API key", envvar=API_KEY_ENV, after="--concurrency", hashed=False,
                              secret=True)


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
        """In the parent, before a child starts: --endpoint is given and is an http(s) URL."""
        normalize_endpoint(spec.options.endpoint)

    def load(self, spec: RunSpec, machine: Any) -> LoadedVariant:
        endpoint = normalize_endpoint(spec.options.endpoint)
        api_key = spec.options.api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(
            max_connections=spec.concurrency + 2, max_keepalive_connections=spec.concurrency + 2
        )
        client = httpx.Client(headers=headers, limits=limits, timeout=REQUEST_TIMEOUT_S)
        try:
            health = wait_ready(client, endpoint, min(READY_TIMEOUT_S, spec.timeout_s))
            engine = HttpEngine(
                endpoint,
                client,
                concurrency=spec.concurrency,
                timeout_s=min(REQUEST_TIMEOUT_S, spec.timeout_s),
                media_base=Path(spec.suite).resolve().parent if spec.suite else None,
                limits=Limits(max_options=spec.max_options),
            )
        except BaseException:
            client.close()
            raise
        return LoadedVariant(engine=engine, info=variant_info(health, endpoint, spec.concurrency), model=None)
