"""A stored run as reads see it: the typed counterpart of the declared write record (quantbench.run.record.RunRecord).

`StoredRun` has one field per column of `runs`, typed as read (JSON columns parsed, the id as text, times as aware
datetimes), and the figures the store derives from the run's other rows, as fields too:
- latency (its timed decisions): `n_timed`, `p50_ms`, `p90_ms`, `p99_ms`, `mean_ms`, `prep_mean_ms`, `mean_tokens`,
  `batch` (the largest batch: decisions per forward pass) and `decisions_per_s` (over its full-size batches);
- accuracy (its answers): `accuracy`, the one accuracy (quantbench.analysis.stats.ACCURACY_NAME: the unweighted mean
  over benchmarks of each benchmark's accuracy on its gold questions), `n_answers`, `n_gold`;
- source: the store it was read from and the bundle that brought it (`store`, `store_kind`, `bundle_id`, `bundle`,
  `bundle_host`, `bundle_published_at`, `pulled_from`, `pulled_at`); None for a run measured into the one store read;
and as properties the figures made from its columns: weights in memory and peak memory with where the peak comes
from, the reason energy was not measured, the source in words.

A run of an older schema (a column its store lacks) or a figure a run did not measure is None, never 0 and never
guessed. quantbench.store.queries builds these, from one relation, for one store or several read as one
(quantbench.store.composite). Three fields are not read but set by quantbench.analysis when it pairs a variant made
elsewhere with its BF16 base (quantbench.models.lineage): `own_model_id`, `paired_by`, `paired_base`.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where a table is made: reading runs does not need it
    import pandas as pd

JSON_COLUMNS = ("spec", "extra")


@dataclass(frozen=True, slots=True)
class StoredRun:
    # -- the columns of `runs` (quantbench.run.record.RunRecord: the same names) ---------------------------------
    run_id: str
    status: str
    created_at: dt.datetime
    backend: str
    failure: str | None = None
    error: str | None = None
    finished_at: dt.datetime | None = None
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
    spec: dict[str, Any] | None = None  # the RunSpec, parsed
    spec_hash: str | None = None
    extra: dict[str, Any] | None = None  # parsed
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
    # -- latency, from its timed decisions ---------------------------------------------------------------------
    n_timed: int | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    prep_mean_ms: float | None = None
    mean_tokens: float | None = None
    batch: int | None = None  # the largest batch it timed: decisions per forward pass
    decisions_per_s: float | None = None  # over its full-size batches
    # -- accuracy, from its answers ----------------------------------------------------------------------------
    n_answers: int | None = None
    n_gold: int | None = None
    accuracy: float | None = None
    # -- source: where it was read from ------------------------------------------------------------------------
    store: str | None = None  # the label of the store it was read from, among several (home.Source.label)
    store_kind: str | None = None  # yours | pulled | shipped | given
    bundle_id: str | None = None
    bundle: str | None = None  # the bundle's name
    bundle_host: str | None = None  # who published it
    bundle_published_at: dt.datetime | None = None
    pulled_from: str | None = None
    pulled_at: dt.datetime | None = None
    # -- set by quantbench.analysis when the run is paired with its BF16 base by lineage, never read -------------
    own_model_id: str | None = None  # the run's own model id, when the pairing gave it its base's
    paired_by: str | None = None  # how it was paired (quantbench.models.lineage.how_text)
    paired_base: str | None = None  # the base the paired candidate named (on a reference found by lineage)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> StoredRun:
        """A record from one row of quantbench.store.queries' relation (column → value as DuckDB gives it)."""
        unknown = set(row) - FIELD_NAMES
        if unknown:
            raise ValueError(f"columns {sorted(unknown)} have no field in StoredRun: add them to "
                             "quantbench/store/records.py (a migration added a column to `runs`?)")
        values = {k: _value(k, v) for k, v in row.items()}
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """Every field, in order (the dashboard's tables, scripts that want a DataFrame)."""
        return asdict(self)

    # -- memory --------------------------------------------------------------------------------------------------
    @property
    def is_cpu(self) -> bool:
        """A run on a CPU: no device memory, and "the same GPU" means the same machine."""
        return self.device == "cpu" or not self.gpu_name

    @property
    def weights_memory_bytes(self) -> int | None:
        """The weights in memory: the device memory the load allocated, or on a CPU every tensor of the model."""
        return self.model_tensor_bytes if self.is_cpu else self.mem_weights_bytes

    @property
    def own_host_rss_peak_bytes(self) -> int | None:
        """The run's own peak host RSS (vmhwm | sampled); None for an older run, whose stored figure (ru_maxrss)
        is the peak of the process that launched it."""
        return self.host_rss_peak_bytes if self.host_rss_peak_source else None

    @property
    def peak_memory(self) -> tuple[int | None, str | None]:
        """(peak bytes, where it comes from): NVML's per-process peak ("nvml"), else torch's peak reserved
        ("torch_reserved"); on a CPU the run's own peak host RSS ("host_rss")."""
        if self.is_cpu:
            peak = self.own_host_rss_peak_bytes
            return peak, "host_rss" if peak is not None else None
        if self.mem_nvml_peak_bytes is not None:
            return self.mem_nvml_peak_bytes, "nvml"
        reserved = self.mem_peak_reserved_bytes
        return reserved, "torch_reserved" if reserved is not None else None

    # -- energy and latency --------------------------------------------------------------------------------------
    @property
    def energy_note(self) -> str | None:
        """Why the run has no energy figure, as its child recorded it (extra.energy.note), or None."""
        note = (self.extra or {}).get("energy")
        return note.get("note") if isinstance(note, dict) else None

    @property
    def forward_batch(self) -> int:
        """Decisions per forward pass: 1 unless the run was timed in batches."""
        return self.batch or 1

    # -- source --------------------------------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """Where the run came from, in a few words: "bundle h200-fixture (published by vm on 2026-12-03)", "your
        store", "shipped with quantbench", or "this store" (one store read, measured into it or merged)."""
        name = self.bundle or self.bundle_id
        if name:
            by, day = self.bundle_host, day_of(self.bundle_published_at)
            detail = " ".join(x for x in (f"published by {by}" if by else None, f"on {day}" if day else None) if x)
            return f"bundle {name}" + (f" ({detail})" if detail else "")
        return str(self.store or "this store")


FIELD_ORDER = tuple(f.name for f in fields(StoredRun))
FIELD_NAMES = frozenset(FIELD_ORDER)
# The columns `quantbench runs --format json|csv` lists, in order: those of the store's `run_summary` view
# (quantbench.store.schema.VIEWS), then where each run came from.
SUMMARY_FIELDS = (
    "run_id", "created_at", "status", "failure", "backend", "variant", "role", "weight_format", "kernel_path",
    "native", "model_id", "weights", "suite_id", "device", "gpu_name", "gpu_family", "host", "n_records",
    "n_questions", "accuracy", "n_gold", "p50_ms", "p90_ms", "p99_ms", "n_timed", "load_s", "cold_ms",
    "mem_weights_bytes", "mem_peak_allocated_bytes", "mem_nvml_peak_bytes", "host_rss_peak_bytes", "experts_bytes",
    "model_tensor_bytes", "disk_bytes")
SOURCE_FIELDS = ("store", "store_kind", "bundle_id", "bundle", "bundle_host", "bundle_published_at", "pulled_from",
                 "pulled_at")


def day_of(value: dt.datetime | str | None) -> str | None:
    """`2026-12-03`, or None."""
    if value is None:
        return None
    return f"{dt.datetime.fromisoformat(value) if isinstance(value, str) else value:%Y-%m-%d}"


def _value(name: str, value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if name in JSON_COLUMNS and isinstance(value, str):
        parsed = json.loads(value)
        return parsed if isinstance(parsed, dict) else None
    return value


def frame(runs: list[StoredRun]) -> pd.DataFrame:
    """The runs as a table, one column per field (integers as nullable Int64, times as timestamps), for the
    dashboard's tables and scripts."""
    import pandas as pd

    df = pd.DataFrame([r.as_dict() for r in runs], columns=list(FIELD_ORDER))
    for f in fields(StoredRun):
        if f.type in ("int | None", "int"):
            df[f.name] = df[f.name].astype("Int64")
        elif f.type in ("dt.datetime | None", "dt.datetime") and df[f.name].dtype == object:  # all None
            df[f.name] = pd.to_datetime(df[f.name])
    return df
