"""Runs chosen by what they are rather than by id: `quantbench compare int4 --gpu cpu` (the newest int4 run on a
CPU), `quantbench runs --model … --gpu … --variant … --status …`. One filter, so every command reads a selector the
same way."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantbench.analysis import parity, provenance
from quantbench.analysis.recommend import matches_gpu
from quantbench.analysis.stats import ParityError
from quantbench.errors import ConfigError
from quantbench.store import Store, queries

STATUSES = ("ok", "failed")
RUN_ID = re.compile(r"^[0-9a-f-]{4,36}$")  # may be a run id or a prefix of one (01a22979-8ae4); "bf16" is tried too
ALL = "all"


@dataclass(frozen=True)
class RunFilter:
    """Which runs: each field None for any. `gpu` as `report --gpu` takes it (cpu, a family, part of a GPU's name);
    `variant` a variant (int4, nvfp4-unpacked) or a backend (nvfp4: both of its variants); `model` the model id or
    part of it; `status` ok or failed; `host` the machine's host name."""

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

    def matches(self, run: dict[str, Any]) -> bool:
        if self.status and run.get("status") != self.status:
            return False
        if self.gpu and self.gpu != ALL and not matches_gpu(run, self.gpu):
            return False
        if self.host and str(run.get("host")) != self.host:
            return False
        if self.model and self.model.lower() not in str(run.get("model_id") or "").lower():
            return False
        if self.variant:
            v = self.variant.strip().lower()
            if v not in (str(run.get("variant") or "").lower(), str(run.get("backend") or "").lower()):
                return False
        return True


def this_machine() -> tuple[str, str | None, str]:
    """(the `--gpu` value of this machine, its host when that value is `cpu`, a label): the GPU NVML sees, else
    this host's CPU."""
    from quantbench.run.machine import detect

    machine = detect()
    if machine.has_gpu:
        return str(machine.gpu_name), None, f"{machine.gpu_name} ({machine.gpu_family})"
    host = socket.gethostname()
    return "cpu", host, f"CPU ({host})"


def summaries(store: Store, run_filter: RunFilter) -> pd.DataFrame:
    """The `run_summary` rows (with their sources) that pass `run_filter`, oldest first."""
    df = queries.run_summaries_with_sources(store)
    if df.empty:
        return df
    keep = [run_filter.matches(r) for r in parity.records(df)]
    out = df[keep].copy()
    out["source"] = [provenance.source_text(r) for r in parity.records(out)] if len(out) else []
    return out


def select_run(store: Store, selector: str, run_filter: RunFilter = RunFilter(), prefer_here: bool = True,
               trained_only: bool = True) -> tuple[str, str]:
    """The run `selector` names: a run id (or a unique prefix), else a variant or backend (`int4`, `nvfp4`), the
    newest successful run of it that passes `run_filter` (noise-floor runs only when the selector says
    `noise-floor`), of trained weights when there are any (`trained_only`: a synthetic run has no quality to
    compare). Without a --gpu in the filter, this machine's runs come first when it has any. Returns
    (run id, one line saying which run was chosen and why)."""
    key = selector.strip().lower()
    if RUN_ID.match(key):
        found = queries.runs_by_id_prefix(store, key)
        if len(found) == 1:
            return str(found["run_id"].iloc[0]), ""
        if len(found) > 1:
            raise ParityError(f"run {selector!r} is ambiguous ({', '.join(found['run_id'].astype(str))}); give more "
                              "characters of the id")
    floor = key in ("noise-floor", "noise_floor", "floor")
    wanted = RunFilter(model=run_filter.model, gpu=run_filter.gpu, variant=None if floor else key,
                       status=run_filter.status or "ok", host=run_filter.host)
    runs = [r for r in parity.records(queries.run_summaries_with_sources(store)) if wanted.matches(r)
            and ((r.get("role") == "noise_floor") == floor)]
    if trained_only and any(r.get("weights") != "synthetic" for r in runs):  # random weights have no quality
        runs = [r for r in runs if r.get("weights") != "synthetic"]
    where = ""
    if prefer_here and not run_filter.gpu and runs:
        gpu, host, label = this_machine()
        here = [r for r in runs if matches_gpu(r, gpu) and (host is None or str(r.get("host")) == host)]
        if here:
            runs, where = here, f" on this machine, {label}"
    if not runs:
        raise ParityError(
            f"no {'successful ' if wanted.status == 'ok' else ''}run matches {selector!r}"
            + (f" with {run_filter.describe()}" if run_filter.describe() != "no filter" else "")
            + f" in {store.describe()}; give a run id, or a variant or backend that `quantbench runs` lists "
              "(int4, fp8, nvfp4-packed ...), and --gpu / --model to narrow it")
    newest = max(runs, key=lambda r: str(r.get("created_at")))
    others = len(runs) - 1
    note = (f"{selector}: run {str(newest['run_id'])[:13]}, {newest.get('variant') or newest.get('backend')} of "
            f"{newest.get('model_id')} on {parity.gpu_label(newest)}, {pd.Timestamp(newest['created_at']):%Y-%m-%d %H:%M}"
            f" (the newest{where}" + (f", of {others + 1} matching" if others else "") + ")")
    return str(newest["run_id"]), note
