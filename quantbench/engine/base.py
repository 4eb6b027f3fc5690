"""The engine protocol: what the child process asks of a loaded variant, optional features included.

    prepared = engine.prepare(request)         # tokenization (or a request body): timed apart
    engine.warm([prepared, ...])               # make ready what this batch will replay (a CUDA graph), untimed
    answers = engine.forward(prepared)         # the model: what the latency figures time
    engine.report()                            # EngineReport: what ran (fused decoder ops, CUDA graph replays)

An engine subclasses `EngineBase`, which gives every optional feature a default that does nothing, so the child
calls each one without probing for it. `Prepared` is the base of what `prepare` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from quantbench.protocol import QuestionAnswer


@dataclass(kw_only=True)
class Prepared:
    """The part of a prepared request the child reads. `rows`: the token ids of each batch row, which the run's
    tokenizer_hash is made from (None: not seen here, e.g. a remote server tokenizes). `client_ms`: the time the
    engine measured itself for this request within a `forward_many` (a remote request's end-to-end time; None:
    the batch's model time stands for it)."""

    rows: list[list[int]] | None = None
    client_ms: float | None = None


@dataclass
class EngineReport:
    """What an engine ran, for the run's kernel path and `extra`. `fused_ops`: the decoder ops quantbench's Triton
    kernels ran ("rmsnorm+rope+qkv"; None: transformers' own). `graphs`: what the CUDA graphs did (replays,
    eager_calls, ...; None where there are none, e.g. on the CPU). `media`: what reads the model's media (the
    media types, which video processor ran; None: a text-only engine). `server`: what a remote server said of its
    own work (its forward time beside the client's end-to-end time, the waits for a full queue; None: local)."""

    fused_ops: str | None = None
    graphs: dict[str, Any] | None = None
    media: dict[str, Any] | None = None
    server: dict[str, Any] | None = None


@runtime_checkable
class DecisionEngine(Protocol):
    modalities: frozenset[str]  # the media part types its model reads (quantbench.protocol.media); empty: text only

    def prepare(self, request: Any) -> Prepared: ...
    def forward(self, prepared: Any) -> dict[str, QuestionAnswer]: ...
    def forward_many(self, batch: list[Any]) -> list[dict[str, QuestionAnswer]]: ...
    def tokens(self, prepared: Any) -> int: ...
    def synchronize(self) -> None: ...
    def warm(self, batch: list[Any]) -> None: ...
    def report(self) -> EngineReport: ...


class EngineBase:
    """The optional features' defaults: nothing to warm, nothing to wait for, nothing special ran, text only."""

    modalities: frozenset[str] = frozenset()

    def warm(self, batch: list[Any]) -> None:
        """Make ready, outside any timing, what the forward of `batch` will use (a CUDA graph)."""

    def synchronize(self) -> None:
        """Wait until the work handed to the device has finished (nothing to wait for by default)."""

    def report(self) -> EngineReport:
        return EngineReport()
