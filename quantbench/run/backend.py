"""The one protocol every backend implements. It knows no backend: each backend module owns its loading.

A backend is a class registered as an entry point in the group `quantbench.backends` (see pyproject.toml).
The runner calls, inside a fresh child process:

    backend = get_backend("int4")
    loaded = backend.load(spec, machine)         # -> LoadedVariant(engine, info)
    prepared = loaded.engine.prepare(request)    # tokenization: timed apart
    answers = loaded.engine.forward(prepared)    # the model: what the latency figures time

Local backends return a `quantbench.engine.scoring.TransformersEngine`, so every variant answers through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from quantbench.protocol import QuestionAnswer
from quantbench.run.spec import ENTRY_POINT_GROUP, BackendOptions, RunSpec, backend_class


@dataclass
class VariantInfo:
    """What was loaded, as recorded on the run row."""

    variant: str  # e.g. bf16, int4, nvfp4-packed, nvfp4-unpacked, fp8, http
    weight_format: str  # e.g. "bf16", "int4 w4a16 g128 sym (auto_round:auto_gptq)", "nvfp4 w4a4 g16 (modelopt)"
    kernel_path: str  # e.g. "transformers grouped_mm", "quantbench grouped-moe triton-fused-int4"
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


@runtime_checkable
class DecisionEngine(Protocol):
    def prepare(self, request: Any) -> Any: ...
    def forward(self, prepared: Any) -> dict[str, QuestionAnswer]: ...
    def forward_many(self, batch: list[Any]) -> list[dict[str, QuestionAnswer]]: ...
    def tokens(self, prepared: Any) -> int: ...
    def synchronize(self) -> None: ...


@dataclass
class LoadedVariant:
    engine: DecisionEngine
    info: VariantInfo
    model: Any = None  # the torch module, when there is one (memory figures, kernels)


@dataclass
class Availability:
    """What `quantbench backends` prints for a backend on this machine."""

    available: bool
    native: str | None = None  # native | emulated | None
    detail: str = ""


class Backend(Protocol):
    name: str
    summary: str
    Options: ClassVar[type[BackendOptions]]  # the settings this backend declares (quantbench.run.spec)

    def availability(self, machine: Any) -> Availability: ...

    def load(self, spec: RunSpec, machine: Any) -> LoadedVariant: ...


def backend_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_backend(name: str) -> Backend:
    """An installed backend by entry-point name, or any class by import path (`package.module:Class`)."""
    return backend_class(name)()


def dir_bytes(path: str | Path) -> int:
    """Size on disk of a checkpoint directory (all files)."""
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
