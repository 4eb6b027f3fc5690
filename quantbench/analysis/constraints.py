"""Which quant meets my constraints on this GPU? One pick per GPU (and model, suite) with the evidence behind it, or
which constraint no variant meets. `quantbench recommend` and the dashboard's Constraints page both call `answer`.

Constraints (each optional but the quality rule):
  - latency: the chosen percentile (p50, p90, p99) per decision at `concurrency` clients must be ≤ `max_latency_ms`.
    The evidence, in this order: a closed-loop load run (`quantbench load`) of that variant on that GPU at exactly
    that concurrency, else at the nearest higher one (an upper estimate), end to end on the client; a step where
    the server refused requests (503) does not meet it. Without one, a batched run (`run --concurrency N`) with at
    least N decisions per forward pass: the mean model time of a pass (a lower bound: no server, no queue). Without
    that, the batch-1 model time per decision (the report's figure; at N > 1 clients a lower bound only). Each
    answer says which it used.
  - memory: peak VRAM (NVML's per-process peak; host RSS on a CPU) ≤ `max_vram_gib`.
  - energy: GPU energy per decision (NVML's counter over the timed phase) ≤ `max_energy_j`; at N > 1 clients from
    a batched run at ≥ N where there is one. Not measured (a CPU, a remote server) does not meet it.
  - quality: agreement with BF16 ≥ `min_agreement`, and no modality `worse` than the noise floor beyond `margin`
    (the verdict of quantbench.analysis.parity with Margins(agreement=margin); the same rule as the report).
Among the variants that meet every constraint, a native one is preferred (as the report does), then the
`objective`: the smallest weights in memory, the lowest latency, or the least energy. A table of batched runs alone
(GpuReport.batched_only) has no candidate: its answer says why, and that it needs runs at batch 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from quantbench.analysis import efficiency, parity
from quantbench.analysis.margins import MARGIN_AGREEMENT, Margins
from quantbench.analysis.provenance import origin_text
from quantbench.analysis.recommend import (
    GIB,
    SYNTHETIC_NOTE,
    GpuReport,
    Row,
    Rules,
    build_report,
    float_or_none,
    implementation,
    quality_exclusions,
)
from quantbench.errors import ConfigError
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun

PERCENTILES = (50, 90, 99)
OBJECTIVES = {"memory": "the smallest weights in memory", "latency": "the lowest latency", "energy": "the least energy"}
LATENCY, MEMORY, ENERGY, QUALITY, STATUS = "latency", "memory", "energy", "quality", "status"


@dataclass(frozen=True)
class Constraints:
    max_latency_ms: float | None = None
    concurrency: int = 1
    percentile: int = 50
    max_vram_gib: float | None = None
    max_energy_j: float | None = None
    margin: float = MARGIN_AGREEMENT  # per modality: agreement a variant may lose beyond the noise floor's
    min_agreement: float = 0.95
    objective: str = "memory"
    prefer_native: bool = True

    def __post_init__(self) -> None:
        for flag, value in (("--max-latency-ms", self.max_latency_ms), ("--max-vram-gib", self.max_vram_gib),
                            ("--max-energy-j", self.max_energy_j)):
            if value is not None and not value > 0:
                raise ConfigError(f"{flag} {value:g}: give a positive number (or leave it out: no such constraint)")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency {self.concurrency}: give the number of clients, 1 or more")
        if self.percentile not in PERCENTILES:
            raise ConfigError(f"--percentile {self.percentile}: use one of {', '.join(map(str, PERCENTILES))}")
        if not 0 < self.margin < 1:
            raise ConfigError(f"--margin {self.margin:g}: give a fraction of the questions, e.g. 0.02 for 2 points")
        if not 0 <= self.min_agreement <= 1:
            raise ConfigError(f"--min-agreement {self.min_agreement:g}: give a fraction between 0 and 1 (e.g. 0.95)")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")

    def rules(self) -> Rules:
        return Rules(min_agreement=self.min_agreement, margins=Margins(agreement=self.margin),
                     prefer_native=self.prefer_native, objective="memory")

    @property
    def clients(self) -> str:
        return f"{self.concurrency} client{'s' * (self.concurrency != 1)}"

    def describe(self, cpu: bool = False) -> str:
        parts = []
        if self.max_latency_ms is not None:
            parts.append(f"p{self.percentile} ≤ {self.max_latency_ms:g} ms per decision at {self.clients}")
        if self.max_vram_gib is not None:
            parts.append(f"peak {'host RSS' if cpu else 'VRAM'} ≤ {self.max_vram_gib:g} GiB")
        if self.max_energy_j is not None:
            parts.append(f"≤ {self.max_energy_j:g} J per decision")
        parts.append(f"agreement with BF16 ≥ {self.min_agreement:.0%} and no modality worse than the noise floor by "
                     f"more than {100 * self.margin:g} points")
        return ", ".join(parts)


@dataclass
class Evidence:
    value: float | None
    text: str  # what the figure is and where it comes from
    basis: str | None = None  # latency: load | batched | batch-1; energy: batched | batch-1


@dataclass
class Candidate:
    row: Row
    latency: Evidence
    energy: Evidence
    quality: str
    failed: dict[str, str] = field(default_factory=dict)  # constraint -> why it is not met

    @property
    def passes(self) -> bool:
        return not self.failed

    @property
    def label(self) -> str:
        return self.row.label

    @property
    def peak_gib(self) -> float | None:
        return None if self.row.peak_bytes is None else self.row.peak_bytes / GIB

    def facts(self, c: Constraints, cpu: bool) -> str:
        mem = "host RSS" if cpu else "VRAM"
        peak = "peak memory not measured" if self.peak_gib is None else f"peak {mem} {self.peak_gib:.2f} GiB"
        return "; ".join([self.latency.text, peak, self.energy.text, self.quality, origin_text(self.row.run)])


@dataclass
class Answer:
    report: GpuReport
    constraints: Constraints
    candidates: list[Candidate]
    pick: Candidate | None
    verdict: str  # the pick and why, or plainly why nothing qualifies
    unmet: list[str] = field(default_factory=list)  # constraints no variant meets, each with the closest variant

    @property
    def synthetic(self) -> bool:
        """Random weights: speed and memory only, so no pick on quality can exist."""
        return self.report.synthetic or any(r.quality == SYNTHETIC_NOTE for r in self.report.rows)

    def as_dict(self) -> dict[str, Any]:
        r = self.report
        return parity.clean_json({
            "gpu": r.gpu, "model_id": r.model_id, "suite_id": r.suite_id, "suite_hash": r.suite_hash,
            "pick": self.pick.label if self.pick else None, "verdict": self.verdict, "unmet": self.unmet,
            "candidates": [{
                "variant": k.label, "run_id": k.row.run.run_id, "passes": k.passes, "failed": k.failed,
                "latency_ms": k.latency.value, "latency_basis": k.latency.basis, "latency_evidence": k.latency.text,
                "peak_gib": k.peak_gib, "energy_j_per_decision": k.energy.value, "energy_evidence": k.energy.text,
                "quality": k.quality, "source": k.row.run.source, "host": k.row.run.host,
                "created_at": str(k.row.run.created_at)} for k in self.candidates]})


def answer(store: Store, constraints: Constraints, *, gpu: str | None = None, host: str | None = None,
           model: str | None = None, since: str | None = None) -> list[Answer]:
    """One Answer per (GPU, model, suite) of the store's report (filtered as `report --gpu/--model/--since`)."""
    reports = build_report(store, gpu=gpu, model=model, host=host, since=since, rules=constraints.rules())
    steps = queries.closed_loop_steps(store)
    return [_answer_one(rep, constraints, steps) for rep in reports]


def _answer_one(rep: GpuReport, c: Constraints, steps: pd.DataFrame) -> Answer:
    if rep.batched_only:  # its throughput alone judges no quality: no candidate, and the reason
        return Answer(rep, c, [], None, f"nothing to pick from: {rep.no_table_note}")
    rules = c.rules()
    synthetic = any(r.quality == SYNTHETIC_NOTE for r in rep.rows)
    candidates = []
    for row in rep.rows:
        k = Candidate(row, latency_evidence(row, rep, steps, c), energy_evidence(row, rep, c), quality_text(row))
        if not row.ok:
            k.failed[STATUS] = f"failed here ({row.run.failure or 'error'})"
        else:
            if synthetic or rep.reference is None:
                k.failed[QUALITY] = ("synthetic (random) weights: no quality evidence" if synthetic else
                                     "no BF16 reference to judge quality against")
            elif why := quality_exclusions(row, rules):
                k.failed[QUALITY] = "; ".join(why)
            if c.max_latency_ms is not None:
                if k.latency.value is None:
                    k.failed[LATENCY] = "latency not measured"
                elif k.latency.basis == "refused":
                    k.failed[LATENCY] = k.latency.text
                elif k.latency.value > c.max_latency_ms:
                    k.failed[LATENCY] = f"{k.latency.value:,.1f} ms > {c.max_latency_ms:g} ms"
            if c.max_vram_gib is not None:
                if k.peak_gib is None:
                    k.failed[MEMORY] = "peak memory not measured"
                elif k.peak_gib > c.max_vram_gib:
                    k.failed[MEMORY] = f"peak {k.peak_gib:.2f} GiB > {c.max_vram_gib:g} GiB"
            if c.max_energy_j is not None:
                if k.energy.value is None:
                    k.failed[ENERGY] = k.energy.text  # not measured, and why
                elif k.energy.value > c.max_energy_j:
                    k.failed[ENERGY] = f"{k.energy.value:.2f} J > {c.max_energy_j:g} J per decision"
        candidates.append(k)
    passing = [k for k in candidates if k.passes]
    emulated: list[Candidate] = []
    if c.prefer_native and any(k.row.run.native != "emulated" for k in passing):
        emulated = [k for k in passing if k.row.run.native == "emulated"]
        passing = [k for k in passing if k not in emulated]
    pick = min(passing, key=lambda k: _objective_key(k, c), default=None)
    unmet = _unmet(candidates, c, rep.cpu)
    verdict = _verdict(rep, c, candidates, passing, pick, unmet)
    if pick is not None and emulated:
        verdict += (f" {', '.join(k.label for k in emulated)} meet{'s' * (len(emulated) == 1)} them too but "
                    f"{'is' if len(emulated) == 1 else 'are'} emulated here (a native variant is preferred).")
    return Answer(rep, c, candidates, pick, verdict, unmet)


def _objective_key(k: Candidate, c: Constraints) -> tuple[float, float]:
    inf = float("inf")
    weights = float(k.row.weights_bytes) if k.row.weights_bytes is not None else inf
    latency = k.latency.value if k.latency.value is not None else inf
    energy = k.energy.value if k.energy.value is not None else inf
    return {"memory": (weights, latency), "latency": (latency, weights), "energy": (energy, latency)}[c.objective]


# -- evidence ----------------------------------------------------------------------------------------------------
def _batched_runs(row: Row, rep: GpuReport, n: int) -> list[dict[str, Any]]:
    """The batched runs (rep.throughput) of `row`'s own variant, checkpoint and implementation at ≥ n decisions a
    pass. Matched by the runs, not by the label's first word: `bf16 (transformers grouped_mm)` took the quantbench
    engine's batched pass as its latency and energy."""
    def what_ran(run: StoredRun) -> tuple[Any, ...]:
        return run.backend, run.variant, run.weight_format, implementation(run.kernel_path)

    mine = what_ran(row.run)
    return [t for t in rep.throughput if t["batch"] >= n and what_ran(t["run"]) == mine]


def latency_evidence(row: Row, rep: GpuReport, steps: pd.DataFrame, c: Constraints) -> Evidence:
    """The latency of `row`'s variant at `c.concurrency` clients and where the figure comes from (module
    docstring: a load run, else a batched run, else the batch-1 model time)."""
    run, pct, n = row.run, c.percentile, c.concurrency
    load, note = _load_step(run, steps, n, pct)
    if load is not None:
        return load
    if n > 1:
        batched = _batched_runs(row, rep, n)
        if batched:
            t = min(batched, key=lambda t: t["batch"])
            return Evidence(float(t["ms_per_pass"]), f"{t['ms_per_pass']:,.1f} ms a pass of {t['batch']} decisions "
                            f"(batched run {t['run_id'][:13]}, mean model time: a lower bound at {c.clients}, no "
                            f"server or queue){note}", "batched")
    value = {50: run.p50_ms, 90: run.p90_ms, 99: run.p99_ms}.get(pct)
    if value is None:
        return Evidence(None, f"p{pct} not measured{note}")
    bound = "" if n == 1 else f"; at {c.clients} a lower bound only (no load run or batched run at ≥ {n})"
    return Evidence(value, f"p{pct} {value:,.1f} ms per decision (batch-1 model time of run "
                    f"{run.run_id[:13]}{bound}){note}", "batch-1")


def _load_step(run: StoredRun, steps: pd.DataFrame, n: int, pct: int) -> tuple[Evidence | None, str]:
    """The closed-loop load step that measured this variant (same model, GPU, suite and kernel implementation: a
    512-token suite's latency says nothing of a 2048-token one's) at n clients, or the nearest above, from the
    newest such load run. Returns (evidence or None, a note on load runs that exist but do not qualify)."""
    if steps.empty or not run.gpu_name:
        return None, ""
    models = {run.model_id, run.own_model_id} - {None}
    mine = steps[(steps["server_gpu"] == run.gpu_name) & (steps["server_variant"] == run.variant)
                 & steps["server_model"].isin(models)]
    if mine.empty:
        return None, ""
    impl = implementation(run.kernel_path)
    same = mine[(mine["suite_hash"] == run.suite_hash)
                & (mine["server_kernel_path"].map(implementation) == impl)]
    if same.empty:
        other = ", ".join(sorted(set(mine["requests_from"].astype(str))))
        return None, f"; a load run of this variant used other requests ({other}) or another kernel: not used"
    for lid in same["load_id"].unique():  # newest first
        at = same[(same["load_id"] == lid) & (same["concurrency"] >= n)].sort_values("concurrency")
        if at.empty:
            continue
        s = at.iloc[0]
        m = int(s["concurrency"])
        where = f"load run {lid[:13]} at {m} client{'s' * (m != 1)}"
        if m != n:
            where += f" (none at {n}: the next higher, an upper estimate)"
        refused = int(s["sent"]) - int(s["ok"])
        if refused:
            errors = json.loads(s["errors"]) if isinstance(s["errors"], str) else s["errors"]
            return Evidence(float_or_none(s[f"p{pct}_ms"]), f"{refused} of {int(s['sent'])} requests refused or "
                            f"failed ({errors}) in {where}", "refused"), ""
        value = float_or_none(s[f"p{pct}_ms"])
        if value is not None:
            return Evidence(value, f"p{pct} {value:,.1f} ms end to end ({where})", "load"), ""
    return None, f"; its load runs reach {int(same['concurrency'].max())} clients only"


def energy_evidence(row: Row, rep: GpuReport, c: Constraints) -> Evidence:
    """Energy per decision: from a batched run at ≥ concurrency where one measured it, else one decision at a time."""
    if c.concurrency > 1:
        batched = [t for t in _batched_runs(row, rep, c.concurrency) if t["efficiency"].j_per_decision is not None]
        if batched:
            t = min(batched, key=lambda t: t["batch"])
            j = t["efficiency"].j_per_decision
            return Evidence(j, f"{efficiency.fmt_joules(j)} per decision at {t['batch']} per pass", "batched")
    eff = row.efficiency or efficiency.of_run(row.run)
    if eff.j_per_decision is None:
        return Evidence(None, "energy not measured" + (" (a CPU run)" if row.cpu else ""))
    basis = "" if c.concurrency == 1 else " (one decision at a time)"
    return Evidence(eff.j_per_decision, f"{efficiency.fmt_joules(eff.j_per_decision)} per decision{basis}", "batch-1")


def quality_text(row: Row) -> str:
    if row.is_reference:
        return "the BF16 reference"
    comp = row.comparison
    if comp is None:
        return row.quality or "no parity figures"
    per = "; ".join(f"{m.modality} {m.verdict.label} ({m.agreement.n} questions)" for m in comp.modalities)
    return f"agrees with BF16 on {comp.agreement.rate:.1%}; " + (per or comp.verdict.label)


# -- the answer in words -----------------------------------------------------------------------------------------
def _unmet(candidates: list[Candidate], c: Constraints, cpu: bool) -> list[str]:
    """Each constraint that no successful variant meets on its own, with the variant that comes closest."""
    ok = [k for k in candidates if STATUS not in k.failed]
    out = []
    checks = [(QUALITY, "quality", None)]
    if c.max_latency_ms is not None:
        checks.append((LATENCY, f"p{c.percentile} ≤ {c.max_latency_ms:g} ms at {c.clients}", lambda k: k.latency.value))
    if c.max_vram_gib is not None:
        checks.append((MEMORY, f"peak {'host RSS' if cpu else 'VRAM'} ≤ {c.max_vram_gib:g} GiB", lambda k: k.peak_gib))
    if c.max_energy_j is not None:
        checks.append((ENERGY, f"≤ {c.max_energy_j:g} J per decision", lambda k: k.energy.value))
    for name, text, value in checks:
        if not ok or any(name not in k.failed for k in ok):
            continue
        measured = [k for k in ok if value is not None and value(k) is not None]
        if value is None or not measured:
            out.append(f"{text}: no variant ({ok[0].failed[name]})" if len({k.failed[name] for k in ok}) == 1
                       else f"{text}: no variant")
            continue
        best = min(measured, key=value)
        out.append(f"{text}: no variant; the closest, {best.label}: {best.failed[name]}")
    return out


def _verdict(rep: GpuReport, c: Constraints, candidates: list[Candidate], passing: list[Candidate],
             pick: Candidate | None, unmet: list[str]) -> str:
    if pick is not None:
        others = [k.label for k in passing if k is not pick]
        also = f"; {', '.join(others)} also meet{'s' * (len(others) == 1)} every constraint" if others else ""
        return (f"{pick.label}: {pick.facts(c, rep.cpu)}. Chosen as {OBJECTIVES[c.objective]} among the variants "
                f"that meet every constraint{also}.")
    if not any(STATUS not in k.failed for k in candidates):
        return "nothing qualifies: every variant failed here"
    if unmet:
        return "nothing qualifies: " + "; ".join(unmet) + "."
    why = "; ".join(f"{k.label} fails {', '.join(f'{n} ({w})' for n, w in k.failed.items())}"
                    for k in candidates if STATUS not in k.failed)
    return f"nothing qualifies: each constraint is met by some variant, but none meets them all at once: {why}."
