"""Planning a sweep: the matrix expanded into runs, the variants to make first, and what is already done.

`plan` lists every run in order (models × variants × suites × GPUs × repeats), each a RunSpec for
`runner.execute`. A quantized variant that a run needs and that may not exist yet (a checkpoint model's under
variants_dir, or the fixture's cached one) becomes a `Make` (a `quantbench quantize` job) on that run; the driver
makes each one once, before the runs. `split_finished` skips a run whose config hash (`runner.spec_hash`) is
already stored with status ok, unless --rerun (failed runs run again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from quantbench.errors import ConfigError
from quantbench.models.lineage import base_model_id
from quantbench.run.spec import RunSpec
from quantbench.store import Store, queries
from quantbench.sweep.spec import SCHEMES, Model, Sweep, checkpoint_ready, made_variant_dir


@dataclass(frozen=True)
class Make:
    """A quantized checkpoint to make with quantbench quantize before the runs that need it."""

    model: str
    scheme: str
    source: Path | None = None  # None: the embedded default model, whose variants live in quantbench's cache
    out: Path | None = None
    options: tuple[tuple[str, Any], ...] = ()  # the [quantize] recipe (checkpoint models only)


@dataclass
class PlannedRun:
    spec: RunSpec
    model: str
    variant: str
    suite: str
    repeat: int  # 0-based
    make: Make | None = None

    @property
    def label(self) -> str:
        gpu = "" if self.spec.gpu == "auto" else f" · {self.spec.gpu}"
        return f"{self.variant} · {self.model} · {self.suite}{gpu}" + (f" #{self.repeat + 1}" if self.repeat else "")

    def config_key(self) -> str:
        return json.dumps({k: v for k, v in self.spec.to_dict().items() if k != "notes"}, sort_keys=True,
                          default=str)


def plan(sweep: Sweep) -> list[PlannedRun]:
    """Every run of the matrix, in order: models × variants × suites × GPUs × repeats."""
    runs: list[PlannedRun] = []
    seen: dict[str, str] = {}
    for model in sweep.models:
        for variant in sweep.variants:
            if variant.models is not None and model.name not in variant.models:
                continue
            checkpoint, make = _checkpoint(sweep, model, variant.backend)
            for suite in sweep.suites:
                for gpu in sweep.gpus:
                    settings = {**sweep.defaults, **variant.settings}
                    notes = " · ".join(filter(None, [settings.pop("notes", ""), f"sweep {sweep.name}: {variant.label}"]))
                    base = dict(backend=variant.backend, model=checkpoint, suite=suite, gpu=gpu, shape=model.shape,
                                layers=model.layers, trust_remote_code=model.trust_remote_code, notes=notes, **settings)
                    if model.path is not None and checkpoint is not None and checkpoint != str(model.path):
                        base["base_model"] = base_model_id(model.path)  # `int4 = "DIR"`: a variant of this model
                    first = PlannedRun(RunSpec(**base), model.name, variant.label,
                                       Path(suite).stem if suite else "builtin", 0, make)
                    key = first.config_key()
                    if key in seen:
                        raise ConfigError(f"{sweep.path}: variants: {variant.label!r} and {seen[key]!r} are the same "
                                          f"run on model {model.name!r}; remove one (use repeats to run it again)")
                    seen[key] = variant.label
                    runs.append(first)
                    runs += [PlannedRun(RunSpec(**base), first.model, first.variant, first.suite, r, make)
                             for r in range(1, sweep.repeats)]
    return runs


def _checkpoint(sweep: Sweep, model: Model, backend: str) -> tuple[str | None, Make | None]:
    """The `model` a run of this backend gets, and the quantize job that must make it first (if any)."""
    scheme = SCHEMES.get(backend)
    if model.fixture:  # the backend loads the fixture's cached variant; make it once up front, not per run
        return None, Make(model.name, scheme) if scheme else None
    if model.path is None:
        return None, None  # a synthetic shape: the backend builds it (random weights) in the run
    if scheme is None:
        return str(model.path), None
    if scheme in model.made:
        return str(model.made[scheme]), None
    out = made_variant_dir(sweep, model, scheme)
    opts = tuple(sorted(sweep.quantize.items()))
    return str(out), None if checkpoint_ready(out) else Make(model.name, scheme, model.path, out, opts)


# -- what is already done -----------------------------------------------------------------------------------------
Accepts = Callable[[PlannedRun, dict[str, Any]], bool]


def text_or_none(v: Any) -> str | None:
    """A stored text column's value, or None where it is NULL (None or NaN in pandas) or empty."""
    return v if isinstance(v, str) and v else None


def split_finished(runs: list[PlannedRun], store: Store, accepts: Accepts, rerun: bool = False
                   ) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(to run, already finished). A stored ok run counts when its spec_hash is this run's hash on the machine
    that stored it and the executor accepts that machine for this run; `repeats` wants that many of them."""
    from quantbench.run.runner import spec_hash

    if rerun or not store.path.exists():
        return list(runs), []
    rows = queries.ok_spec_hashes(store).to_dict("records")
    for row in rows:
        row["gpu_name"], row["gpu_family"], row["host"] = (text_or_none(row[k]) for k in ("gpu_name", "gpu_family", "host"))
    done: dict[str, int] = {}
    todo, skipped = [], []
    for run in runs:
        key = run.config_key()
        if key not in done:
            hashes: dict[tuple, str] = {}
            n = 0
            for row in rows:
                ident = (row["gpu_name"], row["host"])
                if ident not in hashes:
                    hashes[ident] = spec_hash(run.spec, SimpleNamespace(gpu_name=ident[0], host=ident[1]))
                n += row["spec_hash"] == hashes[ident] and accepts(run, row)
            done[key] = n
        (skipped if run.repeat < done[key] else todo).append(run)
    return todo, skipped
