"""Planning a sweep: the matrix expanded into runs, the variants to make first, and what is already done.

`plan` lists every run in order (models × variants × suites × GPUs × repeats), each a RunSpec for
`runner.execute`. A quantized variant that a run needs and that may not exist yet (a checkpoint model's under
variants_dir, or the fixture's cached one) becomes a `Make` (a `quantbench quantize` job) on that run; the driver
makes each one once, before the runs. A noise-floor variant that names no kernel gets `run --noise-floor`'s, chosen
on the machine that runs it (`PlannedRun.spec_on`). `split_finished` skips a run whose config hash
(`runner.spec_hash`) is already stored with status ok, unless --rerun (failed runs run again), and gives the runs of
a cell that are left one repeat group, as `run --repeat N` does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from quantbench.errors import ConfigError
from quantbench.models.lineage import base_model_id
from quantbench.run.spec import NOISE_FLOOR_SETTINGS, RunSpec, as_noise_floor, options_class
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
    repeats: int = 1  # runs of this configuration the sweep asks for
    # A noise floor that names no kernel: the second kernel is `run --noise-floor`'s for the machine that runs it
    # (eager experts on a GPU, float32 on a CPU), which only that machine knows (a Ray task may land on either).
    floor_kernel_here: bool = False
    # (repeat_id, index from 1, count), as `run --repeat N` tags its runs; set by split_finished when repeats > 1
    repeat_tag: tuple[str, int, int] | None = None

    @property
    def label(self) -> str:
        gpu = "" if self.spec.gpu == "auto" else f" · {self.spec.gpu}"
        return f"{self.variant} · {self.model} · {self.suite}{gpu}" + (f" #{self.repeat + 1}" if self.repeat else "")

    def config_key(self) -> str:
        key = {k: v for k, v in self.spec.to_dict().items() if k != "notes"}
        if self.floor_kernel_here:  # not the default kernel it plans with: the one each machine will choose
            key["noise_floor_kernel"] = "per machine"
        return json.dumps(key, sort_keys=True, default=str)

    def claim_key(self) -> str:
        """This run among every sweep's runs of one store (quantbench.sweep.claims): its configuration and repeat."""
        return hashlib.sha256(f"{self.config_key()}#{self.repeat}".encode()).hexdigest()[:24]

    def spec_on(self, machine: Any) -> RunSpec:
        """The spec as it runs on `machine` (anything with `has_gpu`): a noise floor that names no kernel gets
        that machine's second kernel."""
        return as_noise_floor(self.spec, machine.has_gpu) if self.floor_kernel_here else self.spec


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
                                       Path(suite).stem if suite else "builtin", 0, make, sweep.repeats,
                                       _floor_kernel_here(variant.backend, settings))
                    key = first.config_key()
                    if key in seen:
                        raise ConfigError(f"{sweep.path}: variants: {variant.label!r} and {seen[key]!r} are the same "
                                          f"run on model {model.name!r}; remove one (use repeats to run it again)")
                    seen[key] = variant.label
                    runs.append(first)
                    runs += [replace(first, spec=RunSpec(**base), repeat=r) for r in range(1, sweep.repeats)]
    return runs


def _floor_kernel_here(backend: str, settings: dict[str, Any]) -> bool:
    """A noise-floor variant (of a backend with a selectable experts kernel) that names neither its kernel nor its
    dtype, here or in [defaults]: its second kernel is chosen on the machine that runs it. Named ones are kept."""
    if settings.get("role") != "noise_floor" or any(k in settings for k in NOISE_FLOOR_SETTINGS):
        return False
    try:
        return "experts_impl" in options_class(backend).model_fields
    except ConfigError:
        return False


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


def split_finished(runs: list[PlannedRun], store: Store, accepts: Accepts, rerun: bool = False,
                   since: dt.datetime | None = None) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(to run, already finished). A stored ok run counts when its spec_hash is this run's hash on the machine
    that stored it and the executor accepts that machine for this run; `repeats` wants that many of them; with
    `since`, only runs finished since then count. Each run to run gets its repeat tag (`tag_repeats`)."""
    done = {} if rerun or not store.path.exists() else _finished_rows(runs, store, accepts, since)
    todo, skipped = [], []
    for run in runs:
        (skipped if run.repeat < len(done.get(run.config_key(), ())) else todo).append(run)
    tag_repeats(todo, done)
    return todo, skipped


def _finished_rows(runs: list[PlannedRun], store: Store, accepts: Accepts,
                   since: dt.datetime | None) -> dict[str, list[dict[str, Any]]]:
    """The stored ok runs that finish each configuration of `runs` (by config_key)."""
    from quantbench.run.runner import spec_hash

    rows = queries.ok_spec_hashes(store, since).to_dict("records")
    for row in rows:
        row["gpu_name"], row["gpu_family"], row["host"] = (text_or_none(row[k]) for k in ("gpu_name", "gpu_family", "host"))
    done: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        key = run.config_key()
        if key in done:
            continue
        hashes: dict[tuple, str] = {}
        for row in rows:
            ident = (row["gpu_name"], row["host"])
            if ident not in hashes:  # the hash of the spec as it ran there (a noise floor's kernel is per machine)
                machine = SimpleNamespace(gpu_name=ident[0], host=ident[1], has_gpu=ident[0] is not None)
                hashes[ident] = spec_hash(run.spec_on(machine), machine)
        done[key] = [row for row in rows if row["spec_hash"] == hashes[(row["gpu_name"], row["host"])]
                     and accepts(run, row)]
    return done


def tag_repeats(todo: list[PlannedRun], done: dict[str, list[dict[str, Any]]]) -> None:
    """Tag the runs left of each configuration asked for more than once as one repeat group, as `run --repeat N`
    tags its N runs, so the report shows them as one (p50 and J ± a t interval). A sweep that was stopped and is
    run again continues the group its finished runs began, its runs taking the indices those left free; a new group
    otherwise."""
    from quantbench.run.record import uuid7

    groups: dict[str, tuple[str, list[int]]] = {}  # configuration -> (its group, the indices still free in it)
    for run in todo:
        if run.repeats < 2:
            continue
        key = run.config_key()
        if key not in groups:
            rows = done.get(key, [])
            begun = _group_begun(rows, run.repeats)
            # indices the finished runs hold are taken (1 and 3 finished, 2 failed: the next run is 2, not 3)
            used = {r.get("repeat_index") for r in rows}
            free = [i for i in range(1, run.repeats + 1) if i not in used] if begun else []
            groups[key] = (begun or str(uuid7()), free)
        group, free = groups[key]
        run.repeat_tag = (group, free.pop(0) if free else run.repeat + 1, run.repeats)


def _group_begun(rows: list[dict[str, Any]], count: int) -> str | None:
    """The repeat group the finished runs of a configuration all belong to, when it is one of `count` runs."""
    ids = {text_or_none(r.get("repeat_id")) for r in rows}
    if len(ids) != 1 or None in ids or any(r.get("repeat_count") != count for r in rows):
        return None
    return ids.pop()
