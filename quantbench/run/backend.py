"""The one protocol every backend implements. It knows no backend: each backend module owns its loading.

A backend is a class registered as an entry point in the group `quantbench.backends` (see pyproject.toml).
The runner calls, inside a fresh child process:

    backend = get_backend("int4")
    loaded = backend.load(spec, machine)         # -> LoadedVariant(engine, info)
    prepared = loaded.engine.prepare(request)    # tokenization: timed apart
    answers = loaded.engine.forward(prepared)    # the model: what the latency figures time

Local backends return a `quantbench.engine.scoring.TransformersEngine`, so every variant answers through the same code.
The engine protocol (`DecisionEngine`, with its optional features) is quantbench.engine.base's; `VariantInfo`, what
was loaded, is part of the run record (quantbench.run.record).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Protocol

from quantbench.engine.base import DecisionEngine
from quantbench.errors import ConfigError
from quantbench.run.record import VariantInfo
from quantbench.run.spec import ENTRY_POINT_GROUP, BackendOptions, RunSpec, backend_class

EMBEDDED_MODEL = "embedded"  # a backend's `default_model`: the embedded default model itself, in BF16


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
    # What `quantbench.run.resolve` prepares, in the parent, for a spec with neither --model nor --shape:
    # EMBEDDED_MODEL, a `quantbench quantize --scheme` of its variant ("int4"), or None (nothing local: http)
    default_model: ClassVar[str | None]
    # What sets a backend apart is declared, and the code that cares asks the declaration (quantbench.run.spec.
    # is_remote), never the backend's name. `remote = True` (default False): it answers through a server at its
    # `endpoint` (an option its Options declare), so it loads no local weights: no --model to resolve or check, no
    # checkpoint scorer to trust, a sweep variant of it needs `endpoint` and names the one model its server serves,
    # and `serve` has nothing to serve with it (its options are not `serve` flags).
    remote: ClassVar[bool]

    def availability(self, machine: Any) -> Availability: ...

    def load(self, spec: RunSpec, machine: Any) -> LoadedVariant: ...

    # Optional: `check(self, spec, machine) -> None`, run in the parent before any child starts (quantbench.run.checks):
    # refuse, in well under a second and without heavy imports, a setting this backend cannot take (ConfigError
    # naming the flag). The http backend checks its --endpoint there.


def backend_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def get_backend(name: str) -> Backend:
    """An installed backend by entry-point name, or any class by import path (`package.module:Class`)."""
    return backend_class(name)()


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
