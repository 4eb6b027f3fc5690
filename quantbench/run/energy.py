"""GPU energy of a run's timed phase, from NVML's total-energy counter, read once at each end of the phase.

`nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver loaded, Volta and newer) updates every ~20-100
ms: a 10-20 ms decision is below its resolution, so the counter is read at the start and the end of the whole
timed phase (every decision whose latency is stored: the suite and the latency repeats), after a synchronize, and
the difference divided by the decisions, as ML.ENERGY (Zeus) measures at steady state. Never per decision.

Idle power is the same counter over `IDLE_WINDOW_S` of an idle GPU with the model loaded, just before the phase:
the same sensor and arithmetic as the phase, so "above idle" subtracts like from like. `nvmlDeviceGetPowerUsage`
was not used: on Ampere and newer it is a moving average over about a second, so read right after the warm-up
decisions it still holds them, and its averaging differs between GPU generations.

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
                 idle_window_s: float = IDLE_WINDOW_S):
        self.read_mj, self.synchronize, self.clock, self.sleep = read_mj, synchronize, clock, sleep
        self.min_phase_s, self.idle_window_s = min_phase_s, idle_window_s
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

    def stop(self, decisions: int, forward_s: float | None = None) -> EnergyFigures:
        """Close the phase of `decisions` decisions, `forward_s` of it timed forward passes; fills the figures, or
        leaves them None and says why. The rest of the phase (tokenizing, a CUDA graph captured for a new shape,
        bookkeeping) is in the energy too, at whatever the GPU draws then: `forward_share` says how much that was."""
        if self.read_mj is None or self._start is None:
            return self.figures
        t1, e1 = self._read()
        t0, e0 = self._start
        seconds, joules = t1 - t0, (e1 - e0) / 1e3
        self.figures.energy_phase_s, self.figures.energy_decisions = seconds, decisions
        if forward_s is not None and seconds > 0:
            self.forward_share = forward_s / seconds
        if decisions <= 0:
            self.note = "not measured: no decision was timed"
        elif seconds < self.min_phase_s:
            self.note = (f"not measured: the timed phase took {seconds:.2f} s, under the {self.min_phase_s:g} s the "
                         f"energy counter needs (it updates every ~20-100 ms); raise --latency-min-seconds")
        elif joules <= 0:
            self.note = (f"not measured: NVML's energy counter did not advance over the {seconds:.2f} s phase "
                         f"({e0} -> {e1} mJ)")
        else:
            self.figures.energy_j_per_decision = joules / decisions
            self.figures.energy_mean_w = joules / seconds
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
                             f"(suite + latency repeats); idle over {self.idle_window_s:g} s before it")
            out["joules"] = round(self.figures.energy_j_per_decision * (self.figures.energy_decisions or 0), 3)
        if self.forward_share is not None:
            out["forward_share"] = round(self.forward_share, 4)  # of the phase's wall time: timed forward passes
        return out
