"""The recommendation rule of the "Which quant should I use?" report: one table per GPU (and model, suite).

Rows are the latest run of each variant (backend, variant, kernel, format) on that GPU — a failed run only when
the variant never succeeded there, so an out-of-memory shows up as what it is. Quality columns compare each row
with the BF16 reference (see quantbench.analysis.parity); runs with synthetic weights show speed and memory only.
Rows are one decision at a time (batch 1); batched runs (`run --concurrency N`) are a throughput table beside them,
and a group of batched runs alone is a report of that table only: no rows, no recommendation, and a note saying why
(GpuReport.batched_only).

"Best for" follows `Rules`, applied in this order, and the report prints which rule picked the recommendation:
  1. quality: agreement with BF16 ≥ `min_agreement`, and (with `use_noise_floor`) shown within the margin over
     the noise floor on all its questions (indistinguishable or different-within-margin: an `inconclusive`
     verdict, too few questions to tell, does not pass) and not `worse` on any one modality's questions (a
     modality's own verdict may be inconclusive: its questions are a part); the BF16 reference passes by
     definition; a row without parity figures cannot pass;
  2. memory: peak memory (peak VRAM; peak host RSS on a CPU) ≤ `vram_budget_gib`, when a budget is set;
  3. native: with `prefer_native`, a variant that is emulated on this GPU is dropped when a native one passes;
  4. objective: the smallest weights in memory (`objective="memory"`) or the lowest p50 latency ("latency"),
     the other figure breaking ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from quantbench.analysis import conditions, efficiency, parity, provenance, repeats
from quantbench.analysis import significance as sig
from quantbench.analysis import stats as an
from quantbench.analysis.margins import Margins
from quantbench.analysis.parity import Comparison, FloorStats
from quantbench.analysis.stats import ParityError
from quantbench.errors import ConfigError
from quantbench.models import lineage
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun

GIB = 1 << 30
OBJECTIVES = ("memory", "latency")
SYNTHETIC_NOTE = "synthetic weights: speed/memory only"
BATCHED_ONLY_RULE = "no recommendation: only batched runs here (throughput), no per-decision latency or parity"


@dataclass
class Rules:
    min_agreement: float = 0.95  # top-answer agreement with BF16, a fraction
    use_noise_floor: bool = True  # a variant not shown within the margin over the noise floor does not pass
    vram_budget_gib: float | None = None  # peak memory must fit (VRAM; host RSS on a CPU)
    prefer_native: bool = True  # drop emulated variants when a native one passes
    objective: str = "memory"  # memory (smallest weights) | latency (lowest p50)
    margins: Margins = field(default_factory=Margins)  # the verdict's practical margins over the noise floor

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
            parts.append("shown within the margin over the noise floor")
        if self.vram_budget_gib is not None:
            parts.append(f"peak {'host RSS' if cpu else 'VRAM'} ≤ {self.vram_budget_gib:g} GiB")
        if self.prefer_native:
            parts.append("native format preferred")
        return f"{goal} among variants with " + ", ".join(parts)


@dataclass
class Row:
    run: StoredRun
    label: str  # variant, with the kernel when two rows share a variant
    cpu: bool
    weights_bytes: int | None  # VRAM taken by the load; on a CPU every tensor of the loaded model
    peak_bytes: int | None  # NVML per-process peak (torch's peak reserved when NVML had none); host RSS on a CPU
    peak_source: str | None  # nvml | torch_reserved | host_rss
    comparison: Comparison | None = None
    efficiency: efficiency.Efficiency | None = None  # energy and cost per decision
    quality: str | None = None  # why there are no parity figures: reference | synthetic | failed | an error
    excluded: list[str] = field(default_factory=list)
    recommended: bool = False
    best_for: str = ""
    repeats: repeats.RepeatFigures | None = None  # the run's `run --repeat N` group: p50 and J ± a t interval
    floors: conditions.Floors | None = None  # a GPU row against its spec sheet's bandwidth and energy floors
    busy: str | None = None  # why the machine was busy while this run was timed (None: idle or not recorded)

    @property
    def ok(self) -> bool:
        return self.run.status == "ok"

    @property
    def is_reference(self) -> bool:
        return self.quality == "reference"

    @property
    def p50(self) -> float | None:
        return self.run.p50_ms


@dataclass
class GpuReport:
    gpu: str  # label: "NVIDIA H200 (hopper)" or "CPU (host)"
    gpu_family: str | None
    cpu: bool
    gpu_key: tuple[str, str]  # parity.gpu_key of its runs: what "this GPU" (or this CPU machine) is
    model_id: str | None
    suite_id: str | None
    suite_hash: str | None
    rows: list[Row]
    reference: StoredRun | None
    floor: FloorStats | None
    recommended: Row | None
    rule: str  # the rule that picked the recommendation, or why there is none
    reference_accuracy: float | None = None  # unweighted mean over benchmarks, on gold
    notes: list[str] = field(default_factory=list)
    throughput: list[dict[str, Any]] = field(default_factory=list)  # batched runs: throughput()
    price_per_gpu_hour: float | None = None  # USD: the rows' efficiency carries cost per 1M decisions
    modality_counts: dict[str, int] = field(default_factory=dict)  # the reference's questions per modality
    synthetic: bool = False  # every successful run has synthetic (random) weights: speed and memory only
    no_table_note: str | None = None  # why there are no per-decision rows (only batched runs); None: there are

    @property
    def batched_only(self) -> bool:
        """Only batched runs: a throughput table and `no_table_note`, no rows to compare or recommend from."""
        return self.no_table_note is not None


class Reports(list[GpuReport]):
    """build_report's tables, plus `failed`: the failed runs that belong to none of them (they failed before
    their model or suite was known), oldest first, listed under the tables instead of making a table of their own."""

    def __init__(self, reports: list[GpuReport] | None = None, failed: list[StoredRun] | None = None):
        super().__init__(reports or [])
        self.failed = list(failed or [])
        self.n_cells = 0  # the cells whose p-values were Holm-adjusted together (significance.holm_adjust)

    def adjust(self) -> None:
        """Holm's correction across every cell of these tables (variant × modality × GPU)."""
        self.n_cells = sig.holm_adjust([t for rep in self for row in rep.rows if row.comparison is not None
                                        for t in row.comparison.cells()])


def float_or_none(v: Any) -> float | None:
    if v is None:
        return None
    try:
        return None if math.isnan(float(v)) else float(v)
    except (TypeError, ValueError):
        return None


def int_or_none(v: Any) -> int | None:
    f = float_or_none(v)
    return None if f is None else int(f)


# -- building ------------------------------------------------------------------------------------------------
def matches_gpu(run: StoredRun, gpu: str) -> bool:
    """`--gpu`: cpu, a family (hopper, blackwell, ...) or part of the GPU's name, case-insensitive."""
    g = gpu.strip().lower()
    if run.is_cpu:
        return g == "cpu"
    return g == str(run.gpu_family or "").lower() or g in str(run.gpu_name or "").lower()


def _memory(run: StoredRun) -> tuple[int | None, int | None, str | None]:
    """(weights in memory, peak, where the peak comes from): the record's memory figures (a CPU run's peak is its
    own only; an older row's ru_maxrss was its launcher's)."""
    return (run.weights_memory_bytes, *run.peak_memory)


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


def _variant_key(run: StoredRun, history: bool = False) -> tuple[str, ...]:
    """What makes a row: the variant and its implementation; with `history`, every kernel generation too."""
    kernel = str(run.kernel_path) if history else implementation(run.kernel_path)
    return (str(run.backend), str(run.variant), kernel, str(run.weight_format))


def _pick_rows(runs: list[StoredRun], history: bool = False) -> list[StoredRun]:
    """Latest ok run per variant (and implementation; kernel path with `history`); the latest failed one only
    where the variant never succeeded."""
    best: dict[tuple[str, ...], StoredRun] = {}
    for run in runs:  # oldest first
        key = _variant_key(run, history)
        if run.status == "ok" or key not in best or best[key].status != "ok":
            best[key] = run
    return sorted(best.values(), key=lambda r: (r.backend != "bf16", str(r.variant), str(r.kernel_path)))


def _groups(runs: list[StoredRun]) -> tuple[dict[tuple, list[StoredRun]], list[StoredRun]]:
    """Runs by (GPU, model, suite), and the failed runs that belong to no table: a run that failed before its
    model or suite was known (a bad --model path, a suite that does not parse) has no row to fill."""
    groups: dict[tuple, list[StoredRun]] = {}
    orphans = []  # runs that failed before their suite was known
    for run in runs:
        if run.suite_hash is None or run.model_id is None:
            orphans.append(run)
            continue
        groups.setdefault((parity.gpu_key(run), run.model_id, run.suite_hash), []).append(run)
    homeless = []
    for run in orphans:
        homes = [k for k in groups if run.model_id is not None and k[:2] == (parity.gpu_key(run), run.model_id)]
        for k in homes:
            groups[k].append(run)
        if not homes:
            homeless.append(run)
    return groups, homeless


def stored_runs(store: Store) -> list[StoredRun]:
    """Every run, oldest first, with its latency, accuracy and where it came from (quantbench.store.queries,
    the store's own label filled in by quantbench.analysis.provenance)."""
    return provenance.attach(store, queries.stored_runs(store))


def _pair_with_bases(runs: list[StoredRun]) -> list[StoredRun]:
    """Variants made elsewhere join their base's table: a run whose own model has no BF16 run but whose evidence
    (quantbench.models.lineage) pairs it with one takes that BF16 run's model id; `own_model_id` keeps its own and
    `paired_by` says how it was paired."""
    pairs = lineage.pair_runs(runs)
    out = []
    for run in runs:
        paired = pairs.get(run.run_id)
        if paired is not None:
            run = replace(run, own_model_id=run.model_id, model_id=paired[0], paired_by=paired[1])
        out.append(run)
    return out


def pairing_notes(rows: list[Row]) -> list[str]:
    """One note per variant paired with its base by evidence rather than by a shared model id."""
    notes = []
    for row in rows:
        how = row.run.paired_by
        if how:
            notes.append(f"{row.label} is the checkpoint {row.run.own_model_id}, compared with this model's BF16 "
                         f"run because of {lineage.how_text(how, row.run.base_model)}.")
    return notes


def throughput(group: list[StoredRun], history: bool = True,
               price_per_gpu_hour: float | None = None) -> list[dict[str, Any]]:
    """Batched runs (several decisions per forward pass) as decisions/s per variant and batch size, newest run of
    each variant, kernel (implementation, without `history`) and batch: the table itself is per-decision latency
    at batch 1, so they never replace its rows. The kernel is named only where one variant ran under several.
    Each row carries its run's energy per decision and, given a price, its cost per 1M decisions (from its
    decisions/s), and the run itself (`run`: the csv names its backend, kernel and machine; json leaves it out)."""
    latest: dict[tuple, StoredRun] = {}
    for run in group:
        if run.status == "ok" and run.forward_batch > 1 and run.decisions_per_s:
            # oldest first: the newest run of each variant, kernel and batch size stays
            kernel = str(run.kernel_path) if history else implementation(run.kernel_path)
            latest[(str(run.variant), kernel, run.forward_batch)] = run
    kernels: dict[str, set[str]] = {}
    newest: dict[tuple[str, str], StoredRun] = {}  # the newest batched run of each variant and implementation
    for (variant, kernel, _), run in latest.items():
        kernels.setdefault(variant, set()).add(kernel)
        key = (variant, implementation(run.kernel_path))
        if key not in newest or _when(run) > _when(newest[key]):
            newest[key] = run

    def label(r: StoredRun) -> str:
        v = str(r.variant)
        if len(kernels[v]) > 1:
            v = f"{v} ({r.kernel_path if history else _short(implementation(r.kernel_path))})"
        # a batch size the newest kernels were not run at keeps an earlier generation's figure: say so, by the
        # kernels that ran (an earlier 32-a-pass figure was the dequantizing path's, 16% slower than today's)
        now = newest[(str(r.variant), implementation(r.kernel_path))]
        if not history and r.kernel_path != now.kernel_path:
            v += f" ({_earlier(r.kernel_path, now.kernel_path)})"
        return v

    rows = [{"variant": label(r), "batch": r.forward_batch, "decisions_per_s": r.decisions_per_s,
             "ms_per_pass": 1000 * r.forward_batch / r.decisions_per_s,  # the mean over full batches
             "run_id": r.run_id, "efficiency": efficiency.of_run(r, price_per_gpu_hour), "run": r}
            for r in latest.values()]
    return sorted(rows, key=lambda t: (t["variant"], t["batch"]))


def _when(run: StoredRun) -> datetime:
    return run.created_at or datetime.min.replace(tzinfo=UTC)


def _earlier(kernel_path: str | None, newest_path: str | None) -> str:
    """What an earlier generation's kernel path ran that the newest does not: its kernels (`earlier kernels:
    dequant+grouped_mm+gluon-wgmma-int4`), or where those are the same, its fused ops (`earlier fused ops: +fused
    rmsnorm+rope`)."""
    def split(path: str | None) -> tuple[str, str]:
        base, _, ops = str(path or "").partition(" +")
        impl = implementation(path)
        return base[len(impl):].strip() or base, ("+" + ops) if ops else "none"

    (kernels, ops), (now_kernels, _) = split(kernel_path), split(newest_path)
    return f"earlier kernels: {kernels}" if kernels != now_kernels else f"earlier fused ops: {ops}"


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


FIXTURE_PREFIX = "quantbench-fixture-moe-"  # quantbench.make.fixture.fixture_id: the embedded model, one id per recipe


def _superseded_fixtures(runs: list[StoredRun]) -> set[tuple[tuple[str, str], str]]:
    """(GPU, model id) of embedded-fixture builds older than the newest one run on that GPU: a new recipe makes a
    new model id, and the old one's runs are development history."""
    newest: dict[tuple[str, str], tuple[str, str]] = {}
    for run in runs:
        mid = str(run.model_id or "")
        if mid.startswith(FIXTURE_PREFIX):
            key, when = parity.gpu_key(run), str(run.created_at)
            if key not in newest or when > newest[key][0]:
                newest[key] = (when, mid)
    return {(parity.gpu_key(r), str(r.model_id)) for r in runs
            if str(r.model_id or "").startswith(FIXTURE_PREFIX) and newest[parity.gpu_key(r)][1] != r.model_id}


def build_report(store: Store, gpu: str | None = None, model: str | None = None, rules: Rules | None = None, *,
                 host: str | None = None, since: str | None = None, cross_gpu_reference: bool = True,
                 seed: int = 0, history: bool = False, run_ids: set[str] | None = None,
                 price_per_gpu_hour: float | None = None) -> Reports:
    """One GpuReport per (GPU, model, suite) in the store, filtered by `gpu` / `model` / `host` / `since` (runs
    made at or after that time: leaves out runs of an older quantbench whose kernel paths differ).

    By default each table shows the newest run of each variant and implementation (superseded kernel
    generations left out) and only the newest build of the embedded fixture per GPU; `history` shows every
    kernel generation's newest run and every fixture build (`quantbench report --all`). `price_per_gpu_hour`
    (USD) adds each row's cost per 1M decisions (quantbench.analysis.efficiency)."""
    rules = rules or Rules()
    price = efficiency.check_price(price_per_gpu_hour)
    runs = stored_runs(store)
    if run_ids is not None:  # only these runs (the demo reports on the runs it just made)
        runs = [r for r in runs if r.run_id in run_ids]
    runs = _pair_with_bases(runs)
    if not history and not model and run_ids is None:
        old = _superseded_fixtures(runs)
        runs = [r for r in runs if (parity.gpu_key(r), str(r.model_id)) not in old]
    after = since_filter(since)
    if after is not None:
        runs = [r for r in runs if r.created_at is not None and r.created_at >= after]
    if gpu:
        runs = [r for r in runs if matches_gpu(r, gpu)]
    if host:
        runs = [r for r in runs if str(r.host) == host]
    if model:
        m = model.lower()
        runs = [r for r in runs if any(k == model or m in str(k or "").lower() for k in (r.model_id, r.own_model_id))]
    answers: dict[str, pd.DataFrame] = {}

    def answers_of(run: StoredRun) -> pd.DataFrame:
        if run.run_id not in answers:
            answers[run.run_id] = parity.load_answers(store, run.run_id)
        return answers[run.run_id]

    groups, homeless = _groups(runs)
    reports = Reports(failed=homeless)
    for group in groups.values():
        batch1 = [r for r in group if r.forward_batch == 1]
        rows_runs = [r for r in _pick_rows(batch1, history) if (r.role or "candidate") != "noise_floor"]
        if rows_runs:
            reports.append(_build_one(store, group, rows_runs, rules, answers_of, cross_gpu_reference, seed,
                                      history, price))
        elif batched := throughput(group, history, price):
            reports.append(_batched_only(group, batched, price))
    reports.sort(key=lambda r: (r.cpu, r.gpu, str(r.model_id), str(r.suite_id)))
    reports.adjust()
    return reports


def row_labels(runs: list[StoredRun]) -> list[str]:
    """A row's name: its variant (`int4`); where two rows share one, with the implementation (`bf16
    (transformers)`, `bf16 (quantbench engine)`); where those are shared too (history), the whole kernel path;
    where that is too (one kernel over two checkpoints: RTN in memory and auto-round's), the weight format."""
    refinements = (lambda r: _short(implementation(r.kernel_path)), lambda r: r.kernel_path,
                   lambda r: f"{r.kernel_path}; {r.weight_format}")
    labels = [str(r.variant or r.backend) for r in runs]
    for detail in refinements:
        labels = [f"{str(r.variant or r.backend)} ({detail(r)})" if labels.count(label) > 1 else label
                  for r, label in zip(runs, labels, strict=True)]
    return labels


def _build_one(store, group, rows_runs, rules, answers_of, cross_gpu_reference, seed, history,
               price=None) -> GpuReport:
    first = rows_runs[0]
    cpu = first.is_cpu
    groups = repeats.by_group(group)
    rows = [Row(run, label, cpu, *_memory(run), efficiency=efficiency.of_run(run, price),
                repeats=groups.get(str(run.repeat_id)) if run.repeat_id else None,
                busy=conditions.busy_note(run))
            for run, label in zip(rows_runs, row_labels(rows_runs), strict=True)]
    for row in rows:
        if not cpu and row.ok:
            row.floors = conditions.floors(row.run, row.weights_bytes, row.p50, row.efficiency.j_per_decision)
    synthetic = any(r.ok for r in rows) and all(r.run.weights == "synthetic" for r in rows if r.ok)
    ok_runs = [r for r in group if r.status == "ok"]
    refs = [r for r in ok_runs if r.backend == "bf16" and (r.role or "candidate") != "noise_floor"
            and r.forward_batch == 1]
    reference = max(refs, key=parity.reference_rank, default=None)
    notes: list[str] = []
    if reference is None and cross_gpu_reference and ok_runs and not synthetic:
        reference = parity.find_reference(store, ok_runs[-1], any_gpu=True)
        if reference is not None:
            notes.append(f"† agreement and accuracy are measured against BF16 on {parity.gpu_label(reference)} "
                         f"(run {reference.run_id[:13]}): no successful BF16 run on this machine")
    floor = None
    if reference is not None and not synthetic:
        floor_run = parity.find_noise_floor(store, reference)
        if floor_run is not None:
            try:
                floor = parity.floor_stats(reference, answers_of(reference), floor_run, answers_of(floor_run), seed)
            except ParityError as e:
                notes.append(f"noise floor run {floor_run.run_id[:13]} not used: {e}")
    for row in rows:
        _fill_quality(row, reference, floor, answers_of, seed, rules.margins)
    ref_acc = None
    if reference is not None and not synthetic:
        by_bench = an.accuracy_by_benchmark(answers_of(reference))
        ref_acc = float(by_bench["accuracy"].mean()) if len(by_bench) else None
    counts = parity.modality_counts(answers_of(reference)) if reference is not None and not synthetic else {}
    report = GpuReport(
        modality_counts=counts, gpu=parity.gpu_label(first), gpu_family=first.gpu_family, cpu=cpu,
        gpu_key=parity.gpu_key(first), synthetic=synthetic,
        model_id=first.model_id, suite_id=next((r.suite_id for r in group if r.suite_id), None),
        suite_hash=next((r.suite_hash for r in group if r.suite_hash), None),
        rows=rows, reference=reference, floor=floor, recommended=None, rule="", reference_accuracy=ref_acc,
        notes=notes + pairing_notes(rows), throughput=throughput(group, history, price), price_per_gpu_hour=price,
    )
    _recommend(report, rules, synthetic)
    return report


def _batched_only(group: list[StoredRun], batched: list[dict[str, Any]], price: float | None) -> GpuReport:
    """The report of a group without a batch-1 run to make rows of: its throughput table, and a note saying why
    there is nothing else (its runs timed whole passes, never one decision; parity is judged at batch 1)."""
    first = group[0]
    synthetic = all(r.weights == "synthetic" for r in group if r.status == "ok")
    return GpuReport(
        gpu=parity.gpu_label(first), gpu_family=first.gpu_family, cpu=first.is_cpu, gpu_key=parity.gpu_key(first),
        model_id=first.model_id, suite_id=next((r.suite_id for r in group if r.suite_id), None),
        suite_hash=next((r.suite_hash for r in group if r.suite_hash), None), rows=[], reference=None, floor=None,
        recommended=None, rule=BATCHED_ONLY_RULE, throughput=batched, price_per_gpu_hour=price, synthetic=synthetic,
        no_table_note=batched_only_note(group, batched, synthetic))


def batched_only_note(group: list[StoredRun], batched: list[dict[str, Any]], synthetic: bool) -> str:
    """`only batched runs (16 and 32 decisions a pass) in this group: run it at batch 1 for ...`."""
    sizes = [str(b) for b in sorted({t["batch"] for t in batched})]
    per_pass = " and ".join([", ".join(sizes[:-1]), sizes[-1]] if len(sizes) > 1 else sizes)
    floors = " and noise-floor runs" if any(r.forward_batch == 1 and r.role == "noise_floor" for r in group) else ""
    what = "per-decision latency (its synthetic weights give no parity)" if synthetic else \
        "per-decision latency and parity"
    return f"only batched runs ({per_pass} decisions a pass){floors} in this group: run it at batch 1 for {what}"


def _fill_quality(row: Row, reference, floor, answers_of, seed, margins: Margins | None = None) -> None:
    run = row.run
    if not row.ok:
        row.quality = f"failed ({run.failure or 'error'})"
    elif run.weights == "synthetic":
        row.quality = SYNTHETIC_NOTE
    elif reference is None:
        row.quality = "no BF16 reference"
    elif run.run_id == reference.run_id:
        row.quality = "reference"
    else:
        try:
            row.comparison = parity.compare_loaded(run, answers_of(run), reference, answers_of(reference), floor,
                                                   seed=seed, margins=margins)
        except ParityError as e:
            row.quality = f"not comparable ({str(e).split(':')[0]})"  # the cause; `quantbench compare` says more


def quality_exclusions(r: Row, rules: Rules) -> list[str]:
    """Why a successful row fails the quality rule (empty: it passes): agreement with BF16 under the minimum,
    `worse` than the noise floor beyond the margin overall or on any one modality's questions, or an overall
    verdict that is inconclusive (equivalence not shown: recommending it would claim what its questions cannot
    tell). The reference passes; a row without parity figures cannot."""
    if r.is_reference:
        return []
    c = r.comparison
    if c is None:
        return [r.quality or "no parity figures"]
    out = []
    if c.agreement.rate < rules.min_agreement:
        out.append(f"agreement {c.agreement.rate:.1%} < {rules.min_agreement:.1%}")
    worse_on = [m.modality for m in c.flagged()] if c.per_modality else []
    if rules.use_noise_floor and (c.verdict.label == an.WORSE or worse_on):
        # each modality is judged: a tower broken on pictures must not hide among text questions
        out.append("worse than the noise floor by more than the margin"
                   + (f" on {', '.join(worse_on)} decisions" if worse_on else ""))
    elif rules.use_noise_floor and c.verdict.label == an.INCONCLUSIVE:
        out.append(f"not shown within the margin: inconclusive ({c.verdict.need_text()})")
    return out


def _recommend(report: GpuReport, rules: Rules, synthetic: bool) -> None:
    ok = [r for r in report.rows if r.ok]
    fastest = min((r for r in ok if r.p50 is not None), key=lambda r: r.p50, default=None)
    smallest = min((r for r in ok if r.weights_bytes is not None), key=lambda r: r.weights_bytes, default=None)
    for r in report.rows:
        if not r.ok:
            r.excluded.append(f"failed here ({r.run.failure or 'error'})")
            continue
        if synthetic:
            continue
        r.excluded += quality_exclusions(r, rules)
        if rules.vram_budget_gib is not None:
            if r.peak_bytes is None:
                r.excluded.append("peak memory unknown")
            elif r.peak_bytes > rules.vram_budget_gib * GIB:
                r.excluded.append(f"peak {r.peak_bytes / GIB:.1f} GiB over the {rules.vram_budget_gib:g} GiB budget")
    passing = [r for r in ok if not r.excluded]
    if rules.prefer_native and any(r.run.native != "emulated" for r in passing):
        for r in passing:
            if r.run.native == "emulated":
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
        if rules.use_noise_floor and pick.comparison is not None and pick.comparison.verdict.label == an.NO_FLOOR:
            # "shown within the margin over the noise floor" claimed of a pick no floor judged: say what it was
            # picked on
            report.rule += (" (no noise-floor run here: it was judged on its agreement with BF16 alone; "
                            "`quantbench run --noise-floor` makes one)")

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
        if r.ok and r.run.native == "native" and not r.cpu:
            facts.append(f"native on {r.run.gpu_family}")
        facts += r.excluded
        r.best_for = "; ".join(facts) or "passes the rules"
