"""The generic run settings that have allowed values or bounds, declared once: their default, the `run` flag and
its help, the values allowed, the least value. RunSpec's fields (quantbench.run.spec), the `run` flags
(quantbench.cli.run), the checks before a run (quantbench.run.checks) and the sweep file's checks
(quantbench.sweep.spec) derive from these declarations, as a backend's settings derive from its `Options`.

A module of its own, importing nothing heavy, so `quantbench --help` reads it without loading pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantbench.limits import DEFAULT_MAX_OPTIONS, bound_refusal

# `run --repeat N` and a sweep's `repeats`: each repeat is a fresh process, so 1000 is already days of a real model.
# Unbounded, --repeat 2147483648 ran its first run and then lost it (the store's INTEGER repeat_count refused the
# row: "Current transaction is aborted"), and a sweep's repeats = 3000000000 planned runs until memory ran out.
MAX_REPEATS = 1000

# `run --concurrency N`: N decisions in one forward pass (a local model) or N requests in flight (http). The warm-up
# and latency phases fill each batch by cycling the suite, so --concurrency 100000 with --limit 2 built batches of
# 100,000 decisions (an `oom` row after minutes of allocating, or 100,000 sockets). The server batches 16 by default.
MAX_CONCURRENCY = 1024


@dataclass(frozen=True)
class Generic:
    """One generic run setting. `flag` None: no `run` flag of its own (role: --reference / --noise-floor);
    `least`: values below it are refused (`above`: values at or below it, `most`: values above it); `unit`: what a refusal calls the
    bound's units ("seconds")."""

    default: Any
    help: str | None
    flag: str | None
    choices: tuple[str, ...] = ()
    least: float | None = None
    above: float | None = None
    unit: str = ""
    most: float | None = None  # values above it are refused


GENERIC: dict[str, Generic] = {
    "dtype": Generic("bfloat16", "bfloat16 | float32 | float16 (compute dtype)", "--dtype",
                     choices=("bfloat16", "float16", "float32")),
    "method": Generic("auto", "auto (label logits when possible) | continuation", "--method",
                      choices=("auto", "continuation")),
    "role": Generic("candidate", None, None, choices=("candidate", "reference", "noise_floor")),
    "concurrency": Generic(1, "Requests in flight (http) or batched per forward pass (throughput mode)",
                           "--concurrency", least=1, most=MAX_CONCURRENCY),
    "layers": Generic(None, "Synthetic shape: number of layers", "--layers", least=1),
    "max_options": Generic(DEFAULT_MAX_OPTIONS, "Largest number of options a question may have (past 26 they are "
                           "numbered and scored by continuation)", "--max-options", least=2),
    "max_tokens": Generic(None, "Prompt token limit (default: the model's context)", "--max-tokens", least=1),
    "warmup": Generic(3, "Untimed warm-up decisions", "--warmup", least=0),
    "latency_min_decisions": Generic(20, "Latency phase: at least this many timed decisions",
                                     "--latency-min-decisions", least=0),
    "latency_min_seconds": Generic(2.0, "Latency phase: and at least this many seconds", "--latency-min-seconds",
                                   least=0, unit="seconds"),
    "limit": Generic(None, "Only the first N records of the suite", "--limit", least=1),
    "timeout_s": Generic(1800.0, "Seconds before the run is killed (a `timeout` row)", "--timeout", above=0,
                         unit="seconds"),
    "seed": Generic(0, None, None, least=0),
}


def one_of(choices: tuple[str, ...]) -> str:
    """How a refusal lists the allowed values: "auto or continuation", "one of bfloat16, float16, float32"."""
    return " or ".join(choices) if len(choices) == 2 else f"one of {', '.join(choices)}"


def refusal(name: str, value: Any) -> str | None:
    """Why `value` is refused for the generic setting `name`, naming its flag (or its name) and the fix; None when
    it is allowed (None itself is: an unset optional setting)."""
    how = GENERIC[name]
    where = how.flag or name
    if value is None:
        return None
    if how.choices and value not in how.choices:
        return f"{where} {value!r}: use {one_of(how.choices)}"
    return bound_refusal(where, value, least=how.least, above=how.above, most=how.most, unit=how.unit)
