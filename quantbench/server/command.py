"""`quantbench serve`: the command behind the CLI's `serve`, and the only part of the server that prints."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from quantbench.errors import ConfigError
from quantbench.limits import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_OPTIONS,
    DEFAULT_MAX_QUESTIONS,
    DEFAULT_MAX_REQUEST_TOKENS,
    DEFAULT_MAX_TOTAL_OPTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WARM_TOKENS,
    Limits,
)
from quantbench.models import experts_claim
from quantbench.models.families import synthetic_shapes
from quantbench.models.scorer import describe as describe_scorer
from quantbench.models.scorer import require_trust
from quantbench.run.backend import LoadedVariant, get_backend
from quantbench.run.machine import detect
from quantbench.run.resolve import resolve
from quantbench.run.scorer import with_checkpoint_scorer
from quantbench.run.spec import RunSpec
from quantbench.server.app import create_app, serve
from quantbench.server.app import demo as answer_demo
from quantbench.server.auth import API_KEY_ENV
from quantbench.server.batcher import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_QUEUE_MS,
    DEFAULT_MAX_WAIT_MS,
)
from quantbench.server.guard import WILDCARD_BINDS
from quantbench.server.guard import allowed_hosts as allowed_hosts_for


def cli_serve(
    model: str | None,
    backend: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    demo: bool = False,
    allow_truncation: bool = False,
    max_batch: int = DEFAULT_MAX_BATCH,
    trust_remote_code: bool = False,
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_questions: int = DEFAULT_MAX_QUESTIONS,
    max_options: int = DEFAULT_MAX_OPTIONS,
    max_total_options: int = DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    media_limits: dict[str, int] | None = None,
    options: dict[str, Any] | None = None,
    shape: str | None = None,
    layers: int | None = None,
    seed: int = 0,
    dtype: str = "bfloat16",
    max_queue: int = DEFAULT_MAX_QUEUE,
    max_queue_ms: float = DEFAULT_MAX_QUEUE_MS,
    warm: bool = True,
    warm_tokens: tuple[int, ...] = DEFAULT_WARM_TOKENS,
    access_log: bool = False,
    allowed_hosts: list[str] | None = None,
) -> int:
    """`quantbench serve`: load `model` through `backend` (as `run`'s child does: the same RunSpec, its backend's
    own options such as cuda_graph and fused_ops, `shape` for the synthetic real-shape model) and serve it, or
    answer --demo."""
    if backend == "http":
        raise ConfigError(
            "--backend http sends requests to a server; serve a local model with bf16, int4, nvfp4 or fp8"
        )
    if shape is not None:
        if model:
            raise ConfigError("--shape serves a synthetic model with random weights; drop --model, or drop --shape "
                              "to serve the checkpoint")
        if shape not in synthetic_shapes():
            raise ConfigError(f"--shape {shape!r}: unknown; known shapes: {', '.join(sorted(synthetic_shapes()))}")
    if layers is not None and (shape is None or layers < 1):
        raise ConfigError("--layers sets the layer count of a --shape model: give --shape, and 1 or more layers")
    if max_queue < 1 or max_batch < 1 or max_queue_ms < 0:
        raise ConfigError("--max-queue and --max-batch: use 1 or more; --max-queue-ms: 0 (no queue deadline) or more")
    spec = RunSpec(
        backend=backend,
        model=model,
        truncate=allow_truncation,
        trust_remote_code=trust_remote_code,
        max_options=max_options,
        shape=shape,
        layers=layers,
        seed=seed,
        dtype=dtype,
        **(options or {}),
    )
    if max_request_tokens < 1 or max_body_bytes < 1:
        raise ConfigError("--max-request-tokens and --max-body-bytes: use 1 or more")
    if not (request_timeout_s > 0 and header_timeout_s > 0):
        raise ConfigError("--request-timeout and --header-timeout: use a number of seconds above 0")
    # media_limits: {"max_media_bytes": ..., ...} from the --max-media-bytes, --max-image-pixels, ... flags
    Limits(max_options=max_options, max_questions=max_questions, max_total_options=max_total_options,
           **(media_limits or {}))
    machine = detect(with_torch=True)
    spec.device = machine.device
    chosen = get_backend(backend)  # an unknown name fails here, before the port opens
    if model:  # a hub id becomes its cached snapshot now: one that cannot resolve is refused before the port opens
        spec = resolve(spec)
        require_trust(describe_scorer(spec.model), trust_remote_code)  # its own scorer: refused before the port opens

    def load() -> LoadedVariant:
        resolved = resolve(spec)  # no --model: the embedded model, prepared here first
        # a variant is what it claims (quantbench.models.experts_claim): never served under a label it is not
        experts = experts_claim.check_spec(resolved.backend, resolved.model, resolved.shape)
        loaded = with_checkpoint_scorer(chosen.load(resolved, machine), resolved)  # its own scorer, if it names one
        if experts is not None:
            loaded.info.extra = {**loaded.info.extra, "experts": experts}
        return loaded

    if demo:
        loaded = load()
        response = answer_demo(loaded)  # app.demo: the `demo` flag shadows its name here
        print(json.dumps(response.model_dump(mode="json"), indent=2))
        info = loaded.info
        for name, answer in response.answers.items():
            print(
                f"{name}: {answer.top} ({answer.probabilities[answer.top]:.1%}) — {info.model_id} {info.variant}, "
                f"{info.kernel_path}, {response.model_ms:.1f} ms, {response.tokens} tokens",
                file=sys.stderr,
            )
        return 0
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(
            f"warning: serving on {host} without an API key; anyone who reaches it can use the model "
            f"(set --api-key or {API_KEY_ENV})",
            file=sys.stderr,
        )
    hosts = allowed_hosts_for(host, allowed_hosts or [])
    if hosts is None:
        print("warning: --allowed-host '*': requests addressed to any name are answered, so a web page can reach "
              "this server by DNS rebinding", file=sys.stderr)
    elif host in WILDCARD_BINDS and not allowed_hosts:
        print(f"note: serving on {host or 'every interface'}, the server answers requests addressed to "
              f"{', '.join(sorted(hosts))} only; add the names clients use with --allowed-host", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(
        load,
        api_key=api_key,
        max_batch=max_batch,
        max_wait_ms=max_wait_ms,
        max_queue=max_queue,
        max_queue_ms=max_queue_ms,
        warm=warm,
        warm_tokens=tuple(warm_tokens),
        allow_truncation=allow_truncation,
        max_body_bytes=max_body_bytes,
        max_questions=max_questions,
        max_options=max_options,
        max_total_options=max_total_options,
        max_request_tokens=max_request_tokens,
        request_timeout_s=request_timeout_s,
        machine=machine,
        media_limits=media_limits,
        allowed_hosts=hosts,
    )
    code = serve(app, host, port, header_timeout_s=header_timeout_s, access_log=access_log)
    if code:  # serve() stopped the server because the model failed to load; the app's state says why
        print(f"quantbench serve: the model failed to load: {app.state.qb.error}", file=sys.stderr)
    return code
