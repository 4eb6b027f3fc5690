"""The saturation point of a load run: the concurrency (or arrival rate) past which throughput stops rising, and
what is kept of the peak beyond it; and where the server refused requests (503 or 429: saturated, or shedding load
on purpose). Pure functions of the steps' (load, decisions/s, refused, sent), so the load generator, the report and
the dashboard compute it the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from quantbench.store.load import LoadStepRecord

# A step within this fraction of the peak throughput counts as having reached it: run-to-run noise of a few
# percent must not move the saturation point to a later step.
PEAK_TOLERANCE = 0.05
# The statuses of a request the server refused under load (quantbench's server sheds with 503 + Retry-After when
# its queue is full or a request waited too long; 429 is another server's way of saying the same).
REFUSING = ("503", "429")


@dataclass(frozen=True)
class Refusal:
    """A step at which the server refused requests: `refused` of its `sent` answered 503 or 429."""

    load: float
    refused: int
    sent: int
    statuses: str  # "536 × 503"


@dataclass(frozen=True)
class Saturation:
    """`point`: the smallest load whose throughput is within PEAK_TOLERANCE of the peak, when a larger load was
    measured after it (None: throughput still rose at the last step, or there was one step only: `steps`).
    `peak`: the highest decisions/s. `kept`: the last step's throughput over the peak (the target of issue #26
    is >= 0.9 at 4x the saturating concurrency). `largest`: the largest load measured. `refusals`: the steps at
    which the server refused requests, by load (empty when not known: `saturation` was not given them)."""

    point: float | None
    peak: float
    kept: float | None
    beyond: float | None  # the largest load measured past `point` (None: none)
    steps: int = 0  # distinct loads measured
    largest: float | None = None
    refusals: tuple[Refusal, ...] = ()

    @property
    def refusing(self) -> Refusal | None:
        """The smallest load at which the server refused requests, or None."""
        return self.refusals[0] if self.refusals else None


def saturation(loads: Sequence[float], throughput: Sequence[float], tolerance: float = PEAK_TOLERANCE, *,
               errors: Sequence[Mapping[str, int]] | None = None, sent: Sequence[int] | None = None) -> Saturation:
    """The saturation of a sweep of (load, decisions/s), in any order; with each step's `errors` by status and
    `sent` requests, also where the server refused requests."""
    if len(loads) != len(throughput):
        raise ValueError("loads and throughput differ in length")
    refusals = _refusals(loads, errors, sent)
    if not loads:
        return Saturation(point=None, peak=0.0, kept=None, beyond=None)
    pairs = sorted(zip(loads, throughput, strict=True))
    peak = max(t for _, t in pairs)
    first = next(x for x, t in pairs if t >= (1.0 - tolerance) * peak)
    last_x, last_t = pairs[-1]
    known = Saturation(point=None, peak=peak, kept=None, beyond=None, steps=len(set(loads)), largest=last_x,
                       refusals=refusals)
    if first == last_x:
        return known
    return replace(known, point=first, kept=last_t / peak if peak else None, beyond=last_x)


def _refusals(loads: Sequence[float], errors: Sequence[Mapping[str, int]] | None,
              sent: Sequence[int] | None) -> tuple[Refusal, ...]:
    if errors is None:
        return ()
    if len(errors) != len(loads) or (sent is not None and len(sent) != len(loads)):
        raise ValueError("loads, errors and sent differ in length")
    out = []
    for i, (load, by_status) in enumerate(zip(loads, errors, strict=True)):
        refused = {s: int(n) for s, n in by_status.items() if s in REFUSING and n}
        if refused:
            statuses = ", ".join(f"{n} × {s}" for s, n in sorted(refused.items()))
            out.append(Refusal(load=load, refused=sum(refused.values()), sent=int(sent[i]) if sent is not None else 0,
                               statuses=statuses))
    return tuple(sorted(out, key=lambda r: r.load))


def step_saturation(steps: Sequence[LoadStepRecord], tolerance: float = PEAK_TOLERANCE) -> Saturation:
    """`saturation` of a load run's steps (each's load: its arrival rate, or else its clients), refusals included."""
    loads = [float(s.rate if s.rate is not None else s.concurrency or 0) for s in steps]
    return saturation(loads, [s.decisions_per_s for s in steps], tolerance, errors=[s.errors for s in steps],
                      sent=[s.sent for s in steps])


def load_text(load: float, mode: str) -> str:
    """`32 clients`, `1 client`, or `50 requests/s offered` (open loop)."""
    if mode == "open":
        return f"{load:g} requests/s offered"
    return f"{load:g} client{'' if load == 1 else 's'}"


def refusals_text(sat: Saturation, mode: str) -> str | None:
    """`the server refused 536 of 600 requests at 128 clients (536 × 503)`, each refusing step in order of load;
    None when it refused none."""
    if not sat.refusals:
        return None

    def part(r: Refusal, noun: str = "") -> str:
        count = f"{r.refused} of {r.sent}" if r.sent else str(r.refused)
        return f"{count}{noun} at {load_text(r.load, mode)} ({r.statuses})"

    first, *rest = sat.refusals
    return "the server refused " + part(first, " requests") + "".join(" and " + part(r) for r in rest)


def more_steps(sat: Saturation, mode: str, smaller: bool = True, larger: bool = True) -> str:
    """A sweep around the one step measured, as the flag that asks for it: smaller loads, a larger one, or both."""
    x = sat.largest or 1.0
    if mode == "open":
        rates = {x} | ({x / 16, x / 4} if smaller else set()) | ({x * 4} if larger else set())
        return "--rate " + ",".join(f"{r:.3g}" for r in sorted(rates))
    n = max(1, int(x))
    clients = {n} | ({1, max(1, n // 16), max(1, n // 4)} if smaller else set()) | ({n * 4} if larger else set())
    return "--concurrency " + ",".join(str(c) for c in sorted(clients))


REFUSING_LOAD = "it was refusing load there (saturated, or shedding load)"


def saturation_sentence(sat: Saturation, mode: str) -> str:
    """One sentence: where throughput stopped rising and what was kept beyond it, where the server refused
    requests, or why one step (or a sweep still rising) cannot say."""
    refused = refusals_text(sat, mode)
    tail = f"; {refused}: {REFUSING_LOAD}" if refused else ""
    if sat.steps == 0 or sat.largest is None:
        return "no steps were measured, so there is no saturation point"
    largest = load_text(sat.largest, mode)
    if sat.steps == 1:
        smaller = mode == "open" or sat.largest > 1  # nothing is smaller than one client
        larger = not refused or not smaller  # past a step that refused requests, a larger one adds refusals
        add = "add " + " and ".join(w for w, on in (("smaller", smaller), ("larger", larger)) if on) + " steps"
        return (f"one step only ({largest}, {sat.peak:,.1f} decisions/s): one step cannot show where throughput "
                f"stops rising{tail}; {add}, e.g. {more_steps(sat, mode, smaller, larger)}")
    if sat.point is None:
        if refused:
            return (f"peak {sat.peak:,.1f} decisions/s at the last step ({largest}), where throughput still rose"
                    f"{tail}")
        return (f"peak {sat.peak:,.1f} decisions/s at the last step ({largest}): throughput still rose, so "
                "saturation was not reached; add a larger step")
    return (f"saturation at {load_text(sat.point, mode)} (peak {sat.peak:,.1f} decisions/s); at "
            f"{load_text(sat.beyond or sat.largest, mode)} throughput kept {sat.kept or 0:.0%} of the peak{tail}")


def saturation_cell(sat: Saturation, mode: str) -> str:
    """Where a run saturated, in a few words for a table cell: `32 clients`, or why there is no such load."""
    if sat.steps == 0:
        return "no steps"
    if sat.point is not None:
        return load_text(sat.point, mode)
    refusing = f"; refusing load at {load_text(sat.refusing.load, mode)}" if sat.refusing else ""
    if sat.steps == 1:
        return f"one step: cannot tell{refusing}"
    return f"not reached (throughput still rose){refusing}"
