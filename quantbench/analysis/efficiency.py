"""Energy and cost per decision of a stored run: what the report, `quantbench compare` and the dashboard show
beside latency, computed here once.

Energy comes from the run's columns (quantbench.run.energy: NVML's total-energy counter over the whole timed
phase, divided by its decisions); a run without them (a CPU run, a remote server, a phase too short) has none,
and the reason the child recorded in `extra.energy` is kept. Cost turns time into money at a price per GPU hour:
at batch 1 from the mean model time per decision (the GPU busy back to back on this run's decisions; tokenization
and the harness's gaps left out), in a batched run from its decisions per second over full batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantbench.errors import ConfigError
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun

PRICE_FLAG = "--price-per-gpu-hour"
NO_GPU_COST = "a CPU run: a price per GPU hour prices GPU runs only"


def check_price(price: float | None) -> float | None:
    """A price per GPU hour in USD: positive and finite, or None (no cost shown)."""
    if price is None:
        return None
    if not (isinstance(price, int | float) and math.isfinite(price) and price > 0):
        raise ConfigError(f"{PRICE_FLAG} {price}: give the GPU's price per hour in USD, a positive number "
                          f"(e.g. {PRICE_FLAG} 3.50)")
    return float(price)


@dataclass(frozen=True)
class Efficiency:
    """One run's energy and cost per decision; None where not measured (the views print n/a)."""

    run_id: str
    gpu: bool
    batch: int
    seconds_per_decision: float | None  # the time basis of the cost (see time_basis)
    time_basis: str
    j_per_decision: float | None
    mean_w: float | None
    idle_w: float | None
    phase_s: float | None
    decisions: int | None
    energy_note: str | None  # why there is no energy figure (the run's extra.energy), or None
    price_per_gpu_hour: float | None
    cost_per_million: float | None  # USD per 1M decisions at price_per_gpu_hour

    @property
    def j_above_idle(self) -> float | None:
        """Joules per decision above what the GPU draws idle over the same time (model loaded)."""
        if self.j_per_decision is None or self.idle_w is None or not self.phase_s or not self.decisions:
            return None
        return self.j_per_decision - self.idle_w * self.phase_s / self.decisions

    def as_dict(self) -> dict[str, Any]:
        return {"j_per_decision": self.j_per_decision, "j_above_idle_per_decision": self.j_above_idle,
                "mean_w": self.mean_w, "idle_w": self.idle_w, "energy_phase_s": self.phase_s,
                "energy_decisions": self.decisions, "energy_note": self.energy_note, "batch": self.batch,
                "seconds_per_decision": self.seconds_per_decision, "time_basis": self.time_basis,
                "price_per_gpu_hour": self.price_per_gpu_hour, "cost_per_million_decisions": self.cost_per_million}


def of_run(run: StoredRun, price_per_gpu_hour: float | None = None) -> Efficiency:
    """Energy and cost of a stored run (its energy columns, mean_ms, batch, decisions_per_s)."""
    price = check_price(price_per_gpu_hour)
    gpu = not run.is_cpu
    batch = run.forward_batch
    if batch > 1:
        dps = run.decisions_per_s
        seconds = 1 / dps if dps else None
        basis = f"throughput at batch {batch} (decisions per second over full batches)"
    else:
        seconds = run.mean_ms / 1e3 if run.mean_ms is not None else None
        basis = "mean model time per decision at batch 1"
    j = run.energy_j_per_decision
    note = None
    if j is None:
        note = run.energy_note or (
            "not measured: the run failed" if run.status == "failed"
            else "not measured: a CPU run (NVML measures GPUs)" if not gpu
            else "not measured (a run made before quantbench measured energy)")
    cost = None
    if price is not None and gpu and seconds is not None:
        cost = price / 3600 * seconds * 1e6
    return Efficiency(
        run_id=run.run_id, gpu=gpu, batch=batch, seconds_per_decision=seconds, time_basis=basis,
        j_per_decision=j, mean_w=run.energy_mean_w, idle_w=run.energy_idle_w, phase_s=run.energy_phase_s,
        decisions=run.energy_decisions, energy_note=note, price_per_gpu_hour=price, cost_per_million=cost)


def of_stored(store: Store, run_id: str, price_per_gpu_hour: float | None = None) -> Efficiency:
    """`of_run` for a stored run, by its whole id (`quantbench compare`)."""
    found = queries.stored_runs_by_id(store, [run_id])
    if not found:
        raise ConfigError(f"run {run_id}: not in {store.path}")
    return of_run(found[0], price_per_gpu_hour)


# -- text, shared by the report's cells and compare's table -------------------------------------------------
def fmt_joules(j: float | None) -> str:
    if j is None:
        return "n/a"
    return f"{j:,.0f} J" if abs(j) >= 100 else f"{j:.1f} J" if abs(j) >= 1 else f"{j:.3g} J"


def fmt_watts(w: float | None) -> str:
    return "n/a" if w is None else f"{w:,.0f} W"


def fmt_usd(usd: float | None) -> str:
    if usd is None:
        return "n/a"
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.3g}"


def energy_text(e: Efficiency) -> str:
    """`13.4 J (9.8 above idle)`, or n/a."""
    if e.j_per_decision is None:
        return "n/a"
    above = e.j_above_idle
    return fmt_joules(e.j_per_decision) + ("" if above is None else f" ({fmt_joules(above).removesuffix(' J')} above idle)")


def cost_text(e: Efficiency) -> str:
    return fmt_usd(e.cost_per_million)


def energy_note(price_per_gpu_hour: float | None, cpu: bool) -> list[str]:
    """The notes under a table that shows energy (and cost, given a price)."""
    notes = []
    if cpu:
        notes.append("Energy per decision is n/a on a CPU: it is measured from a GPU's energy counter (NVML).")
    else:
        notes.append("Energy per decision is the GPU's energy (NVML's total-energy counter, read after a synchronize "
                     "at the start and end of the whole timed phase, never per decision) divided by the decisions "
                     "in it; above idle subtracts the idle power measured with the same counter over a second "
                     "before the phase, model loaded. n/a: not measured (the run's extra.energy says why).")
    if price_per_gpu_hour is not None:
        notes.append(f"Cost per 1M decisions at ${price_per_gpu_hour:g} per GPU hour: from the mean model time per "
                     "decision at batch 1 (the GPU busy back to back, tokenization left out); in the throughput "
                     "table, from its decisions per second." + (" n/a on a CPU." if cpu else ""))
    return notes
