"""The "Which quant should I use?" report: one table per GPU (and model, suite), built from the store.

Rows are the latest run of each variant (backend, variant, kernel, format) on that GPU — a failed run only when
the variant never succeeded there, so an out-of-memory shows up as what it is. Quality columns compare each row
with the BF16 reference (see quantbench.analysis.parity); runs with synthetic weights show speed and memory only.

"Best for" follows `Rules`, applied in this order, and the report prints which rule picked the recommendation:
  1. quality: agreement with BF16 ≥ `min_agreement`, and (with `use_noise_floor`) not `worse` than the noise
     floor; the BF16 reference passes by definition; a row without parity figures cannot pass;
  2. memory: peak memory (peak VRAM; peak host RSS on a CPU) ≤ `vram_budget_gib`, when a budget is set;
  3. native: with `prefer_native`, a variant that is emulated on this GPU is dropped when a native one passes;
  4. objective: the smallest weights in memory (`objective="memory"`) or the lowest p50 latency ("latency"),
     the other figure breaking ties.
"""

from __future__ import annotations

import io
import json
import math
import socket
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from quantbench.analysis import parity
from quantbench.analysis import stats as an
from quantbench.analysis.parity import Comparison, FloorStats
from quantbench.analysis.stats import ParityError
from quantbench.errors import ConfigError
from quantbench.models import lineage
from quantbench.store import Store

GIB = 1 << 30
FORMATS = ("markdown", "csv", "json")
OBJECTIVES = ("memory", "latency")
SYNTHETIC_NOTE = "synthetic weights: speed/memory only"


@dataclass
class Rules:
    min_agreement: float = 0.95  # top-answer agreement with BF16, a fraction
    use_noise_floor: bool = True  # a variant `worse` than the noise floor does not pass
    vram_budget_gib: float | None = None  # peak memory must fit (VRAM; host RSS on a CPU)
    prefer_native: bool = True  # drop emulated variants when a native one passes
    objective: str = "memory"  # memory (smallest weights) | latency (lowest p50)
    margins: an.Margins = field(default_factory=an.Margins)  # the verdict's practical margins over the noise floor

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ConfigError(f"--min-agreement {self.min_agreement}: give a fraction between 0 and 1 (e.g. 0.95)")
        if self.vram_budget_gib is not None and self.vram_budget_gib <= 0:
            raise ConfigError(f"--vram-budget-gib {self.vram_budget_gib}: give a positive number of GiB")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective {self.objective!r}: use one of {', '.join(OBJECTIVES)}")

    def describe(self, cpu: bool = False) -> str:
        memory = "the smallest weights in host memory" if cpu else "the smallest VRAM (weights)"
        goal = memory if self.objective == "memory" else "the lowest p50 latency"
        parts = [f"agreement with BF16 ≥ {self.min_agreement:.1%}"]
        if self.use_noise_floor:
            parts.append("not worse than the noise floor")
        if self.vram_budget_gib is not None:
            parts.append(f"peak {'host RSS' if cpu else 'VRAM'} ≤ {self.vram_budget_gib:g} GiB")
        if self.prefer_native:
            parts.append("native format preferred")
        return f"{goal} among variants with " + ", ".join(parts)


@dataclass
class Row:
    run: dict[str, Any]
    label: str  # variant, with the kernel when two rows share a variant
    cpu: bool
    weights_bytes: int | None  # VRAM taken by the load; on a CPU every tensor of the loaded model
    peak_bytes: int | None  # NVML per-process peak (torch's peak reserved when NVML had none); host RSS on a CPU
    peak_source: str | None  # nvml | torch_reserved | host_rss
    comparison: Comparison | None = None
    quality: str | None = None  # why there are no parity figures: reference | synthetic | failed | an error
    excluded: list[str] = field(default_factory=list)
    recommended: bool = False
    best_for: str = ""

    @property
    def ok(self) -> bool:
        return self.run.get("status") == "ok"

    @property
    def is_reference(self) -> bool:
        return self.quality == "reference"

    @property
    def p50(self) -> float | None:
        return _num(self.run.get("p50_ms"))


@dataclass
class GpuReport:
    gpu: str  # label: "NVIDIA H200 (hopper)" or "CPU (host)"
    gpu_family: str | None
    cpu: bool
    model_id: str | None
    suite_id: str | None
    suite_hash: str | None
    rows: list[Row]
    reference: dict[str, Any] | None
    floor: FloorStats | None
    recommended: Row | None
    rule: str  # the rule that picked the recommendation, or why there is none
    reference_accuracy: float | None = None  # unweighted mean over benchmarks, on gold
    notes: list[str] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)  # batched runs: report.throughput()


class Reports(list[GpuReport]):
    """build_report's tables, plus `failed`: the failed runs that belong to none of them (they failed before
    their model or suite was known), oldest first, listed under the tables instead of making a table of their own."""

    def __init__(self, reports: list[GpuReport] | None = None, failed: list[dict[str, Any]] | None = None):
        super().__init__(reports or [])
        self.failed = list(failed or [])


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        return None if math.isnan(float(v)) else float(v)
    except (TypeError, ValueError):
        return None


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


# -- building ------------------------------------------------------------------------------------------------
def matches_gpu(run: dict[str, Any], gpu: str) -> bool:
    """`--gpu`: cpu, a family (hopper, blackwell, ...) or part of the GPU's name, case-insensitive."""
    g = gpu.strip().lower()
    if parity.is_cpu(run):
        return g == "cpu"
    return g == str(run.get("gpu_family") or "").lower() or g in str(run.get("gpu_name") or "").lower()


def _memory(run: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    if parity.is_cpu(run):
        peak = _int(run.get("host_rss_peak_bytes"))
        return _int(run.get("model_tensor_bytes")), peak, "host_rss" if peak is not None else None
    nvml, reserved = _int(run.get("mem_nvml_peak_bytes")), _int(run.get("mem_peak_reserved_bytes"))
    peak, source = (nvml, "nvml") if nvml is not None else (reserved, "torch_reserved" if reserved is not None else None)
    return _int(run.get("mem_weights_bytes")), peak, source


# Kernel paths name an implementation, then the generation of its kernels (`quantbench grouped-moe
# gluon-wgmma-int4 +fused rmsnorm+rope+qkv +cuda-graph`): a newer generation supersedes an older one; another
# implementation (transformers' experts kernels, auto-round's own per-expert loop) is another row.
# transformers' kernels keep their experts implementation (`transformers experts=eager` is not superseded by
# `experts=grouped_mm`: it is another kernel).
IMPLEMENTATIONS = {"quantbench grouped-moe": "quantbench engine", "auto-round per-expert loop": "auto-round loop"}


def implementation(kernel_path: str | None) -> str:
    """The implementation a kernel path belongs to, without its kernels' generation."""
    base = str(kernel_path or "").split(" +", 1)[0]
    return next((prefix for prefix in IMPLEMENTATIONS if base == prefix or base.startswith(prefix + " ")), base)


def _variant_key(run: dict[str, Any], history: bool = False) -> tuple[str, ...]:
    """What makes a row: the variant and its implementation; with `history`, every kernel generation too."""
    kernel = str(run.get("kernel_path")) if history else implementation(run.get("kernel_path"))
    return (str(run.get("backend")), str(run.get("variant")), kernel, str(run.get("weight_format")))


def _pick_rows(runs: list[dict[str, Any]], history: bool = False) -> list[dict[str, Any]]:
    """Latest ok run per variant (and implementation; kernel path with `history`); the latest failed one only
    where the variant never succeeded."""
    best: dict[tuple[str, ...], dict[str, Any]] = {}
    for run in runs:  # oldest first
        key = _variant_key(run, history)
        if run.get("status") == "ok" or best.get(key, {}).get("status") != "ok":
            best[key] = run
    return sorted(best.values(), key=lambda r: (r.get("backend") != "bf16", str(r.get("variant")), str(r.get("kernel_path"))))


def _groups(runs: list[dict[str, Any]]) -> tuple[dict[tuple, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Runs by (GPU, model, suite), and the failed runs that belong to no table: a run that failed before its
    model or suite was known (a bad --model path, a suite that does not parse) has no row to fill."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    orphans = []  # runs that failed before their suite was known
    for run in runs:
        if run.get("suite_hash") is None or run.get("model_id") is None:
            orphans.append(run)
            continue
        groups.setdefault((parity.gpu_key(run), run.get("model_id"), run["suite_hash"]), []).append(run)
    homeless = []
    for run in orphans:
        homes = [k for k in groups if run.get("model_id") is not None
                 and k[:2] == (parity.gpu_key(run), run.get("model_id"))]
        for k in homes:
            groups[k].append(run)
        if not homes:
            homeless.append(run)
    return groups, homeless


def _load_runs(store: Store) -> list[dict[str, Any]]:
    # batch: decisions per forward pass (throughput mode); decisions_per_s over the full-size batches
    df = store.read(
        "WITH b AS (SELECT run_id, max(batch) AS batch FROM latencies GROUP BY run_id), "
        "t AS (SELECT l.run_id, count(*) / (sum(l.model_ms / l.batch) / 1000) AS decisions_per_s "
        "      FROM latencies l JOIN b ON l.run_id = b.run_id AND l.batch = b.batch GROUP BY l.run_id) "
        "SELECT r.*, l.p50_ms, l.p90_ms, l.n_timed, b.batch, t.decisions_per_s FROM runs r "
        "LEFT JOIN run_latency l USING (run_id) LEFT JOIN b USING (run_id) LEFT JOIN t USING (run_id) "
        "ORDER BY r.created_at"
    )
    return parity._records(df)


def _pair_with_bases(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Variants made elsewhere join their base's table: a run whose own model has no BF16 run but whose evidence
    (quantbench.models.lineage) pairs it with one takes that BF16 run's model id; `own_model_id` keeps its own and
    `paired_by` says how it was paired."""
    pairs = lineage.pair_runs(runs)
    for run in runs:
        paired = pairs.get(str(run["run_id"]))
        if paired is not None:
            run["own_model_id"] = run.get("model_id")
            run["model_id"], run["paired_by"] = paired
    return runs


def pairing_notes(rows: list[Row]) -> list[str]:
    """One note per variant paired with its base by evidence rather than by a shared model id."""
    notes = []
    for row in rows:
        how = row.run.get("paired_by")
        if how:
            notes.append(f"{row.label} is the checkpoint {row.run.get('own_model_id')}, compared with this model's BF16 "
                         f"run because of {lineage.how_text(how, row.run.get('base_model'))}.")
    return notes


def _batch(run: dict[str, Any]) -> int:
    return _int(run.get("batch")) or 1


def throughput(group: list[dict[str, Any]], history: bool = True) -> list[dict[str, Any]]:
    """Batched runs (several decisions per forward pass) as decisions/s per variant and batch size, newest run of
    each variant, kernel (implementation, without `history`) and batch: the table itself is per-decision latency
    at batch 1, so they never replace its rows. The kernel is named only where one variant ran under several."""
    latest: dict[tuple, dict[str, Any]] = {}
    for run in group:
        if run.get("status") == "ok" and _batch(run) > 1 and _num(run.get("decisions_per_s")):
            # oldest first: the newest run of each variant, kernel and batch size stays
            kernel = str(run.get("kernel_path")) if history else implementation(run.get("kernel_path"))
            latest[(str(run.get("variant")), kernel, _batch(run))] = run
    kernels: dict[str, set[str]] = {}
    for variant, kernel, _ in latest:
        kernels.setdefault(variant, set()).add(kernel)

    def label(r: dict[str, Any]) -> str:
        v = str(r.get("variant"))
        if len(kernels[v]) == 1:
            return v
        return f"{v} ({r.get('kernel_path') if history else _short(implementation(r.get('kernel_path')))})"

    rows = [{"variant": label(r), "batch": _batch(r), "decisions_per_s": _num(r.get("decisions_per_s")),
             "ms_per_pass": 1000 * _batch(r) / _num(r.get("decisions_per_s")),  # the mean over full batches
             "run_id": str(r.get("run_id"))} for r in latest.values()]
    return sorted(rows, key=lambda t: (t["variant"], t["batch"]))


def throughput_notes(rows: list[dict[str, Any]]) -> list[str]:
    """throughput()'s rows as one sentence: the note `--format json` carries (markdown prints a table)."""
    if not rows:
        return []
    parts = [f"{t['variant']} at batch {t['batch']}: {t['decisions_per_s']:.1f}/s" for t in rows]
    return ["Throughput (decisions per second, several decisions in one forward pass): " + "; ".join(parts) + "."]


def throughput_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """throughput()'s rows as the small table `quantbench report` prints under the latency table (one row per
    variant and batch size: a list of them in one sentence was unreadable past a few)."""
    if not rows:
        return []
    lines = ["Throughput, several decisions in one forward pass (the table above is one decision at a time):", "",
             "| Variant | Decisions per pass | Decisions/s | Mean ms per pass | Run |", "|---|---|---|---|---|"]
    for t in rows:
        lines.append(f"| {_md_escape(t['variant'])} | {t['batch']} | {t['decisions_per_s']:.1f} | "
                     f"{t['ms_per_pass']:.1f} | {t['run_id'][:13]} |")
    return lines + [""]


def since_filter(since: str | None) -> datetime | None:
    """`--since 2026-11-30` (a date or an ISO time; UTC unless it says otherwise) as a timezone-aware time."""
    if not since:
        return None
    try:
        when = datetime.fromisoformat(since)
    except ValueError:
        raise ConfigError(f"--since {since!r}: give a date (2026-11-30) or an ISO time (2026-11-30T08:00)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _short(impl: str) -> str:
    return IMPLEMENTATIONS.get(impl, impl.replace("experts=", ""))


FIXTURE_PREFIX = "quantbench-fixture-moe-"  # quantbench.models.fixture.fixture_id: the embedded model, one id per recipe


def _superseded_fixtures(runs: list[dict[str, Any]]) -> set[tuple[tuple[str, str], str]]:
    """(GPU, model id) of embedded-fixture builds older than the newest one run on that GPU: a new recipe makes a
    new model id, and the old one's runs are development history."""
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for run in runs:
        mid = str(run.get("model_id") or "")
        if mid.startswith(FIXTURE_PREFIX):
            key, when = parity.gpu_key(run), str(run.get("created_at"))
            if key not in newest or when > newest[key][0]:
                newest[key] = (when, mid)
    return {(parity.gpu_key(r), str(r.get("model_id"))) for r in runs
            if str(r.get("model_id") or "").startswith(FIXTURE_PREFIX)
            and newest[parity.gpu_key(r)][1] != r.get("model_id")}


def build_report(store: Store, gpu: str | None = None, model: str | None = None, rules: Rules | None = None, *,
                 host: str | None = None, since: str | None = None, cross_gpu_reference: bool = True,
                 seed: int = 0, history: bool = False, run_ids: set[str] | None = None) -> Reports:
    """One GpuReport per (GPU, model, suite) in the store, filtered by `gpu` / `model` / `host` / `since` (runs
    made at or after that time: leaves out runs of an older quantbench whose kernel paths differ).

    By default each table shows the newest run of each variant and implementation (superseded kernel
    generations left out) and only the newest build of the embedded fixture per GPU; `history` shows every
    kernel generation's newest run and every fixture build (`quantbench report --all`)."""
    rules = rules or Rules()
    runs = _load_runs(store)
    if run_ids is not None:  # only these runs (the demo reports on the runs it just made)
        runs = [r for r in runs if str(r["run_id"]) in run_ids]
    runs = _pair_with_bases(runs)
    if not history and not model and run_ids is None:
        old = _superseded_fixtures(runs)
        runs = [r for r in runs if (parity.gpu_key(r), str(r.get("model_id"))) not in old]
    after = since_filter(since)
    if after is not None:
        runs = [r for r in runs if r.get("created_at") is not None and pd.Timestamp(r["created_at"]) >= after]
    if gpu:
        runs = [r for r in runs if matches_gpu(r, gpu)]
    if host:
        runs = [r for r in runs if str(r.get("host")) == host]
    if model:
        m = model.lower()
        runs = [r for r in runs if any(r.get(k) == model or m in str(r.get(k) or "").lower()
                                       for k in ("model_id", "own_model_id"))]
    answers: dict[str, pd.DataFrame] = {}

    def answers_of(run: dict[str, Any]) -> pd.DataFrame:
        rid = str(run["run_id"])
        if rid not in answers:
            answers[rid] = parity.load_answers(store, rid)
        return answers[rid]

    groups, homeless = _groups(runs)
    reports = Reports(failed=homeless)
    for group in groups.values():
        batch1 = [r for r in group if _batch(r) == 1]
        rows_runs = [r for r in _pick_rows(batch1, history) if (r.get("role") or "candidate") != "noise_floor"]
        if rows_runs:
            reports.append(_build_one(store, group, rows_runs, rules, answers_of, cross_gpu_reference, seed,
                                      history))
    reports.sort(key=lambda r: (r.cpu, r.gpu, str(r.model_id), str(r.suite_id)))
    return reports


def row_labels(runs: list[dict[str, Any]]) -> list[str]:
    """A row's name: its variant (`int4`); where two rows share one, with the implementation (`bf16
    (transformers)`, `bf16 (quantbench engine)`); where those are shared too (history), the whole kernel path."""
    labels = [str(r.get("variant") or r.get("backend")) for r in runs]
    labels = [f"{label} ({_short(implementation(r.get('kernel_path')))})" if labels.count(label) > 1 else label
              for r, label in zip(runs, labels, strict=True)]
    return [f"{str(r.get('variant') or r.get('backend'))} ({r.get('kernel_path')})" if labels.count(label) > 1
            else label for r, label in zip(runs, labels, strict=True)]


def _build_one(store, group, rows_runs, rules, answers_of, cross_gpu_reference, seed, history) -> GpuReport:
    first = rows_runs[0]
    cpu = parity.is_cpu(first)
    rows = [Row(run, label, cpu, *_memory(run)) for run, label in zip(rows_runs, row_labels(rows_runs), strict=True)]
    synthetic = any(r.ok for r in rows) and all(r.run.get("weights") == "synthetic" for r in rows if r.ok)
    ok_runs = [r for r in group if r.get("status") == "ok"]
    refs = [r for r in ok_runs if r.get("backend") == "bf16" and (r.get("role") or "candidate") != "noise_floor"
            and _batch(r) == 1]
    reference = max(refs, key=parity.reference_rank, default=None)
    notes: list[str] = []
    if reference is None and cross_gpu_reference and ok_runs and not synthetic:
        reference = parity.find_reference(store, ok_runs[-1], any_gpu=True)
        if reference is not None:
            notes.append(f"† agreement and accuracy are measured against BF16 on {parity.gpu_label(reference)} "
                         f"(run {str(reference['run_id'])[:13]}): no successful BF16 run on this machine")
    floor = None
    if reference is not None and not synthetic:
        floor_run = parity.find_noise_floor(store, reference)
        if floor_run is not None:
            try:
                floor = parity.floor_stats(reference, answers_of(reference), floor_run, answers_of(floor_run), seed)
            except ParityError as e:
                notes.append(f"noise floor run {str(floor_run['run_id'])[:13]} not used: {e}")
    for row in rows:
        _fill_quality(row, reference, floor, answers_of, seed, rules.margins)
    ref_acc = None
    if reference is not None and not synthetic:
        by_bench = an.accuracy_by_benchmark(answers_of(reference))
        ref_acc = float(by_bench["accuracy"].mean()) if len(by_bench) else None
    report = GpuReport(
        gpu=parity.gpu_label(first), gpu_family=first.get("gpu_family"), cpu=cpu, model_id=first.get("model_id"),
        suite_id=next((r.get("suite_id") for r in group if r.get("suite_id")), None),
        suite_hash=next((r.get("suite_hash") for r in group if r.get("suite_hash")), None),
        rows=rows, reference=reference, floor=floor, recommended=None, rule="", reference_accuracy=ref_acc,
        notes=notes + pairing_notes(rows), throughput=throughput(group, history),
    )
    _recommend(report, rules, synthetic)
    return report


def _fill_quality(row: Row, reference, floor, answers_of, seed, margins: an.Margins | None = None) -> None:
    run = row.run
    if not row.ok:
        row.quality = f"failed ({run.get('failure') or 'error'})"
    elif run.get("weights") == "synthetic":
        row.quality = SYNTHETIC_NOTE
    elif reference is None:
        row.quality = "no BF16 reference"
    elif str(run["run_id"]) == str(reference["run_id"]):
        row.quality = "reference"
    else:
        try:
            row.comparison = parity.compare_loaded(run, answers_of(run), reference, answers_of(reference), floor,
                                                   seed=seed, margins=margins)
        except ParityError as e:
            row.quality = f"not comparable ({str(e).split(':')[0]})"  # the cause; `quantbench compare` says more


def _recommend(report: GpuReport, rules: Rules, synthetic: bool) -> None:
    ok = [r for r in report.rows if r.ok]
    fastest = min((r for r in ok if r.p50 is not None), key=lambda r: r.p50, default=None)
    smallest = min((r for r in ok if r.weights_bytes is not None), key=lambda r: r.weights_bytes, default=None)
    for r in report.rows:
        if not r.ok:
            r.excluded.append(f"failed here ({r.run.get('failure') or 'error'})")
            continue
        if synthetic:
            continue
        if not r.is_reference:
            c = r.comparison
            if c is None:
                r.excluded.append(r.quality or "no parity figures")
            else:
                if c.agreement.rate < rules.min_agreement:
                    r.excluded.append(f"agreement {c.agreement.rate:.1%} < {rules.min_agreement:.1%}")
                if rules.use_noise_floor and c.verdict.label == an.WORSE:
                    r.excluded.append("worse than the noise floor by more than the margin")
        if rules.vram_budget_gib is not None:
            if r.peak_bytes is None:
                r.excluded.append("peak memory unknown")
            elif r.peak_bytes > rules.vram_budget_gib * GIB:
                r.excluded.append(f"peak {r.peak_bytes / GIB:.1f} GiB over the {rules.vram_budget_gib:g} GiB budget")
    passing = [r for r in ok if not r.excluded]
    if rules.prefer_native and any(r.run.get("native") != "emulated" for r in passing):
        for r in passing:
            if r.run.get("native") == "emulated":
                r.excluded.append("emulated here (a native variant passes)")
        passing = [r for r in passing if not r.excluded]
    inf = float("inf")
    by_memory = lambda r: (r.weights_bytes if r.weights_bytes is not None else inf, r.p50 if r.p50 is not None else inf)  # noqa: E731
    by_latency = lambda r: (r.p50 if r.p50 is not None else inf, r.weights_bytes if r.weights_bytes is not None else inf)  # noqa: E731
    pick = min(passing, key=by_memory if rules.objective == "memory" else by_latency, default=None)

    if not ok:
        report.rule = "no recommendation: every variant failed here"
    elif synthetic:
        report.rule = "no recommendation: synthetic (random) weights carry speed and memory only"
    elif report.reference is None:
        report.rule = ("no recommendation: no BF16 reference run for this model and suite "
                       "(run `quantbench run --backend bf16` with them)")
    elif pick is None:
        report.rule = f"no variant passes the rules ({rules.describe(report.cpu)}); see Best for"
    else:
        pick.recommended = True
        report.recommended = pick
        report.rule = rules.describe(report.cpu)

    for r in report.rows:
        facts = []
        if r.recommended:
            facts.append("⭐ Recommended")
        elif r.is_reference:
            facts.append("Reference quality")
        if r.ok and r is fastest and len(ok) > 1:
            facts.append("fastest here")
        if r.ok and r is smallest and len(ok) > 1:
            facts.append(f"smallest {'memory' if report.cpu else 'VRAM'} here")
        if r.ok and r.run.get("native") == "native" and not r.cpu:
            facts.append(f"native on {r.run.get('gpu_family')}")
        facts += r.excluded
        r.best_for = "; ".join(facts) or "passes the rules"


# -- formatting ----------------------------------------------------------------------------------------------
def fmt_bytes(n: int | None, binary: bool = True) -> str:
    """GiB for memory, GB (10⁹) for disk, as download sizes are quoted; n/a for unknown, never 0."""
    if n is None:
        return "n/a"
    base = 1024 if binary else 1000
    for unit in ("GiB", "MiB", "KiB") if binary else ("GB", "MB", "kB"):
        scale = base ** {"G": 3, "M": 2, "K": 1, "k": 1}[unit[0]]
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    # tenths up to 100 ms: at the real shape 11.8 and 12.3 ms are different answers to a 12 ms goal
    return f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def cells(row: Row, report: GpuReport) -> dict[str, str]:
    """One table row as text, in column order."""
    run, c = row.run, row.comparison
    dagger = "†" if report.reference is not None and row.comparison is not None and parity.gpu_key(
        report.reference) != parity.gpu_key(run) else ""
    if c is not None:
        agree = f"{_pct(c.agreement.rate)} ({100 * c.agreement.lo:.1f}–{100 * c.agreement.hi:.1f}){dagger}"
        tv = f"{c.tv.mean:.3f}"
        m = c.paired.mean
        acc = "no gold answers" if m is None else f"{100 * m.mean:+.2f} pts ({100 * m.lo:+.2f}…{100 * m.hi:+.2f})"
    elif row.is_reference:
        agree, tv = "reference", "—"
        acc = "reference" if report.reference_accuracy is None else (
            f"reference (mean accuracy {_pct(report.reference_accuracy)})")
    else:
        agree, tv, acc = row.quality or "n/a", "—", "—"
    verdict = c.verdict.short() if c is not None else "—"
    native = {"native": "yes", "emulated": "no (emulated)"}.get(run.get("native") or "", "—")
    lat = "n/a" if row.p50 is None else f"{fmt_ms(row.p50)} / {fmt_ms(_num(run.get('p90_ms')))} ms"
    peak = fmt_bytes(row.peak_bytes) + ("*" if row.peak_source == "torch_reserved" else "")
    return {
        "Variant": row.label,
        "Format": str(run.get("weight_format") or "n/a"),
        "Size on disk": fmt_bytes(_int(run.get("disk_bytes")), binary=False),
        ("Weights (host memory)" if row.cpu else "VRAM (weights)"): fmt_bytes(row.weights_bytes),
        ("Peak host RSS" if row.cpu else "Peak VRAM"): peak,
        "Latency p50 / p90 (per decision)": lat,
        "Agrees with BF16 (95% CI)": agree,
        "TV": tv,
        "Verdict": verdict,
        "Δ accuracy vs BF16": acc,
        "Native here?": native,
        "Best for": row.best_for,
        "Kernel": str(run.get("kernel_path") or "n/a"),
    }


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_one(report: GpuReport) -> str:
    title = f"### {report.model_id} on {report.gpu}"
    lines = [title, "", f"Suite {report.suite_id} (hash {report.suite_hash})."]
    table = [cells(r, report) for r in report.rows]
    header = list(table[0])
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(row[h]) for h in header) + " |" for row in table]
    lines.append("")
    if report.recommended:
        lines.append(f"**Recommended: {report.recommended.label}**, picked by the rule: {report.rule}.")
    else:
        lines.append(f"**Recommendation:** {report.rule}.")
    lines.append("")
    lines += throughput_markdown(report.throughput)
    notes = list(report.notes)
    ref = report.reference
    if ref is not None and any(r.comparison is not None for r in report.rows):
        n = max(r.comparison.agreement.n for r in report.rows if r.comparison is not None)
        notes.append(
            f"Agrees with BF16 is the share of {n} questions where the variant's top answer matches the BF16 run "
            f"{str(ref['run_id'])[:13]} ({ref.get('kernel_path')}), with a 95% Wilson interval; TV is the mean total "
            "variation between their per-option distributions; Δ accuracy is the unweighted mean over benchmarks of "
            "paired per-benchmark deltas on identical questions, with a 95% paired bootstrap interval."
        )
    if report.floor is not None:
        f = report.floor
        notes.append(
            f"Noise floor: BF16 against itself under another kernel ({f.run.get('kernel_path')}, run "
            f"{str(f.run['run_id'])[:13]}) agrees on {_pct(f.agreement.rate)} ({100 * f.agreement.lo:.1f}–"
            f"{100 * f.agreement.hi:.1f}) of the questions, TV {f.tv.mean:.3f}."
        )
        margins = next((r.comparison.verdict.margins for r in report.rows if r.comparison is not None), None)
        if parity.floor_note(f, margins):
            notes.append("Note: " + parity.floor_note(f, margins) + ".")
        notes += verdict_notes(report)
    elif ref is not None and not any(r.quality == SYNTHETIC_NOTE for r in report.rows):
        notes.append("No noise-floor run: make one with `quantbench run --noise-floor` to judge how close is close.")
    if report.cpu:
        notes.append("CPU runs have no VRAM: Weights (host memory) is the bytes of every tensor the loaded model "
                     "holds; Peak host RSS is the process's peak resident memory.")
    else:
        notes.append("VRAM (weights) is the device memory the load allocated; Peak VRAM is NVML's per-process peak "
                     "(what nvidia-smi shows; * = torch's peak reserved, where NVML had no figure).")
    notes.append("Size on disk is in GB (10⁹ bytes), memory in GiB; n/a means not measured, — not applicable.")
    lines += [f"- {_md_escape(n)}" for n in notes]
    return "\n".join(lines)


def verdict_notes(report: GpuReport) -> list[str]:
    """The rule behind the Verdict column, then each variant's figures: the excess over the floor and its interval."""
    compared = [r for r in report.rows if r.comparison is not None and r.comparison.verdict.parts]
    if not compared:
        return []
    m = compared[0].comparison.verdict.margins
    notes = [
        f"Verdict: each variant's excess over the noise floor on the same questions (disagreement with BF16, mean "
        f"TV) with a 95% interval, against stated margins ({m.describe()}): indistinguishable = within the margin "
        "and not detectably above the floor; different, within margin = detectably above it but within the margin; "
        "worse = wholly beyond the margin; inconclusive = the interval straddles the margin, with how many "
        "questions would tell. `--margin-agreement` / `--margin-tv` change the margins."
    ]
    for r in compared:
        v = r.comparison.verdict
        figures = "; ".join(
            f"disagreement {100 * e.diff:+.1f} pts [{100 * e.lo:+.1f}, {100 * e.hi:+.1f}]" if e.statistic ==
            "disagreement" else f"TV {e.diff:+.4f} [{e.lo:+.4f}, {e.hi:+.4f}]" for e in v.parts)
        notes.append(f"{r.label}: {v.short()}; {figures}.")
    return notes


def _summary_rows(reports: list[GpuReport]) -> list[dict[str, str]]:
    return [{"GPU": r.gpu, "Model": str(r.model_id), "Suite": str(r.suite_id),
             "Recommended": r.recommended.label if r.recommended else "none", "Rule": r.rule} for r in reports]


@dataclass
class GpuMatrix:
    """Which quant on which GPU, for one model and suite: a cell per variant and GPU, and each GPU's pick."""

    model_id: str | None
    suite_id: str | None
    gpus: list[str]
    cells: dict[str, dict[str, str]]  # variant label → GPU → "p50 · memory · agreement" (⭐ marks the pick)
    picks: dict[str, str]  # GPU → the recommended variant, or why none


def matrix_cell(row: Row, report: GpuReport) -> str:
    """One variant on one GPU in a few words: p50 latency, weights in memory, agreement with BF16."""
    if not row.ok:
        return f"failed ({row.run.get('failure') or 'error'})"
    c = row.comparison
    if c is not None:
        quality = f"{_pct(c.agreement.rate)} agree"
    elif row.is_reference:
        quality = "reference"
    else:
        quality = "speed/memory only" if row.quality == SYNTHETIC_NOTE else (row.quality or "n/a")
    lat = "n/a" if row.p50 is None else f"{fmt_ms(row.p50)} ms"
    text = f"{lat} · {fmt_bytes(row.weights_bytes)} · {quality}"
    return f"⭐ {text}" if row.recommended else text


def gpu_matrices(reports: list[GpuReport]) -> list[GpuMatrix]:
    """One matrix per (model, suite) that ran on more than one GPU (or CPU host), variants in the order the
    tables list them."""
    by_model: dict[tuple, list[GpuReport]] = {}
    for rep in reports:
        by_model.setdefault((rep.model_id, rep.suite_hash), []).append(rep)
    out = []
    for reps in by_model.values():
        if len({r.gpu for r in reps}) < 2:
            continue
        cells_by: dict[str, dict[str, str]] = {}
        for rep in reps:
            for row in rep.rows:
                cells_by.setdefault(row.label, {})[rep.gpu] = matrix_cell(row, rep)
        picks = {rep.gpu: rep.recommended.label if rep.recommended else rep.rule.removeprefix("no recommendation: ")
                 for rep in reps}
        out.append(GpuMatrix(reps[0].model_id, reps[0].suite_id, [r.gpu for r in reps], cells_by, picks))
    return out


def matrix_markdown(m: GpuMatrix) -> str:
    lines = [f"### Which quant on which GPU: {m.model_id} (suite {m.suite_id})", "",
             "Each cell: p50 latency per decision · weights in memory (VRAM; host memory on a CPU) · agreement with "
             "that GPU's BF16; ⭐ the pick on that GPU.", "",
             "| Variant | " + " | ".join(_md_escape(g) for g in m.gpus) + " |", "|---|" + "---|" * len(m.gpus)]
    for label, by_gpu in m.cells.items():
        lines.append(f"| {_md_escape(label)} | " + " | ".join(_md_escape(by_gpu.get(g, "not run")) for g in m.gpus)
                     + " |")
    lines.append("| **Pick** | " + " | ".join(f"**{_md_escape(m.picks[g])}**" for g in m.gpus) + " |")
    return "\n".join(lines)


FAILED_SHOWN = 10  # the newest failed runs listed under the tables; `quantbench runs` lists every one


def failed_lines(failed: list[dict[str, Any]]) -> list[str]:
    """The failed runs that belong to no table, newest first, one line each: when, which run, what, why."""
    if not failed:
        return []
    lines = [f"### Failed runs ({len(failed)})", "",
             "These runs failed before their model or suite was known, so they have no row in a table:", ""]
    for run in sorted(failed, key=lambda r: str(r.get("created_at")), reverse=True)[:FAILED_SHOWN]:
        when = pd.Timestamp(run["created_at"]).strftime("%Y-%m-%d %H:%M") if run.get("created_at") else "?"
        first = str(run.get("error") or "").strip().splitlines()
        why = f"{run.get('failure') or 'error'}" + (f": {first[0][:160]}" if first else "")
        lines.append(f"- {when} {str(run['run_id'])[:13]} {run.get('backend')} on {parity.gpu_label(run)}: "
                     f"{_md_escape(why)}")
    if len(failed) > FAILED_SHOWN:
        lines.append(f"- … and {len(failed) - FAILED_SHOWN} older (`quantbench runs` lists every run)")
    return lines


def _markdown(reports: list[GpuReport]) -> str:
    parts = [_markdown_one(r) for r in reports]
    parts += [matrix_markdown(m) for m in gpu_matrices(reports)]
    if len(reports) > 1:
        rows = _summary_rows(reports)
        cols = ("GPU", "Model", "Suite", "Recommended", "Rule")
        lines = ["### Recommended per GPU", "", "| " + " | ".join(cols) + " |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md_escape(row[k]) for k in cols) + " |" for row in rows]
        parts.append("\n".join(lines))
    if getattr(reports, "failed", None):
        parts.append("\n".join(failed_lines(reports.failed)))
    return "\n\n".join(parts) + "\n"


def flat_rows(reports: list[GpuReport]) -> pd.DataFrame:
    """Raw figures, one row per variant per report (empty where unknown): the csv and the dashboard."""
    out = []
    for rep in reports:
        for row in rep.rows:
            run, c = row.run, row.comparison
            m = c.paired.mean if c is not None else None
            out.append({
                "gpu": rep.gpu, "gpu_family": rep.gpu_family, "host": run.get("host"), "model_id": rep.model_id,
                "suite_id": rep.suite_id, "suite_hash": rep.suite_hash, "variant": row.label,
                "backend": run.get("backend"), "kernel_path": run.get("kernel_path"),
                "weight_format": run.get("weight_format"), "run_id": str(run["run_id"]), "status": run.get("status"),
                "failure": run.get("failure"), "weights": run.get("weights"), "native": run.get("native"),
                "disk_bytes": _int(run.get("disk_bytes")),
                "weights_memory_bytes": row.weights_bytes,
                "weights_memory_kind": "host_tensors" if row.cpu else "vram_allocated",
                "peak_memory_bytes": row.peak_bytes, "peak_memory_kind": row.peak_source,
                "p50_ms": row.p50, "p90_ms": _num(run.get("p90_ms")), "n_timed": _int(run.get("n_timed")),
                "quality": row.quality,
                "agreement": c.agreement.rate if c else None, "agreement_lo": c.agreement.lo if c else None,
                "agreement_hi": c.agreement.hi if c else None, "n_questions": c.agreement.n if c else None,
                "tv_mean": c.tv.mean if c else None, "kl_mean": c.kl.mean if c else None,
                "verdict": c.verdict.label if c else None,
                "verdict_n_needed": c.verdict.n_needed if c else None,
                **{f"excess_{e.statistic.lower().replace(' ', '_')}{k}": getattr(e, v)
                   for e in (c.verdict.parts if c else ()) for k, v in (("", "diff"), ("_lo", "lo"), ("_hi", "hi"))},
                "delta_accuracy": m.mean if m else None, "delta_accuracy_lo": m.lo if m else None,
                "delta_accuracy_hi": m.hi if m else None,
                "reference_run_id": str(rep.reference["run_id"]) if rep.reference else None,
                "own_model_id": run.get("own_model_id"), "paired_by": run.get("paired_by"),
                "recommended": row.recommended, "best_for": row.best_for,
            })
    df = pd.DataFrame(out)
    for col in ("disk_bytes", "weights_memory_bytes", "peak_memory_bytes", "n_timed", "n_questions"):
        if col in df:
            df[col] = df[col].astype("Int64")  # integers stay integers beside unknowns
    return df


def to_json(reports: list[GpuReport], rules: Rules | None = None) -> dict[str, Any]:
    flat = flat_rows(reports)
    records = parity._clean(flat.astype(object).where(flat.notna(), None).to_dict("records")) if len(flat) else []
    out = []
    for rep in reports:
        f = rep.floor
        out.append({
            "gpu": rep.gpu, "gpu_family": rep.gpu_family, "cpu": rep.cpu, "model_id": rep.model_id,
            "suite_id": rep.suite_id, "suite_hash": rep.suite_hash,
            "reference_run_id": str(rep.reference["run_id"]) if rep.reference else None,
            "noise_floor": None if f is None else parity._clean({
                "run_id": str(f.run["run_id"]), "kernel_path": f.run.get("kernel_path"),
                "agreement": asdict(f.agreement), "tv": asdict(f.tv)}),
            "recommended": rep.recommended.label if rep.recommended else None, "rule": rep.rule,
            "notes": throughput_notes(rep.throughput) + rep.notes, "throughput": rep.throughput,
            "rows": [r for r in records if r["gpu"] == rep.gpu and r["model_id"] == rep.model_id
                     and r["suite_hash"] == rep.suite_hash],
        })
    failed = [parity._clean({k: str(run.get(k)) if k in ("run_id", "created_at") else run.get(k) for k in (
        "run_id", "created_at", "backend", "model_path", "gpu_name", "host", "failure", "error")})
        for run in getattr(reports, "failed", [])]
    return {"rules": asdict(rules) if rules else None, "reports": out, "summary": _summary_rows(reports),
            "gpu_matrices": [asdict(m) for m in gpu_matrices(reports)], "failed_runs": failed}


def render(reports: list[GpuReport], fmt: str = "markdown", rules: Rules | None = None) -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "markdown":
        if not reports:
            return "\n".join(["No runs to report.", "", *failed_lines(getattr(reports, "failed", []))]).rstrip() + "\n"
        return _markdown(reports)
    if fmt == "csv":
        buf = io.StringIO()
        flat_rows(reports).to_csv(buf, index=False)
        return buf.getvalue()
    return json.dumps(to_json(reports, rules), indent=2, default=str) + "\n"


# -- entry points for the CLI and the demo -------------------------------------------------------------------
def report_for_this_machine(store: Store, machine_gpu_name_or_family: str, host: str | None = None,
                            rules: Rules | None = None, model: str | None = None,
                            run_ids: set[str] | None = None) -> str:
    """The markdown report for one machine: pass `machine.gpu_name`, or "cpu" (this host's CPU runs unless `host`
    names another); `model` keeps only that model's tables, `run_ids` only those runs (the demo reports on the
    runs it just made, never on older ones of the store)."""
    if machine_gpu_name_or_family.strip().lower() == "cpu" and host is None:
        host = socket.gethostname()
    reports = build_report(store, gpu=machine_gpu_name_or_family, host=host, rules=rules, model=model,
                           run_ids=run_ids)
    if not reports and not reports.failed:
        where = machine_gpu_name_or_family + (f" on {host}" if host else "")
        return f"No successful or failed runs for {where} in {store.path} yet.\n"
    return render(reports, "markdown", rules)


def cli_report(db: str | None = None, fmt: str = "markdown", gpu: str | None = None, model: str | None = None,
               vram_budget_gib: float | None = None, min_agreement: float | None = None,
               host: str | None = None, since: str | None = None, history: bool = False,
               margin_agreement: float = an.MARGIN_AGREEMENT, margin_tv: float = an.MARGIN_TV) -> str:
    """`quantbench report`: prints the report (plain text, so it pastes into a model card) and returns it;
    `history` (`--all`) keeps superseded kernel generations and fixture builds."""
    if min_agreement is not None and 1.0 < min_agreement <= 100.0:
        min_agreement /= 100.0  # --min-agreement 95 means 95%
    rules = Rules(vram_budget_gib=vram_budget_gib, margins=an.Margins(margin_agreement, margin_tv),
                  **({"min_agreement": min_agreement} if min_agreement is not None else {}))
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    store = Store(db)
    reports = build_report(store, gpu=gpu, model=model, rules=rules, host=host, since=since, history=history)
    if not reports and not reports.failed:
        have = sorted({f"{parity.gpu_label(r)}: {r.get('model_id')}" for r in _load_runs(store)})
        asked = " ".join(f"--{k} {v}" for k, v in (("gpu", gpu), ("model", model), ("host", host), ("since", since))
                         if v)
        raise ConfigError(f"no runs match {asked or 'the filters'} in {store.path}; the store has: "
                          + ("; ".join(have) or "no runs (run `quantbench demo`)"))
    text = render(reports, fmt, rules)
    print(text, end="")
    return text
