"""The declared run record: what one run stores, as typed models, one field per column.

The child measures and fills a `Measured` (machine, suite, variant, lineage, memory and energy facts, the timings,
the kernel path it ran); the parent adds what identifies the run (`RunIdentity`) and `RunRecord.compose` makes the
`runs` row. `AnswerRow` and `LatencyRow` are the rows of the two other tables. The store inserts `model_dump()`
and refuses a record whose fields are not exactly its table's columns, so a key spelt wrong is an error at
write, never a silent NULL. Every model forbids unknown fields.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
import uuid
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass

FORBID = ConfigDict(extra="forbid")


def uuid7() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits. Sorts by creation time; unique across
    machines, so stores merge without collisions."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80 | rand & ((1 << 80) - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


class _Part(BaseModel):
    model_config = FORBID


class MachineFacts(_Part):
    """`quantbench.run.machine.Machine.as_row()`: the machine a run ran on."""

    device: str
    gpu_name: str | None
    gpu_family: str
    gpu_uuid: str | None
    gpu_cc: str | None
    gpu_sm_count: int | None
    gpu_memory_bytes: int | None
    driver_version: str | None
    cuda_version: str | None
    host: str
    cpu_model: str
    host_memory_bytes: int
    os: str
    python_version: str
    cpu_cores: int | None = None  # logical CPUs (what torch's threads see)
    machine_id: str | None = None  # sha256 of /etc/machine-id, 16 hex digits: two hosts named alike stay apart


class LoadFacts(_Part):
    """`quantbench.run.machine.LoadProbe`: how busy the machine was during the timed phase (None: not readable)."""

    load_avg_1m: float | None
    cpu_steal_share: float | None  # /proc/stat steal over the phase, of all CPU time
    cpu_others_share: float | None  # CPU time of every other process over the phase, of all CPU time


class Provenance(_Part):
    """The versions of the code that made a run (`quantbench.run.runner.provenance()`)."""

    torch_version: str | None
    transformers_version: str | None
    auto_round_version: str | None
    modelopt_version: str | None
    quantbench_version: str | None
    quantbench_git_rev: str | None


class SuiteFacts(_Part):
    suite_id: str
    suite_hash: str
    n_records: int
    n_questions: int

    @classmethod
    def of(cls, suite: Any, limit: int | None) -> SuiteFacts:
        """A suite's facts (quantbench.protocol.suite.Suite) as a run with `--limit` answers it."""
        records = suite.first(limit)
        return cls(suite_id=suite.id, suite_hash=suite.hash, n_records=len(records),
                   n_questions=sum(len(r.request.questions) for r in records))


@dataclass(config=FORBID)
class VariantInfo:
    """What was loaded, as recorded on the run row. A (validated) dataclass: the server reports it with asdict."""

    variant: str  # e.g. bf16, int4, nvfp4-packed, nvfp4-unpacked, fp8, http
    weight_format: str  # e.g. "bf16", "int4 w4a16 g128 sym (auto_round:auto_gptq)", "nvfp4 w4a4 g16 (modelopt)"
    kernel_path: str  # as planned at load, e.g. "transformers grouped_mm", "quantbench grouped-moe triton-fused-int4"
    compute_dtype: str
    model_id: str  # a name a person recognises
    model_path: str | None = None
    model_hash: str | None = None  # content hash of the checkpoint (see quantbench.models.checkpoint.fingerprint)
    model_revision: str | None = None
    weights: str = "trained"  # trained | synthetic (random weights: speed and memory only) | checkpoint
    native: str | None = None  # native | emulated | None (not a low-precision format)
    disk_bytes: int | None = None
    experts_bytes: int | None = None  # bytes the MoE expert weights take in memory, measured from the tensors
    tokenizer_hash: str | None = None
    load_note: str = ""  # e.g. "built in memory from the seed; load time is not a disk load"
    extra: dict[str, Any] = field(default_factory=dict)

    def columns(self) -> dict[str, Any]:
        """The run columns it fills (`load_note` and `extra` go into the run's `extra`)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("extra", "load_note")}


class LineageFacts(_Part):
    """`quantbench.models.lineage.evidence()`: what the run's BF16 base is and how that is known."""

    base_model: str | None
    base_model_how: str | None
    shared_tensors_hash: str | None


class MemoryFacts(_Part):
    """`quantbench.run.memory.MemoryTracker.finish()`; on a CPU host every GPU figure is None (NULL), never 0."""

    mem_weights_bytes: int | None
    mem_peak_allocated_bytes: int | None
    mem_peak_reserved_bytes: int | None
    mem_nvml_peak_bytes: int | None
    host_rss_peak_bytes: int | None
    host_rss_peak_source: str | None = None  # vmhwm | sampled: this process's own peak, never one inherited


class EnergyFacts(_Part):
    """`quantbench.run.energy.EnergyMeter.figures`: GPU energy over the timed phase; None (NULL) where not measured
    (a CPU run, a remote server, no counter, a phase too short), with the reason in the run's `extra.energy`."""

    energy_j_per_decision: float | None
    energy_mean_w: float | None
    energy_phase_s: float | None
    energy_decisions: int | None
    energy_idle_w: float | None


class KernelPath(_Part):
    """The run's kernel path, from its parts: `str()` is the text stored in `runs.kernel_path`.

    `base` is the backend's label before its experts path, `experts` what quantbench's grouped-MoE layers ran
    (None: no such layers), `detail` what the backend's label says after it (", float32 compute"), `fused` the
    decoder ops that ran as quantbench's Triton kernels, `graphs` whether the timed forwards were CUDA graph
    replays: "all", "partly" (some ran eagerly) or None (none were, or not a GPU run)."""

    base: str
    experts: str | None = None
    detail: str = ""
    fused: str | None = None
    graphs: Literal["all", "partly"] | None = None

    @classmethod
    def planned(cls, label: str, experts: str) -> KernelPath:
        """The path of a backend's `label` (VariantInfo.kernel_path), whose experts part is `experts` (what the
        grouped-MoE layers planned at load; "" when the model has none)."""
        if experts and (label == experts or f" {experts}" in label):
            head, _, detail = label.partition(experts)
            return cls(base=head.removesuffix(" "), experts=experts, detail=detail)
        return cls(base=label)

    def __str__(self) -> str:
        parts = [p for p in (self.base, self.experts) if p]
        text = " ".join(parts) + self.detail
        if self.fused:
            text += f" +fused {self.fused}"
        if self.graphs == "all":
            text += " +cuda-graph"
        elif self.graphs == "partly":
            text += " +cuda-graph (partly eager)"
        return text


class Measured(_Part):
    """What the child process writes: each part as soon as it is known, so a failed run keeps what it learnt."""

    machine: MachineFacts | None = None
    device: str | None = None
    suite: SuiteFacts | None = None
    variant: VariantInfo | None = None
    load_s: float | None = None
    model_tensor_bytes: int | None = None
    lineage: LineageFacts | None = None
    cold_ms: float | None = None
    tokenizer_hash: str | None = None  # sha256 of the token ids of every suite prompt (None: not seen)
    kernel_path: str | None = None  # str(KernelPath) of what ran
    extra: dict[str, Any] | None = None
    memory: MemoryFacts | None = None
    energy: EnergyFacts | None = None
    load: LoadFacts | None = None


class RunIdentity(_Part):
    """What the parent knows of a run: who asked for what, when, and how it ended."""

    run_id: str | uuid.UUID
    status: Literal["ok", "failed"]
    failure: str | None = None
    error: str | None = None
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    backend: str
    role: str | None = None
    gpu_requested: str | None = None
    spec: dict[str, Any] | None = None
    spec_hash: str | None = None
    repeat_id: str | None = None  # `run --repeat N`: one id for the N runs, each in a fresh process
    repeat_index: int | None = None  # 1 … repeat_count
    repeat_count: int | None = None


class RunRecord(_Part):
    """One row of `runs`: one field per column (the store checks that they are the same set)."""

    run_id: str | uuid.UUID = Field(default_factory=lambda: str(uuid7()))
    status: str
    failure: str | None = None
    error: str | None = None
    created_at: dt.datetime | str  # a timestamp, or its text (DuckDB casts it on insert)
    finished_at: dt.datetime | str | None = None
    backend: str
    variant: str | None = None
    weight_format: str | None = None
    kernel_path: str | None = None
    compute_dtype: str | None = None
    native: str | None = None
    model_id: str | None = None
    model_path: str | None = None
    model_hash: str | None = None
    model_revision: str | None = None
    weights: str | None = None
    tokenizer_hash: str | None = None
    suite_id: str | None = None
    suite_hash: str | None = None
    n_records: int | None = None
    n_questions: int | None = None
    device: str | None = None
    gpu_name: str | None = None
    gpu_family: str | None = None
    gpu_uuid: str | None = None
    gpu_cc: str | None = None
    gpu_sm_count: int | None = None
    gpu_memory_bytes: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    host: str | None = None
    cpu_model: str | None = None
    host_memory_bytes: int | None = None
    os: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    auto_round_version: str | None = None
    modelopt_version: str | None = None
    quantbench_version: str | None = None
    quantbench_git_rev: str | None = None
    load_s: float | None = None
    cold_ms: float | None = None
    mem_weights_bytes: int | None = None
    mem_peak_allocated_bytes: int | None = None
    mem_peak_reserved_bytes: int | None = None
    mem_nvml_peak_bytes: int | None = None
    host_rss_peak_bytes: int | None = None
    experts_bytes: int | None = None
    disk_bytes: int | None = None
    spec: dict[str, Any] | str | None = None  # the RunSpec (JSON), api_key masked
    spec_hash: str | None = None
    extra: dict[str, Any] | str | None = None  # JSON
    role: str | None = None
    gpu_requested: str | None = None
    model_tensor_bytes: int | None = None
    base_model: str | None = None
    base_model_how: str | None = None
    shared_tensors_hash: str | None = None
    energy_j_per_decision: float | None = None
    energy_mean_w: float | None = None
    energy_phase_s: float | None = None
    energy_decisions: int | None = None
    energy_idle_w: float | None = None
    host_rss_peak_source: str | None = None
    cpu_cores: int | None = None
    machine_id: str | None = None
    load_avg_1m: float | None = None
    cpu_steal_share: float | None = None
    cpu_others_share: float | None = None
    repeat_id: str | None = None
    repeat_index: int | None = None
    repeat_count: int | None = None

    @classmethod
    def compose(cls, identity: RunIdentity, machine: MachineFacts, provenance: Provenance, measured: Measured,
                notes: dict[str, Any] | None = None) -> RunRecord:
        """The row of one run. The child's machine facts (it saw the GPU through torch) win over the parent's;
        `notes` (what the parent found before spawning) are added to the run's `extra`."""
        m = measured
        row: dict[str, Any] = {**(m.machine or machine).model_dump(), **provenance.model_dump()}
        for part in (m.suite, m.lineage, m.memory, m.energy, m.load):
            if part is not None:
                row.update(part.model_dump())
        if m.variant is not None:
            row.update(m.variant.columns())
        scalars = {"device": m.device, "load_s": m.load_s, "model_tensor_bytes": m.model_tensor_bytes,
                   "cold_ms": m.cold_ms, "tokenizer_hash": m.tokenizer_hash, "kernel_path": m.kernel_path}
        row.update({k: v for k, v in scalars.items() if v is not None})
        extra = m.extra
        if notes:
            extra = {**(extra or {}), **notes}
        return cls(**row, **identity.model_dump(), extra=extra)


class AnswerRow(_Part):
    """One row of `answers`: a question's answer. Every field is given; `run_id` is set when it is stored."""

    run_id: str | uuid.UUID | None = None
    record_id: str
    benchmark: str | None
    question: str
    options: list[str]
    probs: list[float]
    top: str
    gold: str | None
    method: str
    truncated: bool
    # quantbench.protocol.modality_of(record): the child always gives it; the default keeps text-only rows made
    # by hand (tests, older tools) valid, as the schema-7 migration reads every earlier row.
    modality: Literal["text", "image", "audio", "video", "mixed"] = "text"
    # p(top) − p(second) of this answer (p(top) with one option): filled from `probs` when not given, so every
    # stored answer carries it (flips are split by the reference's margin: quantbench.analysis.significance)
    margin: float | None = None

    @model_validator(mode="after")
    def _margin_from_probs(self) -> AnswerRow:
        if self.margin is None and self.probs:
            ordered = sorted(self.probs, reverse=True)
            self.margin = ordered[0] - (ordered[1] if len(ordered) > 1 else 0.0)
        return self


class LatencyRow(_Part):
    """One row of `latencies`: one timed decision. `run_id` is set when it is stored."""

    run_id: str | uuid.UUID | None = None
    seq: int
    phase: Literal["suite", "latency"]
    record_id: str
    model_ms: float
    prep_ms: float
    tokens: int
    batch: int


def progress_file(result_path: Path) -> Path:
    """Where the child saves its `Measured` so far (quantbench.run.child.save_progress), beside its result file."""
    return result_path.with_suffix(".progress")


def result_files(result_path: Path) -> tuple[Path, Path]:
    """Where the child writes its result: `result_path` in the run's temporary folder, else (that disk full or
    read-only) a file named after the folder in the cache, on another disk more often than not."""
    from quantbench.paths import cache_dir

    return result_path, cache_dir() / "results" / f"{result_path.parent.name}.json"


@dataclass
class RunResult:
    """One run's rows, made by the runner (or a remote task) and written by the store in one transaction. Rows
    given as dicts are validated into their models here."""

    run: RunRecord
    answers: list[AnswerRow] = field(default_factory=list)
    latencies: list[LatencyRow] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.run.run_id)
