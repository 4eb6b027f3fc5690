"""The server's settings, declared once: `ServerSettings`, one field a setting, each declared with `setting(...)`:
its default, its `serve` flag's help, the least value it takes (or the value it must be above), and where `serve
--help` shows its flag. The `serve` flags (quantbench.cli.serve), the refusal of a bad value (naming the flag and
the fix), what `quantbench serve` hands the app and what the app builds its batcher, endpoint and guard from
(quantbench.server.app.create_app takes one ServerSettings) all derive from it, as a backend's settings derive
from its `Options` (quantbench.run.spec).

A module of its own, importing nothing heavy, so `serve --help` reads it without the server (fastapi, torch).
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
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
    bound_refusal,
)

API_KEY_ENV = "QUANTBENCH_API_KEY"
DEFAULT_MAX_BATCH = 16
# 0: a batch is whatever queued while the previous forward pass ran. Measured with benchmarks/serve_load.py on
# the fixture: waiting 5 ms for company cost 1 client ~5 ms and bought no throughput at 4 or 16 clients.
DEFAULT_MAX_WAIT_MS = 0.0
DEFAULT_MAX_QUEUE = 64
# An admitted request that has waited this long in the queue is refused (503 with Retry-After) instead of answered
# late, and a request whose expected wait is longer is refused at admission. The queue bound alone already bounds
# the wait (a full queue is max_queue / max_batch forward passes deep: 4 with the defaults, ~0.6 s at the 30B shape
# on an H200); this deadline is the backstop for slow forward passes (a CPU's take seconds), and `--max-queue-ms`
# makes it a latency objective.
DEFAULT_MAX_QUEUE_MS = 10000.0


def setting(default: Any, help: str | None, *, flag: str | None = None, after: str | None = None,
            least: float | None = None, above: float | None = None, most: float | None = None,
            envvar: str | None = None) -> Any:
    """Declare one server setting. flag: its `serve` flag (default `--<name with dashes>`; `--a/--no-a` for a
    boolean); help None: no flag of its own (the media limits: the flags `run` shares). after: the flag it follows
    in `serve --help` (None: the setting declared before it). least / above: a smaller value (one not above) is
    refused, naming the flag; most: a larger one is. A tuple setting is a repeatable flag."""
    metadata = dict(help=help, flag=flag, after=after, least=least, above=above, most=most, envvar=envvar)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ServerSettings:
    """What `quantbench serve` serves with: where it listens, who it answers, how it batches and what it refuses.
    The model served is a RunSpec's (quantbench.server.command)."""

    host: str = setting("127.0.0.1", "Address to bind (loopback unless told otherwise)", after="--backend")
    # bounded here: uvicorn took --port 70000 after loading the model and failed binding it with a traceback
    port: int = setting(8000, "Port (0: any free port)", least=0, most=65535)
    api_key: str | None = setting(None, "Require this key on every request", envvar=API_KEY_ENV)
    allowed_hosts: tuple[str, ...] = setting(
        (), "A Host name the server answers besides the loopback names and --host (repeatable; '*': any). Requests "
        "addressed to any other name get 400: a web page cannot reach the server by DNS rebinding",
        flag="--allowed-host")
    allow_truncation: bool = setting(False, "Cut over-long states instead of answering 413", after="--demo")
    max_batch: int = setting(DEFAULT_MAX_BATCH, "Most requests batched into one forward pass", after="--dtype",
                             least=1)
    max_queue: int = setting(DEFAULT_MAX_QUEUE, "Most requests admitted at once (being prepared, queued or "
                             "answered); past it a request gets 503 with Retry-After at once", least=1)
    max_queue_ms: float = setting(
        DEFAULT_MAX_QUEUE_MS, "Queue deadline: a request whose expected wait (the forward passes ahead of it) is "
        "over this many ms gets 503 with Retry-After at once, and an admitted one still waiting after it gets it "
        "then (0: none)", least=0)
    max_wait_ms: float = setting(DEFAULT_MAX_WAIT_MS, "How long a forward pass waits for more requests to batch "
                                 "(0: it takes what queued meanwhile)", least=0)
    warm: bool = setting(True, "Before /healthz says ok, answer the demo request (on a GPU at batches 1, 2, 4 … "
                         "--max-batch: compiles, captures graphs, reports the kernel that ran)")
    warm_tokens: tuple[int, ...] = setting(
        DEFAULT_WARM_TOKENS, "On a GPU the warm-up also captures each batch size padded to this many tokens "
        "(repeatable; default 512: the reference workload), and for a model that reads pictures this many tokens "
        "plus a 448 x 448 picture's, so no client's first request of that shape waits for a capture")
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, "Largest request body (413 past it)",
                                  after="--trust-remote-code", least=1)
    max_questions: int = setting(DEFAULT_MAX_QUESTIONS, "Most questions per request (413 past it)")
    max_options: int = setting(DEFAULT_MAX_OPTIONS, "Most options of one question (422 past it; past 26 they are "
                               "numbered and scored by continuation)")
    max_total_options: int = setting(DEFAULT_MAX_TOTAL_OPTIONS, "Most options over all questions of a request, "
                                     "yes/no counting two (413 past it)")
    max_request_tokens: int = setting(DEFAULT_MAX_REQUEST_TOKENS, "Most tokens of a request's sequences, padded "
                                      "(413 past it); also the most per batched forward pass", least=1)
    request_timeout_s: float = setting(
        DEFAULT_REQUEST_TIMEOUT_S, "Seconds from a request's headers to its answer: 408 while its body is read, 504 "
        "after (the request is dropped)", flag="--request-timeout", above=0)
    header_timeout_s: float = setting(DEFAULT_HEADER_TIMEOUT_S, "Seconds a connection may take to send a "
                                      "request's headers before it is closed", flag="--header-timeout", above=0)
    access_log: bool = setting(False, "Log a line per request on stderr (off: at hundreds a second it is work on "
                               "the loop that answers them)")
    # the media limits that differ from their default, by name (quantbench.limits.MEDIA_LIMITS), set by the
    # media flags `serve` shares with `run` (quantbench.cli.media_flags)
    media_limits: dict[str, int] = setting({}, None)

    def __post_init__(self) -> None:
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            # "" (an unset variable in `--api-key "$KEY"`) served with no key at all, and a key with spaces at
            # either end matched no request (HTTP trims a header's value): both refused rather than run
            what = "is empty" if not self.api_key.strip() else "has spaces at its start or end (HTTP trims a header)"
            raise ConfigError(f"--api-key / {API_KEY_ENV} {what}: give the key itself, or leave both unset to serve "
                              "without one")
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "warm_tokens", tuple(self.warm_tokens))
        for f in fields(self):
            if why := refusal(f, getattr(self, f.name)):
                raise ConfigError(why)
        self.limits()  # the request limits' own checks, each naming its flag (quantbench.limits)

    def limits(self) -> Limits:
        """The limits a request is refused by: questions, options, media (quantbench.limits)."""
        return Limits(max_options=self.max_options, max_questions=self.max_questions,
                      max_total_options=self.max_total_options, **self.media_limits)


def flag_of(f: Field) -> str:
    """A setting's `serve` flag, without a `/--no-x` part."""
    return (f.metadata.get("flag") or "--" + f.name.replace("_", "-")).partition("/")[0]


def refusal(f: Field, value: Any) -> str | None:
    """Why `value` is refused for the setting `f`, naming its flag and the fix; None when it is taken."""
    if value is None or not any(f.metadata.get(k) is not None for k in ("least", "above", "most")):
        return None
    return bound_refusal(flag_of(f), value, least=f.metadata.get("least"), above=f.metadata.get("above"),
                         most=f.metadata.get("most"))


def declared() -> list[tuple[Field, Any, str | None]]:
    """(field, default, the flag it follows in `serve --help`) of every setting with a `serve` flag of its own, in
    declaration order; a setting without `after` follows the one declared before it."""
    out: list[tuple[Field, Any, str | None]] = []
    before: Field | None = None
    for f in fields(ServerSettings):
        if f.metadata.get("help") is None:
            continue
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        out.append((f, default, f.metadata.get("after") or (flag_of(before) if before is not None else None)))
        before = f
    return out
