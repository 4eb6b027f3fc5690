"""`quantbench serve`: the command behind the CLI's `serve`, and the only part of the server that prints."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import replace
from typing import Any

from quantbench.errors import ConfigError
from quantbench.models import experts_claim
from quantbench.models.families import synthetic_shapes
from quantbench.models.scorer import describe as describe_scorer
from quantbench.models.scorer import require_trust
from quantbench.run.backend import LoadedVariant, backend_names, get_backend
from quantbench.run.machine import detect
from quantbench.run.resolve import resolve
from quantbench.run.scorer import with_checkpoint_scorer
from quantbench.run.spec import RunSpec, is_remote
from quantbench.server.app import create_app, serve
from quantbench.server.app import demo as answer_demo
from quantbench.server.guard import WILDCARD_BINDS, allowed_hosts
from quantbench.server.settings import API_KEY_ENV, ServerSettings


def cli_serve(model: str | None, backend: str, settings: ServerSettings | None = None, *, demo: bool = False,
              run: dict[str, Any] | None = None, **changes: Any) -> int:
    """`quantbench serve`: load `model` through `backend` as `run`'s child loads it (the same RunSpec: `run` holds
    its other settings, such as shape, layers, seed, dtype, trust_remote_code and the backend's own options) and
    serve it with `settings` (None: the declared defaults), each of `changes` a setting by name over them; or
    answer --demo."""
    settings = replace(settings or ServerSettings(), **changes)  # a bad value is refused here, naming its flag
    run = run or {}
    shape, layers = run.get("shape"), run.get("layers")
    if is_remote(backend):  # it declares that it answers through a server (quantbench.run.backend.Backend.remote)
        local = ", ".join(name for name in backend_names() if not is_remote(name)) or "a local backend"
        raise ConfigError(f"--backend {backend} sends requests to a server; serve a local model with {local}")
    if shape is not None:
        if model:
            raise ConfigError("--shape serves a synthetic model with random weights; drop --model, or drop --shape "
                              "to serve the checkpoint")
        if shape not in synthetic_shapes():
            raise ConfigError(f"--shape {shape!r}: unknown; known shapes: {', '.join(sorted(synthetic_shapes()))}")
    if layers is not None and (shape is None or layers < 1):
        raise ConfigError("--layers sets the layer count of a --shape model: give --shape, and 1 or more layers")
    spec = RunSpec(backend=backend, model=model, **run, truncate=settings.allow_truncation,
                   max_options=settings.max_options)
    machine = detect(with_torch=True)
    spec.device = machine.device
    chosen = get_backend(backend)  # an unknown name fails here, before the port opens
    if model:  # a hub id becomes its cached snapshot now: one that cannot resolve is refused before the port opens
        spec = resolve(spec)
        require_trust(describe_scorer(spec.model), spec.trust_remote_code)  # its own scorer: refused before the port opens

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
    settings = replace(settings, api_key=settings.api_key or os.environ.get(API_KEY_ENV) or None)
    host = settings.host
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        print(
            f"warning: serving on {host} without an API key; anyone who reaches it can use the model "
            f"(set --api-key or {API_KEY_ENV})",
            file=sys.stderr,
        )
    hosts = allowed_hosts(host, settings.allowed_hosts)
    if hosts is None:
        print("warning: --allowed-host '*': requests addressed to any name are answered, so a web page can reach "
              "this server by DNS rebinding", file=sys.stderr)
    elif host in WILDCARD_BINDS and not settings.allowed_hosts:
        print(f"note: serving on {host or 'every interface'}, the server answers requests addressed to "
              f"{', '.join(sorted(hosts))} only; add the names clients use with --allowed-host", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(load, settings, machine=machine)
    code = serve(app, host, settings.port, header_timeout_s=settings.header_timeout_s, access_log=settings.access_log)
    if code:  # serve() stopped the server because the model failed to load; the app's state says why
        print(f"quantbench serve: the model failed to load: {app.state.qb.error}", file=sys.stderr)
    return code
