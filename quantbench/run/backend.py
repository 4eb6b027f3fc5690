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

from dataclasses import asdict, dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from quantbench.errors import ConfigError
from quantbench.limits import DEFAULT_MAX_OPTIONS
from quantbench.protocol import QuestionAnswer

ENTRY_POINT_GROUP = "quantbench.backends"
EMBEDDED_MODEL = "embedded"  # a backend's `default_model`: the embedded default model itself, in BF16


@dataclass
class RunSpec:
    """Everything that defines one run. Serialised to JSON for the child process; hashed for sweeps."""

    backend: str
    model: str | None = None  # checkpoint dir; None = the embedded default model (or its variant for this backend)
    suite: str | None = None  # JSONL path; None = the built-in suite
    gpu: str = "auto"  # auto | cpu | a family (ampere, ada, hopper, blackwell) | a GPU name substring
    device: str | None = None  # torch device; None = cuda:0 when there is a GPU, else cpu
    dtype: str = "bfloat16"  # compute dtype (float32 only when asked, e.g. for exact CPU comparisons)
    experts_impl: str = "grouped_mm"  # transformers experts implementation for BF16 (grouped_mm | eager | ...)
    fast_moe: bool = True  # int4 / nvfp4 / fp8: quantbench's grouped-MoE engine (False = the library's own path)
    nvfp4_mode: str = "packed"  # packed | unpacked
    nvfp4_activations: str = "on"  # on | off: emulate NVFP4 activation quantization (the A4 of W4A4)
    endpoint: str | None = None  # http backend: base URL of a SystemOne server
    concurrency: int = 1  # http backend: requests in flight
    api_key: str | None = None  # http backend
    base_model: str | None = None  # the BF16 model this variant was made from (model id; `run --base-model`)
    shape: str | None = None  # synthetic real-shape model (e.g. "qwen3-30b-a3b") instead of the fixture
    layers: int | None = None  # synthetic shape: override the layer count (smaller speed runs)
    role: str = "candidate"  # candidate | reference | noise_floor
    trust_remote_code: bool = False
    max_options: int = DEFAULT_MAX_OPTIONS  # quantbench.limits
    max_tokens: int | None = None
    truncate: bool = False
    method: str = "auto"  # auto | continuation
    cuda_graph: str = "auto"  # auto: replay the decision forward from CUDA graphs where it can be | off
    fused_ops: str = "auto"  # auto: RMSNorm and rotary as one Triton kernel each, q/k/v as one GEMM, on a GPU (quantbench.engine.fused.ops) | off
    warmup: int = 3
    latency_min_decisions: int = 20
    latency_min_seconds: float = 2.0
    limit: int | None = None  # answer only the first N records of the suite
    timeout_s: float = 1800.0
    seed: int = 0
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown run setting(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


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
    # What `quantbench.run.resolve` prepares, in the parent, for a spec with neither --model nor --shape:
    # EMBEDDED_MODEL, a `quantbench quantize --scheme` of its variant ("int4"), or None (nothing local: http)
    default_model: str | None

    def availability(self, machine: Any) -> Availability: ...

    def load(self, spec: RunSpec, machine: Any) -> LoadedVariant: ...


def backend_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_backend(name: str) -> Backend:
    """An installed backend by entry-point name, or any class by import path (`package.module:Class`)."""
    if ":" in name:
        module, _, cls = name.partition(":")
        try:
            return getattr(import_module(module), cls)()
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"--backend {name!r}: cannot import it ({e}); give `package.module:Class`") from e
    eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in eps:
        raise ConfigError(
            f"--backend {name!r} is not installed; installed backends: {', '.join(sorted(eps)) or 'none'} "
            "(is quantbench installed with `pip install -e .`?)"
        )
    return eps[name].load()()


def model_dir(spec: RunSpec) -> Path:
    """The checkpoint directory a backend's `load()` loads. Only the parent prepares (quantbench.run.resolve):
    a load that trained or quantized would be timed as loading."""
    if not spec.model:
        raise ConfigError(f"--backend {spec.backend}: this spec names neither --model nor --shape; resolve it first "
                          "(quantbench.run.resolve.resolve prepares the embedded model or its variant in the parent)")
    return Path(spec.model)


def dir_bytes(path: str | Path) -> int:
    """Size on disk of a checkpoint directory (all files)."""
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
