"""Runs chosen by what they are rather than by id: `quantbench compare int4 --gpu cpu` (the newest int4 run on a
CPU), `quantbench runs --model … --gpu … --variant … --status …`. One filter, so every command reads a selector the
same way."""

from __future__ import annotations

import re
import socket
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantbench.analysis import parity
from quantbench.analysis.recommend import matches_gpu
from quantbench.analysis.stats import ParityError
from quantbench.errors import ConfigError
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun
from quantbench.store.schema import RUN_STATUSES

STATUSES = RUN_STATUSES
RUN_ID = re.compile(r"^[0-9a-f-]{4,36}$")  # may be a run id or a prefix of one (01a22979-8ae4); "bf16" is tried too
ALL = "all"


@dataclass(frozen=True)
class RunFilter:
    """Which runs: each field None for any. `gpu` as `report --gpu` takes it (cpu, a family, part of a GPU's name);
    `variant` a variant (int4, nvfp4-unpacked) or a backend (nvfp4: both of its variants); `model` the model id or
    part of it; `status` ok or failed; `host` the machine's host name. A name that is both names the variant alone
    (`matches`' `variants`): int4 is W4A16's runs, never the int4 backend's int4-w4a8 ones."""

    model: str | None = None
    gpu: str | None = None
    variant: str | None = None
    status: str | None = None
    host: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ConfigError(f"--status {self.status!r}: use ok or failed")

    def describe(self) -> str:
        parts = [f"--{k} {v}" for k, v in (("variant", self.variant), ("model", self.model), ("gpu", self.gpu),
                                            ("status", self.status), ("host", self.host)) if v]
        return " ".join(parts) or "no filter"

    def matches(self, run: StoredRun, variants: Collection[str] = ()) -> bool:
        """Whether `run` passes; `variants`: the variants of the runs being chosen from (variant_names)."""
        if self.status and run.status != self.status:
            return False
        if self.gpu and self.gpu != ALL and not matches_gpu(run, self.gpu):
            return False
        if self.host and str(run.host) != self.host:
            return False
        if self.model and self.model.lower() not in str(run.model_id or "").lower():
            return False
        if self.variant:
            v = self.variant.strip().lower()
            if v != str(run.variant or "").lower() and (v in variants or v != str(run.backend or "").lower()):
                return False
        return True


def variant_names(runs: list[StoredRun]) -> set[str]:
    """The variants `runs` hold, lower-case: a selector among them names that variant, not its backend."""
    return {str(r.variant).lower() for r in runs if r.variant}


def this_machine() -> tuple[str, str | None, str]:
    """(the `--gpu` value of this machine, its host when that value is `cpu`, a label): the GPU NVML sees, else
    this host's CPU."""
    from quantbench.run.machine import detect

    machine = detect()
    if machine.has_gpu:
        return str(machine.gpu_name), None, f"{machine.gpu_name} ({machine.gpu_family})"
    host = socket.gethostname()
    return "cpu", host, f"CPU ({host})"


def summaries(store: Store, run_filter: RunFilter) -> list[StoredRun]:
    """The runs (with their sources) that pass `run_filter`, oldest first."""
    runs = queries.stored_runs(store)
    variants = variant_names(runs)
    return [r for r in runs if run_filter.matches(r, variants)]


def select_run(store: Store, selector: str, run_filter: RunFilter | None = None, prefer_here: bool = True,
               trained_only: bool = True) -> tuple[str, str]:
    """The run `selector` names: a run id (or a unique prefix), else a variant or backend (`int4`, `nvfp4`), the
    newest successful run of it that passes `run_filter` (noise-floor runs only when the selector says
    `noise-floor`), of trained weights when there are any (`trained_only`: a synthetic run has no quality to
    compare). Without a --gpu in the filter, this machine's runs come first when it has any. Returns
    (run id, one line saying which run was chosen and why)."""
    run_filter = run_filter or RunFilter()
    key = selector.strip().lower()
    if RUN_ID.match(key):
        found = queries.runs_by_id_prefix(store, key)
        if len(found) == 1:
            return found[0].run_id, ""
        if len(found) > 1:
            raise ParityError(f"run {selector!r} is ambiguous ({', '.join(r.run_id for r in found)}); give more "
                              "characters of the id")
    floor = key in ("noise-floor", "noise_floor", "floor")
    wanted = RunFilter(model=run_filter.model, gpu=run_filter.gpu, variant=None if floor else key,
                       status=run_filter.status or "ok", host=run_filter.host)
    stored = queries.stored_runs(store)
    variants = variant_names(stored)
    runs = [r for r in stored if wanted.matches(r, variants) and ((r.role == "noise_floor") == floor)]
    if trained_only and any(r.weights != "synthetic" for r in runs):  # random weights have no quality
        runs = [r for r in runs if r.weights != "synthetic"]
    where = ""
    if prefer_here and not run_filter.gpu and runs:
        gpu, host, label = this_machine()
        here = [r for r in runs if matches_gpu(r, gpu) and (host is None or str(r.host) == host)]
        if here:
            runs, where = here, f" on this machine, {label}"
    if not runs:
        raise ParityError(
            f"no {'successful ' if wanted.status == 'ok' else ''}run matches {selector!r}"
            + (f" ({run_filter.describe()})" if run_filter.describe() != "no filter" else "")
            + f" in {store.describe()}; give a run id, or a variant or backend that `quantbench runs` lists "
              "(int4, fp8, nvfp4-packed ...), and --gpu / --model to narrow it")
    newest = max(runs, key=lambda r: str(r.created_at))
    others = len(runs) - 1
    note = (f"{selector}: run {newest.run_id[:13]}, {newest.variant or newest.backend} of "
            f"{newest.model_id} on {parity.gpu_label(newest)}, {newest.created_at:%Y-%m-%d %H:%M}"
            f" (the newest{where}" + (f", of {others + 1} matching" if others else "") + ")")
    return newest.run_id, note


# -- what `quantbench publish` puts in a bundle ---------------------------------------------------------------
@dataclass(frozen=True)
class BundleChoice:
    """The runs and load runs a bundle will hold, and the filters that chose them (kept in its manifest)."""

    run_ids: list[str]
    load_ids: list[str]
    selection: dict[str, Any]
    gpus: list[str]  # what the runs ran on, for the bundle's default name


def sweep_name(sweep: str) -> str:
    """`--sweep`: a sweep's name, or its .toml file (its `name`, else the file's stem, as the sweep names runs)."""
    from pathlib import Path

    path = Path(sweep)
    if path.suffix == ".toml" and path.is_file():
        import tomllib

        try:
            return str(tomllib.loads(path.read_text()).get("name") or path.stem)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--sweep {sweep}: not a TOML file ({e})") from None
    return sweep


def bundle_choice(store: Store, run_filter: RunFilter, *, suite: str | None = None, sweep: str | None = None,
                  since: str | None = None, with_failed: bool = False, load_runs: bool = True) -> BundleChoice:
    """The runs of `store` that pass the filters (successful ones unless `with_failed`; `suite` a suite id or the
    start of its hash; `sweep` the runs a sweep of that name made), and the load runs of the same models, GPUs and
    suites (none with `sweep`, or without `load_runs`)."""
    from quantbench.analysis.recommend import since_filter
    from quantbench.store import load as load_store

    after = since_filter(since)
    name = sweep_name(sweep) if sweep else None
    chosen = []
    every = queries.stored_runs(store)
    variants = variant_names(every)
    for run in every:
        if not run_filter.matches(run, variants) or (run.status != "ok" and not with_failed):
            continue
        if suite and suite != run.suite_id and not str(run.suite_hash or "").startswith(suite):
            continue
        if after is not None and (run.created_at is None or run.created_at < after):
            continue
        if name and not str((run.spec or {}).get("notes") or "").startswith(f"sweep {name}:"):
            continue
        chosen.append(run)
    loads: list[dict[str, Any]] = []
    if load_runs and not name and load_store.has_load_tables(store):
        gpus = {str(r.gpu_name) for r in every if r.gpu_name and (not run_filter.gpu or matches_gpu(r, run_filter.gpu))}
        for lr in parity.records(load_store.load_runs(store)):
            server_gpu = str(lr.get("server_gpu") or "")
            if run_filter.gpu and server_gpu not in gpus and run_filter.gpu.lower() not in server_gpu.lower():
                continue
            if run_filter.model and run_filter.model.lower() not in str(lr.get("server_model") or "").lower():
                continue
            if run_filter.variant and run_filter.variant.lower() != str(lr.get("server_variant") or "").lower():
                continue
            if suite and suite != lr.get("requests_from") and not str(lr.get("suite_hash") or "").startswith(suite):
                continue
            if after is not None and pd.Timestamp(lr["created_at"]) < after:
                continue
            loads.append(lr)
    selection = {k: v for k, v in (("model", run_filter.model), ("gpu", run_filter.gpu), ("variant", run_filter.variant),
                                   ("suite", suite), ("sweep", name), ("since", since)) if v}
    selection["with_failed"] = with_failed
    gpus_of = sorted({parity.gpu_label(r) for r in chosen})
    return BundleChoice([r.run_id for r in chosen], [str(lr["load_id"]) for lr in loads], selection, gpus_of)
