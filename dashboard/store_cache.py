"""Everything the dashboard reads, cached by (store path, file stamp).

Every query goes through `Store.read`, which opens a read-only connection and closes it at once: a dashboard
left open never holds the DuckDB lock that `quantbench run` needs. The stamp (mtime and size of the file and of
its write-ahead log) changes whenever a writer commits, so a new run shows up on the next rerun.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from quantbench.analysis import decision_media, parity
from quantbench.errors import QuantbenchError
from quantbench.report import GpuReport, Rules, build_report, since_filter
from quantbench.store import SCHEMA_VERSION, Store, default_db, queries
from quantbench.store import load as load_store

Stamp = tuple[int, int, int, int]


def db_path() -> Path:
    return Path(default_db()).expanduser().resolve()


def stamp(path: Path) -> Stamp:
    def one(p: Path) -> tuple[int, int]:
        try:
            s = p.stat()
            return (s.st_mtime_ns, s.st_size)
        except FileNotFoundError:
            return (0, 0)

    return one(path) + one(path.with_name(path.name + ".wal"))


def current() -> tuple[str, Stamp]:
    """The store's path and its stamp now: the key of every cached read in this script run."""
    path = db_path()
    return str(path), stamp(path)


@dataclass(frozen=True)
class Status:
    """What the store holds, and the message to show when the dashboard cannot use it."""

    usable: bool
    n_runs: int = 0
    n_ok: int = 0
    version: int = 0
    message: str = ""
    n_load_runs: int = 0  # `quantbench load` runs: a store may hold only these (the load page still shows them)

    @property
    def only_load_runs(self) -> bool:
        return not self.usable and self.n_runs == 0 and self.n_load_runs > 0


@st.cache_data(show_spinner=False, max_entries=16)
def status(db: str, mtime: Stamp) -> Status:
    path = Path(db)
    make = "run `quantbench demo` to make one, or point QUANTBENCH_DB at a results store"
    if not path.exists():
        return Status(False, message=f"No results store at `{path}`: {make}.")
    store = Store(path)
    try:
        version = store.schema_version()
    except QuantbenchError as e:
        return Status(False, message=f"Cannot read `{path}` as a quantbench results store: {e}")
    if version > SCHEMA_VERSION:
        return Status(False, version=version, message=(
            f"`{path}` has schema version {version}, newer than this quantbench (version {SCHEMA_VERSION}): "
            "upgrade quantbench (`pip install -U quantbench`) to read it."))
    if version == 0:
        return Status(False, message=f"`{path}` is a DuckDB file without quantbench's tables: {make}.")
    if version < SCHEMA_VERSION:
        n = queries.run_count(store)
        return Status(False, n_runs=n, version=version, message=(
            f"`{path}` has schema version {version} ({n} runs); this dashboard reads version {SCHEMA_VERSION}. "
            "The dashboard only reads, so it does not upgrade stores: the next `quantbench run` into this store "
            f"upgrades it in place, keeping every run, or run `quantbench migrate --db {path}`."))
    n, ok = queries.run_counts(store)
    n_load = len(load_store.load_runs(store)) if load_store.has_load_tables(store) else 0
    if n == 0 and n_load:
        return Status(False, version=version, n_load_runs=n_load, message=(
            f"The store `{path}` holds {n_load} load run{'s' * (n_load != 1)} (`quantbench load`: throughput and "
            "latency of a server) and no benchmark runs, so there is no variant to compare yet: the Serving under "
            f"load page shows them. For the which-quant table, {make}."))
    if n == 0:
        return Status(False, version=version, message=f"The store `{path}` has no runs yet: {make}.")
    return Status(True, n_runs=n, n_ok=ok, version=version, n_load_runs=n_load)


@st.cache_data(show_spinner=False, max_entries=16)
def runs(db: str, mtime: Stamp) -> pd.DataFrame:
    """Every run with its latency summary, oldest first, plus the machine it is grouped under."""
    df = queries.runs_with_percentiles(Store(db))
    records = parity.records(df)
    df["gpu_id"] = [machine_id(r) for r in records]
    df["gpu_label"] = [parity.gpu_label(r) for r in records]
    df["family"] = [str(r.get("gpu_family") or ("cpu" if parity.is_cpu(r) else "unknown")) for r in records]
    return df


def machine_id(run: dict) -> str:
    """The value the GPU selector (and the URL) uses: the GPU's name, or cpu:MACHINE for a CPU run (its host name,
    and the CPU model, logical CPUs and machine id where the run recorded them: parity.gpu_key)."""
    return f"cpu:{parity.gpu_key(run)[1]}" if parity.is_cpu(run) else str(run.get("gpu_name"))


@st.cache_data(show_spinner="Comparing every variant with BF16…", max_entries=16)
def reports(db: str, mtime: Stamp, min_agreement: float, vram_budget_gib: float | None,
            objective: str, since: str | None = None, history: bool = False,
            price_per_gpu_hour: float | None = None) -> list[GpuReport]:
    """`quantbench report`'s tables for every GPU and model: the same function, the same rules (`history`:
    `--all`, every kernel generation; `price_per_gpu_hour`: `--price-per-gpu-hour`)."""
    rules = Rules(min_agreement=min_agreement, vram_budget_gib=vram_budget_gib, objective=objective)
    return build_report(Store(db), rules=rules, since=since, history=history, price_per_gpu_hour=price_per_gpu_hour)


def reports_for(db: str, mtime: Stamp, rules: Rules, since: str | None = None,
                history: bool = False, price_per_gpu_hour: float | None = None) -> list[GpuReport]:
    return reports(db, mtime, rules.min_agreement, rules.vram_budget_gib, rules.objective, since, history,
                   price_per_gpu_hour)


def runs_since(runs: pd.DataFrame, since: str | None) -> pd.DataFrame:
    """The runs made at or after `since` (the report's --since, the same cut)."""
    after = since_filter(since)
    return runs if after is None else runs[pd.to_datetime(runs["created_at"], utc=True) >= after]


@st.cache_data(show_spinner=False, max_entries=16)
def latencies(db: str, mtime: Stamp, run_ids: tuple[str, ...]) -> pd.DataFrame:
    return queries.latencies(Store(db), run_ids)


@st.cache_data(show_spinner=False, max_entries=64)
def answers(db: str, mtime: Stamp, run_id: str) -> pd.DataFrame:
    return parity.load_answers(Store(db), run_id)


@st.cache_data(show_spinner=False, max_entries=32)
def confident_flips(db: str, mtime: Stamp, reference_run: str, candidate_run: str) -> pd.DataFrame:
    """The questions BF16 answered confidently that the candidate flipped (from the answers' stored margins)."""
    from quantbench.analysis.significance import CONFIDENT

    return queries.confident_flips(Store(db), reference_run, candidate_run, CONFIDENT)


@st.cache_data(show_spinner=False, max_entries=16)
def load_runs(db: str, mtime: Stamp) -> pd.DataFrame:
    """Every stored load run (`quantbench load`), newest first."""
    return load_store.load_runs(Store(db))


@st.cache_data(show_spinner=False, max_entries=16)
def load_steps(db: str, mtime: Stamp, load_ids: tuple[str, ...]) -> pd.DataFrame:
    return load_store.load_steps(Store(db), list(load_ids))


def report_key(rep: GpuReport) -> str:
    """The machine id of a report, matching `machine_id` of its runs."""
    return machine_id(rep.rows[0].run)


def env_db_note() -> str:
    return "from QUANTBENCH_DB" if os.environ.get("QUANTBENCH_DB") else "default; set QUANTBENCH_DB to change"


def _file_stamps(paths: tuple[str, ...]) -> tuple[Stamp, ...]:
    return tuple(stamp(Path(p).expanduser()) for p in paths)


@st.cache_resource(show_spinner="Finding the suite these runs answered…", max_entries=8)
def _suite_lookup(suite_id: str | None, suite_hash: str | None, paths: tuple[str, ...], limits: decision_media.Limits,
                  stamps: tuple[Stamp, ...]) -> decision_media.SuiteLookup:
    return decision_media.find_suite(suite_id, suite_hash, list(paths), limits)


def suite_lookup(run: dict, paths: tuple[str, ...]) -> decision_media.SuiteLookup:
    """The suite `run` answered (media included), from `paths` (the user's file first), the run's own --suite or
    the built-in suite of its id; cached until a file among them changes. Kept as a resource: a suite with its
    media inline is large, and copying it on every rerun (as cache_data would) is slow."""
    own = decision_media.run_suite_path(run)
    paths = tuple(p for p in (*paths, own) if p)
    return _suite_lookup(run.get("suite_id"), run.get("suite_hash"), paths, decision_media.run_limits(run),
                         _file_stamps(paths))


@st.cache_resource(show_spinner="Decoding the record's media…", max_entries=32)
def record_media(_lookup: decision_media.SuiteLookup, suite_hash: str, record_id: str,
                 limits: decision_media.Limits) -> list[decision_media.Decoded]:
    """One record's media, decoded (`suite_hash` keys the cache: the lookup itself is not hashed)."""
    return decision_media.record_media(_lookup.suite, record_id, limits)
