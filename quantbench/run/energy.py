"""GPU energy of a run's timed phase, from NVML's total-energy counter, read once at each end of the phase.

`nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver loaded, Volta and newer) updates every ~20-100
ms: a 10-20 ms decision is below its resolution, so the counter is read at the start and the end of the whole
timed phase (every decision whose latency is stored: the suite and the latency repeats), after a synchronize, and
the difference divided by the decisions, as ML.ENERGY (Zeus) measures at steady state. Never per decision.

Idle power is the same counter over `IDLE_WINDOW_S` of an idle GPU with the model loaded, just before the phase:
the same sensor and arithmetic as the phase, so "above idle" subtracts like from like. `nvmlDeviceGetPowerUsage`
was not used: on Ampere and newer it is a moving average over about a second, so read right after the warm-up
decisions it still holds them, and its averaging differs between GPU generations.

Energy only counts once the GPU's power has settled: during the phase the counter is also read every
`SAMPLE_S` between decisions (after the synchronize each decision's timing does anyway), the samples are cut into
segments of at least `SEGMENT_S`, and the window is the longest run of segments to the phase's end whose power
has no trend: the least-squares line through the segments' powers changes by at most `SETTLE_TOL` of their mean
across the window (judged on at least `MIN_SEGMENTS` segments, the window at least two; a ramp drifts, the
counter's update noise does not). The energy per decision is that
window's joules over its decisions; the warm-up before the phase (`--warmup` decisions) and any unsettled start
(clocks ramping, the first decisions' caches) are left out. While the settled window is shorter than
`MIN_PHASE_S`, the child keeps timing decisions, up to `MAX_PHASE_S` of phase; a power that never settles stores
NULL and says so. `extra.energy.window` records the window's start, length, decisions and the segments' powers.

A figure that cannot be trusted is not stored: no counter (a CPU run, an older GPU, a remote server), a phase
shorter than `MIN_PHASE_S`, or a counter that did not advance leave the columns NULL and `note` says why (the
child puts it in the run's `extra.energy`). The NVML calls are injected (`read_mj`), so the rules are tested with
a fake counter on a machine without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COUNTER = "nvmlDeviceGetTotalEnergyConsumption"
# The counter's value is up to one update (≤ ~100 ms) stale at each end of the phase: over 2 s that is at most ~5%
# of the phase's energy. The default latency phase (`--latency-min-seconds 2`) makes every timed phase at least
# this long; a shorter one stores NULL rather than a figure that could be off by more.
MIN_PHASE_S = 2.0
# Idle power: one second of the counter with nothing queued, long enough for 10-50 counter updates.
IDLE_WINDOW_S = 1.0
# The settled window: samples at least SAMPLE_S apart, segments of at least SEGMENT_S (10-50 counter updates, so
# one stale read moves a segment's power by at most ~10%), a trend across the window of at most SETTLE_TOL of its
# mean power; the phase is extended up to MAX_PHASE_S for a settled window of MIN_PHASE_S.
SAMPLE_S = 0.1
SEGMENT_S = 1.0
SETTLE_TOL = 0.10
MIN_SEGMENTS = 3
MAX_PHASE_S = 30.0


@dataclass(frozen=True)
class Window:
    """The settled part of the phase: from `start_s` after the phase began, `seconds` long, `decisions` in it."""

    start_s: float
    seconds: float
    joules: float
    decisions: int
    segments_w: tuple[float, ...]  # every segment's power, the settled ones last
    settled_from: int  # index of the first settled segment
    reference_w: float  # the window's mean segment power


def _drift(times: list[float], powers: list[float]) -> float:
    """How much the least-squares line through (time, power) changes across the segments, over their mean power:
    a steady ramp drifts, a flat power with counter noise does not."""
    n = len(powers)
    mean_t, mean_p = sum(times) / n, sum(powers) / n
    var = sum((t - mean_t) ** 2 for t in times)
    if mean_p <= 0 or var <= 0:
        return float("inf")
    slope = sum((t - mean_t) * (p - mean_p) for t, p in zip(times, powers, strict=True)) / var
    return abs(slope) * (times[-1] - times[0]) / mean_p


def settled_window(samples: list[tuple[float, int, int]], tol: float = SETTLE_TOL,
                   segment_s: float = SEGMENT_S) -> Window | None:
    """The settled window of `samples` [(time s, counter mJ, decisions so far)]: the longest run of at least two
    segments, to the phase's end, whose power's least-squares trend drifts by at most `tol` of its mean across it;
    None with fewer than MIN_SEGMENTS segments or no such run."""
    if len(samples) < 2:
        return None
    bounds = [0]
    for i in range(1, len(samples)):
        if samples[i][0] - samples[bounds[-1]][0] >= segment_s:
            bounds.append(i)
    if bounds[-1] != len(samples) - 1:  # a last piece shorter than a segment joins the one before it
        if len(bounds) > 1:
            bounds[-1] = len(samples) - 1
        else:
            bounds.append(len(samples) - 1)
    powers = [(samples[b][1] - samples[a][1]) / 1e3 / max(samples[b][0] - samples[a][0], 1e-9)
              for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    mids = [(samples[a][0] + samples[b][0]) / 2 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if len(powers) < MIN_SEGMENTS:
        return None  # too few segments to tell a settled power from a ramp
    k = next((k for k in range(len(powers) - 1) if _drift(mids[k:], powers[k:]) <= tol), None)
    if k is None:
        return None
    ref = sum(powers[k:]) / len(powers[k:])
    first, last = samples[bounds[k]], samples[-1]
    return Window(first[0] - samples[0][0], last[0] - first[0], (last[1] - first[1]) / 1e3, last[2] - first[2],
                  tuple(round(p, 2) for p in powers), k, ref)  # ref: the window's mean segment power


@dataclass
class EnergyFigures:
    """The run columns (NULL = None where not measured, never 0)."""

    energy_j_per_decision: float | None = None  # joules over the timed phase / decisions in it
    energy_mean_w: float | None = None  # joules over the timed phase / its seconds
    energy_phase_s: float | None = None  # wall seconds between the two counter reads
    energy_decisions: int | None = None  # decisions (not forward passes) in the phase
    energy_idle_w: float | None = None  # the counter over IDLE_WINDOW_S before the phase, model loaded


def nvml_counter(nvml_index: int | None) -> tuple[Callable[[], int] | None, str | None]:
    """(a function returning the counter in mJ, None) for the GPU NVML numbers `nvml_index`, or (None, why not)."""
    if nvml_index is None:
        return None, "no GPU that NVML can see"
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # probe: NOT_SUPPORTED before Volta, on some vGPUs
    except Exception as e:  # noqa: BLE001 - any NVML failure means: no counter here, say which
        return None, f"NVML has no total-energy counter for this GPU ({COUNTER}: {e})"
    return lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)), None


class EnergyMeter:
    """`idle()` (optional), `start()`, the phase, `stop(decisions)`; then `figures` and `note`.

    `read_mj` reads the counter (None: there is none, `missing` says why); `synchronize` waits for the device's
    queued work, so the reads bracket exactly the work of the phase; `clock` and `sleep` are the wall clock."""

    def __init__(self, read_mj: Callable[[], int] | None, missing: str | None = None,
                 synchronize: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep, min_phase_s: float = MIN_PHASE_S,
                 idle_window_s: float = IDLE_WINDOW_S, max_phase_s: float = MAX_PHASE_S):
        self.read_mj, self.synchronize, self.clock, self.sleep = read_mj, synchronize, clock, sleep
        self.min_phase_s, self.idle_window_s, self.max_phase_s = min_phase_s, idle_window_s, max_phase_s
        self.samples: list[tuple[float, int, int]] = []  # (time, counter mJ, decisions so far) over the phase
        self.window: Window | None = None
        self.phase_s: float | None = None
        self.figures = EnergyFigures()
        self.note: str | None = None if read_mj is not None else f"not measured: {missing or 'no energy counter'}"
        self.idle_note: str | None = None
        self._start: tuple[float, int] | None = None
        self.forward_share: float | None = None

    @classmethod
    def for_run(cls, device: str, nvml_index: int | None, local: bool,
                synchronize: Callable[[], None]) -> EnergyMeter:
        """The meter of one run: a counter only for a model on this machine's GPU."""
        if not str(device).startswith("cuda"):
            return cls(None, "a CPU run (NVML measures GPUs)")
        if not local:
            return cls(None, "the decisions ran on a remote server, not on this machine's GPU")
        read, missing = nvml_counter(nvml_index)
        return cls(read, missing, synchronize)

    def _read(self) -> tuple[float, int]:
        self.synchronize()
        return self.clock(), int(self.read_mj())  # type: ignore[misc]

    def idle(self) -> None:
        """Idle power over `idle_window_s`, nothing queued (the model loaded)."""
        if self.read_mj is None:
            return
        t0, e0 = self._read()
        self.sleep(self.idle_window_s)
        t1, e1 = self._read()
        if e1 <= e0:
            self.idle_note = f"idle power not measured: the counter did not advance over {t1 - t0:.2f} s idle"
            return
        self.figures.energy_idle_w = (e1 - e0) / 1e3 / (t1 - t0)

    def start(self) -> None:
        if self.read_mj is not None:
            self._start = self._read()
            self.samples = [(*self._start, 0)]

    def mark(self, decisions: int) -> None:
        """A sample between decisions, at most every SAMPLE_S (`decisions`: timed so far in the phase)."""
        if self.read_mj is None or self._start is None or self.clock() - self.samples[-1][0] < SAMPLE_S:
            return
        self.samples.append((*self._read(), decisions))

    def needs_more(self) -> bool:
        """The phase should go on: a counter is read, the settled window is still under `min_phase_s`, and the
        phase has not reached `max_phase_s`."""
        if self.read_mj is None or self._start is None or not self.samples:
            return False
        if self.samples[-1][0] - self.samples[0][0] >= self.max_phase_s:
            return False
        w = settled_window(self.samples)
        return w is None or w.seconds < self.min_phase_s

    def stop(self, decisions: int, forward_s: float | None = None) -> EnergyFigures:
        """Close the phase of `decisions` decisions, `forward_s` of it timed forward passes; fills the figures, or
        leaves them None and says why. The rest of the phase (tokenizing, a CUDA graph captured for a new shape,
        bookkeeping) is in the energy too, at whatever the GPU draws then: `forward_share` says how much that was."""
        if self.read_mj is None or self._start is None:
            return self.figures
        t1, e1 = self._read()
        t0, e0 = self._start
        self.samples.append((t1, e1, decisions))
        self.phase_s = t1 - t0
        if forward_s is not None and self.phase_s > 0:
            self.forward_share = forward_s / self.phase_s
        if decisions <= 0:
            self.note = "not measured: no decision was timed"
            return self.figures
        if e1 <= e0:
            self.figures.energy_phase_s, self.figures.energy_decisions = self.phase_s, decisions
            self.note = (f"not measured: NVML's energy counter did not advance over the {self.phase_s:.2f} s phase "
                         f"({e0} -> {e1} mJ)")
            return self.figures
        self.window = settled_window(self.samples)
        w = self.window
        if w is None:
            self.figures.energy_phase_s, self.figures.energy_decisions = self.phase_s, decisions
            self.note = (f"not measured: the GPU's power did not settle over the {self.phase_s:.2f} s phase (no "
                         f"run of {SEGMENT_S:g} s segments to its end whose power drifts by at most {SETTLE_TOL:.0%})")
            return self.figures
        self.figures.energy_phase_s, self.figures.energy_decisions = w.seconds, w.decisions
        if w.seconds < self.min_phase_s:
            self.note = (f"not measured: the power settled for {w.seconds:.2f} s of the {self.phase_s:.2f} s timed "
                         f"phase, under the {self.min_phase_s:g} s the energy counter needs (it updates every "
                         "~20-100 ms); raise --latency-min-seconds")
        elif w.decisions <= 0:
            self.note = "not measured: no decision was timed in the settled window"
        else:
            self.figures.energy_j_per_decision = w.joules / w.decisions
            self.figures.energy_mean_w = w.joules / w.seconds
        return self.figures

    def extra(self) -> dict[str, Any]:
        """What the run's `extra.energy` says: how it was measured, or why it was not."""
        out: dict[str, Any] = {}
        if self.note:
            out["note"] = self.note
        if self.idle_note:
            out["idle_note"] = self.idle_note
        if self.figures.energy_j_per_decision is not None:
            out["method"] = (f"{COUNTER} read after a synchronize at the start and end of the timed phase "
                             f"(suite + latency repeats) and every {SAMPLE_S:g} s between decisions; energy over the "
                             f"settled window only (the longest run of {SEGMENT_S:g} s segments to the phase's end "
                             f"whose power's trend drifts by at most {SETTLE_TOL:.0%}); idle over "
                             f"{self.idle_window_s:g} s before the phase")
            out["joules"] = round(self.figures.energy_j_per_decision * (self.figures.energy_decisions or 0), 3)
        if self.window is not None:
            w = self.window
            out["window"] = {"start_s": round(w.start_s, 3), "seconds": round(w.seconds, 3), "decisions": w.decisions,
                             "settled_from_segment": w.settled_from, "mean_segment_w": round(w.reference_w, 2),
                             "segments_w": list(w.segments_w), "phase_s": round(self.phase_s or 0.0, 3)}
        if self.forward_share is not None:
            out["forward_share"] = round(self.forward_share, 4)  # of the phase's wall time: timed forward passes
        return out
