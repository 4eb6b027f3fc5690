"""`run_load`: the steps of one load run in order against one server, then its saturation point and the records
to store. Nothing is stored here (the CLI stores the result whole, quantbench.store.load); a server that does not
answer is refused before the first step."""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx

import quantbench
from quantbench.analysis.load import Saturation, step_saturation
from quantbench.errors import ConfigError
from quantbench.load.driver import Driver, Drivers, DriverSettings, StepPlan
from quantbench.load.http import Target
from quantbench.load.requests import endpoint_url, request_bodies, server_health
from quantbench.load.steps import summarize, timing_breakdown
from quantbench.protocol.endpoint import PATH, key_in_clear
from quantbench.run.machine import detect
from quantbench.run.runner import provenance
from quantbench.store.load import LoadRunRecord, LoadStepRecord

DEFAULT_CONCURRENCY = (1, 8, 32, 128)
DEFAULT_REQUESTS = 512
DEFAULT_SECONDS = 30.0
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_WARMUP = 8


@dataclass
class LoadSettings:
    """One load run. `concurrency` (closed loop) or `rate` (open loop), one step per value, in order; each step ends
    after `requests` requests or `seconds` seconds, whichever comes first."""

    endpoint: str
    concurrency: list[int] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    requests: int = DEFAULT_REQUESTS
    seconds: float = DEFAULT_SECONDS
    suite: str | None = None
    card_example: bool = False
    api_key: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    warmup: int = DEFAULT_WARMUP
    ready_timeout_s: float = 60.0
    seed: int = 0
    processes: int = 1  # generator processes, the clients (or the arrival rate) split between them
    honor_retry_after: bool = True  # a closed-loop client waits out a 503's Retry-After before its next request

    def check(self) -> None:
        """Refuse, naming the flag, settings that cannot make a load run."""
        if self.concurrency and self.rate:
            raise ConfigError("--concurrency and --rate: give one (a closed-loop sweep or open-loop arrival rates)")
        if not self.concurrency and not self.rate:
            self.concurrency = list(DEFAULT_CONCURRENCY)
        if any(c < 1 for c in self.concurrency):
            raise ConfigError(f"--concurrency {','.join(map(str, self.concurrency))}: each step needs 1 or more clients")
        if any(not r > 0 for r in self.rate):
            raise ConfigError(f"--rate {','.join(map(str, self.rate))}: each rate must be above 0 requests a second")
        if self.requests < 1 or not self.seconds > 0:
            raise ConfigError("--requests and --seconds bound each step: use 1 or more requests and seconds above 0")
        if not self.timeout_s > 0 or self.warmup < 0:
            raise ConfigError("--timeout: seconds above 0; --warmup: 0 or more requests")
        if self.processes < 1:
            raise ConfigError(f"--processes {self.processes}: use 1 or more generator processes")

    @property
    def mode(self) -> str:
        return "open" if self.rate else "closed"

    def stored(self) -> dict[str, Any]:
        """The settings as stored on the load run (no API key)."""
        return {"concurrency": self.concurrency, "rate": self.rate, "requests": self.requests,
                "seconds": self.seconds, "suite": self.suite, "card_example": self.card_example,
                "timeout_s": self.timeout_s, "warmup": self.warmup, "seed": self.seed,
                "processes": self.processes, "honor_retry_after": self.honor_retry_after}


@dataclass
class LoadResult:
    run: LoadRunRecord
    steps: list[LoadStepRecord]
    saturation: Saturation
    # per step, where a request's time went by the server's Server-Timing (medians, ms; empty for a server that
    # does not send it): quantbench.load.steps.timing_breakdown. Printed, not stored.
    breakdown: list[dict[str, float]] = field(default_factory=list)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def run_load(settings: LoadSettings, on_step: Any = None) -> LoadResult:
    """Measure every step of `settings` against its server. `on_step(record)` is called after each step (the CLI
    prints progress). ConfigError, before any request is sent, when nothing answers at the endpoint."""
    settings.check()
    endpoint = endpoint_url(settings.endpoint)
    if warning := key_in_clear(endpoint, settings.api_key):
        print(warning, file=sys.stderr)
    bodies = request_bodies(settings.suite, settings.card_example)
    with httpx.Client(headers=_headers(settings.api_key)) as client:
        health = server_health(client, endpoint, settings.ready_timeout_s)
    created = dt.datetime.now(dt.UTC)
    target = Target.from_url(endpoint + PATH)
    headers = _headers(settings.api_key)
    driver = DriverSettings(url=endpoint + PATH, requests=[target.request(b, headers) for b in bodies.bodies],
                            timeout_s=settings.timeout_s, honor_retry_after=settings.honor_retry_after)
    steps, breakdown = _steps(settings, driver, on_step)
    if health is not None:  # read again: a quantbench server reports the kernel path its forwards ran by now
        health = _health_after(endpoint, settings.api_key) or health
    sat = step_saturation(steps)
    machine = detect()
    info = health.get("info") if health and isinstance(health.get("info"), dict) else {}
    record = LoadRunRecord(
        created_at=created, finished_at=dt.datetime.now(dt.UTC), endpoint=endpoint, mode=settings.mode,
        requests_from=bodies.source, suite_hash=bodies.suite_hash, n_distinct_requests=len(bodies.bodies),
        server_model=(health or {}).get("model") or info.get("model_id"),
        server_variant=(health or {}).get("variant") or info.get("variant"),
        server_kernel_path=(health or {}).get("kernel_path") or info.get("kernel_path"),
        server_gpu=(health or {}).get("gpu"), server_health=health, saturation=sat.point,
        peak_decisions_per_s=sat.peak, host=machine.host, cpu_model=machine.cpu_model, os=machine.os,
        python_version=machine.python_version, quantbench_version=quantbench.__version__,
        quantbench_git_rev=provenance()["quantbench_git_rev"], settings=settings.stored(),
    )
    return LoadResult(record, steps, sat, breakdown)


def _health_after(endpoint: str, api_key: str | None) -> dict[str, Any] | None:
    """/healthz after the steps, or None when it does not answer 200 with JSON now."""
    try:
        r = httpx.get(endpoint + "/healthz", headers=_headers(api_key), timeout=10.0)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _steps(settings: LoadSettings, driver: DriverSettings, on_step: Any) -> tuple[list[LoadStepRecord],
                                                                                 list[dict[str, float]]]:
    drivers = Drivers(driver, settings.processes) if settings.processes > 1 else Driver(driver)
    try:
        if settings.warmup:  # untimed: connections, and the server's first-call costs
            drivers.warm(settings.warmup, settings.seconds)
        steps, breakdown = [], []
        offset = 0
        for i, load in enumerate(settings.rate or settings.concurrency):
            rate = float(load) if settings.rate else None
            plan = StepPlan(concurrency=None if rate else int(load), rate=rate, count=settings.requests,
                            seconds=settings.seconds, offset=offset, seed=settings.seed + i)
            run = drivers.step(plan)
            wall = max(run.end - run.start, 1e-9)
            step = summarize(i, run.samples, wall, concurrency=plan.concurrency, rate=rate,
                             cpu_s=max(run.cpu_s, default=0.0))
            offset += len(run.samples)
            steps.append(step)
            breakdown.append(timing_breakdown(run.samples))
            if on_step is not None:
                on_step(step)
        return steps, breakdown
    finally:
        drivers.close()
