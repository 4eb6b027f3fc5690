"""Everything the dashboard reads, cached by (store path, file stamp).

Every query goes through `Store.read`, which opens a read-only connection and closes it at once: a dashboard
left open never holds the DuckDB lock that `quantbench run` needs. The stamp (mtime and size of the file and of
its write-ahead log) changes whenever a writer commits, so a new run shows up on the next rerun.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from dashboard import url_state
from quantbench.analysis import decision_media, parity
from quantbench.analysis.constraints import Answer, Constraints, answer
from quantbench.analysis.recommend import stored_runs
from quantbench.analysis.select import this_machine
from quantbench.errors import QuantbenchError
from quantbench.report import GpuReport, Rules, build_report, since_filter
from quantbench.store import SCHEMA_VERSION, Store, default_db, home, queries
from quantbench.store import load as load_store
from quantbench.store.home import Source
from quantbench.store.records import StoredRun, frame

Stamp = tuple[int, ...]
T = TypeVar("T")


SHARED_KEY = "shared"  # the sidebar switch (and URL parameter): read the shared results beside the store


def db_path() -> Path:
    return Path(default_db()).expanduser().resolve()


def sources(shared: bool | None = None) -> list[Source]:
    """What the dashboard reads: $QUANTBENCH_DB alone (the shared results beside it when switched on), else your
    store with the shared results beside it (your store alone when switched off); quantbench.store.home."""
    if shared is None:
        shared = st.session_state.get(SHARED_KEY)
    first, beside = home.reading(None, shared)
    return [Source(first.path.expanduser().resolve(), first.kind), *beside]


def key_of(found: list[Source]) -> str:
    """The cache key of a set of stores: a plain path for one store named by $QUANTBENCH_DB, else JSON."""
    if len(found) == 1 and found[0].kind == home.GIVEN:
        return str(found[0].path)
    return json.dumps([[str(s.path), s.kind] for s in found])


def store(db: str) -> Store:
    """The Store a cache key names (one store, or several read as one)."""
    if not db.startswith("["):
        return Store(db)
    (first, kind), *beside = json.loads(db)
    return Store(first, beside=[Source(Path(p), k) for p, k in beside], kind=kind)


def stamp(path: Path) -> Stamp:
    def one(p: Path) -> tuple[int, int]:
        try:
            s = p.stat()
            return (s.st_mtime_ns, s.st_size)
        except FileNotFoundError:
            return (0, 0)

    return one(path) + one(path.with_name(path.name + ".wal"))


def stamp_of(db: str) -> Stamp:
    """The stamp of every store a cache key names, now (as `current` takes it)."""
    paths = [Path(db)] if not db.startswith("[") else [Path(p) for p, _ in json.loads(db)]
    return tuple(x for p in paths for x in stamp(p))


class _StoreMoved(Exception):
    """A cached read saw another state of the store than its key's stamp: not to be cached."""


def store_read(**cache: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """st.cache_data for a read keyed by (store key, stamp, ...): the script run takes its stamp once, but a read
    that misses the cache runs later, and a writer may commit in between. Then what it read belongs to a newer
    state than the sidebar's counts and the other tables of this run, and would be cached under the old stamp for
    good (a page mixing two states of the store). Such a read is not cached: the script starts again, with the
    new stamp, and every table of the page comes from one state."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def checked(db: str, mtime: Stamp, *args: Any, **kwargs: Any) -> T:
            got = fn(db, mtime, *args, **kwargs)
            if stamp_of(db) != tuple(mtime):
                raise _StoreMoved
            return got

        cached = st.cache_data(**cache)(checked)

        @functools.wraps(fn)
        def read(db: str, mtime: Stamp, *args: Any, **kwargs: Any) -> T:
            try:
                return cached(db, mtime, *args, **kwargs)
            except _StoreMoved:
                st.session_state.pop(CURRENT, None)
                st.rerun()
                raise  # st.rerun raises; for type checkers

        read.clear = cached.clear  # type: ignore[attr-defined]
        return read

    return wrap


CURRENT = "_current_store"


def current(fresh: bool = False) -> tuple[str, Stamp]:
    """The stores' key and their stamp: the key of every cached read in this script run. The app takes it `fresh`
    once a run, before anything is read; the page it runs gets that same one, so the sidebar's counts and the page's
    tables come from one state of the store while `quantbench run` writes to it."""
    if not fresh and CURRENT in st.session_state:
        return st.session_state[CURRENT]
    found = sources()
    st.session_state[CURRENT] = key_of(found), tuple(x for s in found for x in stamp(s.path))
    return st.session_state[CURRENT]


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


@store_read(show_spinner=False, max_entries=16)
def status(db: str, mtime: Stamp) -> Status:
    make = "run `quantbench demo` to make one, or point QUANTBENCH_DB at a results store"
    if db.startswith("["):
        return _status_of_several(store(db), make)
    path = Path(db)
    if not path.exists():
        return Status(False, message=f"No results store at `{path}`: {make}.")
    one = Store(path)
    try:
        version = one.schema_version()
    except QuantbenchError as e:
        return Status(False, message=f"Cannot read `{path}` as a quantbench results store: {e}")
    if version > SCHEMA_VERSION:
        return Status(False, version=version, message=(
            f"`{path}` has schema version {version}, newer than this quantbench (version {SCHEMA_VERSION}): "
            "upgrade quantbench (`pip install -U quantbench`) to read it."))
    if version == 0:
        return Status(False, message=f"`{path}` is a DuckDB file without quantbench's tables: {make}.")
    if version < SCHEMA_VERSION:
        n = queries.run_count(one)
        return Status(False, n_runs=n, version=version, message=(
            f"`{path}` has schema version {version} ({n} runs); this dashboard reads version {SCHEMA_VERSION}. "
            "The dashboard only reads, so it does not upgrade stores: the next `quantbench run` into this store "
            f"upgrades it in place, keeping every run, or run `quantbench migrate --db {path}`."))
    n, ok = queries.run_counts(one)
    n_load = len(load_store.load_runs(one)) if load_store.has_load_tables(one) else 0
    if n == 0 and n_load:
        return Status(False, version=version, n_load_runs=n_load, message=(
            f"The store `{path}` holds {n_load} load run{'s' * (n_load != 1)} (`quantbench load`: throughput and "
            "latency of a server) and no benchmark runs, so there is no variant to compare yet: the Serving under "
            f"load page shows them. For the which-quant table, {make}."))
    if n == 0:
        return Status(False, version=version, message=f"The store `{path}` has no runs yet: {make}.")
    return Status(True, n_runs=n, n_ok=ok, version=version, n_load_runs=n_load)


def _status_of_several(several: Store, make: str) -> Status:
    """Your store with the shared results beside it: usable when any of them holds a run (each is read as its
    schema allows; a newer one is refused by name)."""
    read = {src.path.resolve() for src in several.sources}
    off = [src for src in home.shared_sources() if src.path.resolve() not in read]  # switched off in the sidebar
    if off:
        make = (f"switch on **Shared results too** in the sidebar to read the shared results beside it "
                f"({', '.join(src.label for src in off)}), or {make}")
    if not several.exists():
        return Status(False, message=f"No results yet: your store `{several.path}` is not made" + (
            ", and the shared results are switched off" if off else " and no shared results are installed")
            + f": {make}.")
    try:
        n, ok = queries.run_counts(several)
        n_load = len(load_store.load_runs(several))
    except QuantbenchError as e:
        return Status(False, message=f"Cannot read {several.describe()}: {e}")
    if n == 0 and n_load:
        return Status(False, version=SCHEMA_VERSION, n_load_runs=n_load, message=(
            f"{several.describe()} holds {n_load} load run{'s' * (n_load != 1)} and no benchmark runs: the Serving "
            f"under load page shows them. For the which-quant table, {make}."))
    if n == 0:
        return Status(False, version=SCHEMA_VERSION, message=f"{several.describe()} has no runs yet: {make}.")
    return Status(True, n_runs=n, n_ok=ok, version=SCHEMA_VERSION, n_load_runs=n_load)


@store_read(show_spinner=False, max_entries=16)
def runs(db: str, mtime: Stamp) -> pd.DataFrame:
    """Every run (quantbench.store.records.StoredRun: its columns, latency, accuracy and source) as a table, oldest
    first, plus the machine it is grouped under and where it came from in words (your store, a pulled bundle, the
    shipped results)."""
    found = stored_runs(store(db))
    df = frame(found)
    df["source"] = [r.source for r in found]
    df["gpu_id"] = [machine_id(r) for r in found]
    df["gpu_label"] = [parity.gpu_label(r) for r in found]
    df["family"] = [str(r.gpu_family or ("cpu" if r.is_cpu else "unknown")) for r in found]
    return df


def machine_id(run: StoredRun) -> str:
    """The value the GPU selector (and the URL) uses: the GPU's name, or cpu:MACHINE for a CPU run (its host name,
    and the CPU model, logical CPUs and machine id where the run recorded them: parity.gpu_key)."""
    return key_id(parity.gpu_key(run))


def key_id(gpu_key: tuple[str, str]) -> str:
    """machine_id of a parity.gpu_key: the GPU's name, or cpu:MACHINE."""
    kind, name = gpu_key
    return f"cpu:{name}" if kind == "cpu" else name


@store_read(show_spinner="Comparing every variant with BF16…", max_entries=16)
def reports(db: str, mtime: Stamp, min_agreement: float, vram_budget_gib: float | None,
            objective: str, since: str | None = None, history: bool = False,
            price_per_gpu_hour: float | None = None) -> list[GpuReport]:
    """`quantbench report`'s tables for every GPU and model: the same function, the same rules (`history`:
    `--all`, every kernel generation; `price_per_gpu_hour`: `--price-per-gpu-hour`)."""
    rules = Rules(min_agreement=min_agreement, vram_budget_gib=vram_budget_gib, objective=objective)
    return build_report(store(db), rules=rules, since=since, history=history, price_per_gpu_hour=price_per_gpu_hour)


def reports_for(db: str, mtime: Stamp, rules: Rules, since: str | None = None,
                history: bool = False, price_per_gpu_hour: float | None = None) -> list[GpuReport]:
    return reports(db, mtime, rules.min_agreement, rules.vram_budget_gib, rules.objective, since, history,
                   price_per_gpu_hour)


def runs_since(runs: pd.DataFrame, since: str | None) -> pd.DataFrame:
    """The runs made at or after `since` (the report's --since, the same cut)."""
    after = since_filter(since)
    return runs if after is None else runs[pd.to_datetime(runs["created_at"], utc=True) >= after]


@store_read(show_spinner=False, max_entries=16)
def latencies(db: str, mtime: Stamp, run_ids: tuple[str, ...]) -> pd.DataFrame:
    return queries.latencies(store(db), run_ids)


@store_read(show_spinner=False, max_entries=64)
def answers(db: str, mtime: Stamp, run_id: str) -> pd.DataFrame:
    return parity.load_answers(store(db), run_id)


@store_read(show_spinner=False, max_entries=32)
def confident_flips(db: str, mtime: Stamp, reference_run: str, candidate_run: str) -> pd.DataFrame:
    """The questions BF16 answered confidently that the candidate flipped (from the answers' stored margins)."""
    from quantbench.analysis.significance import CONFIDENT

    return queries.confident_flips(Store(db), reference_run, candidate_run, CONFIDENT)


@store_read(show_spinner=False, max_entries=16)
def load_runs(db: str, mtime: Stamp) -> pd.DataFrame:
    """Every stored load run (`quantbench load`), newest first."""
    return load_store.load_runs(store(db))


@store_read(show_spinner=False, max_entries=16)
def load_steps(db: str, mtime: Stamp, load_ids: tuple[str, ...]) -> pd.DataFrame:
    return load_store.load_steps(store(db), list(load_ids))


@st.cache_resource(show_spinner=False)
def this_machine_id() -> str:
    """This machine as the GPU selector names machines: its GPU's name, or cpu:HOST (NVML, read once)."""
    gpu, host, _ = this_machine()
    return f"cpu:{host}" if gpu == "cpu" else gpu


def report_key(rep: GpuReport) -> str:
    """The machine id of a report, matching `machine_id` of its runs (a table of batched runs alone has no rows to
    read it from: the report carries its runs' machine)."""
    return key_id(rep.gpu_key)


def env_db_note() -> str:
    return "from QUANTBENCH_DB" if os.environ.get("QUANTBENCH_DB") else "default; set QUANTBENCH_DB to change"


def sources_caption(db: str) -> str:
    """The sidebar's line on what is read: one store, or your store and the shared results beside it."""
    if not db.startswith("["):
        return f"Store `{db}` ({env_db_note()})"
    found = store(db).sources
    return "Reading " + " + ".join(f"{s.label} `{s.path}`" for s in found if s.path.exists()) if any(
        s.path.exists() for s in found) else f"Your store `{found[0].path}` (not made yet)"


def shared_switch() -> None:
    """The sidebar switch that reads the shared results (pulled bundles, the results shipped with quantbench)
    beside the store, kept in the link as shared=1 / shared=0."""
    named = home.named_db() is not None
    url_state.start(SHARED_KEY, not named, lambda raw: raw.lower() in ("1", "true", "yes"))
    st.toggle("Shared results too", key=SHARED_KEY,
              help="on: your store with the bundles you pulled (`quantbench pull`) and the results shipped with "
                   "quantbench beside it; off: your store alone")
    url_state.publish(SHARED_KEY, to_url=lambda v: "1" if v else "0", default=not named)


@store_read(show_spinner=False, max_entries=16)
def bundles(db: str, mtime: Stamp) -> pd.DataFrame:
    """The bundles pulled into each store read, with the store's label."""
    frames = []
    for source in store(db).sources:
        if source.path.exists():
            found = queries.bundles(Store(source.path))
            if not found.empty:
                frames.append(found.assign(store=source.label, store_path=str(source.path)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@store_read(show_spinner="Checking every variant against your constraints…", max_entries=16)
def constraint_answers(db: str, mtime: Stamp, c: Constraints, since: str | None = None) -> list[Answer]:
    """`quantbench recommend`'s answers for every GPU: the same function, the same constraints."""
    return answer(store(db), c, since=since)


def _file_stamps(paths: tuple[str, ...]) -> tuple[Stamp, ...]:
    return tuple(stamp(Path(p).expanduser()) for p in paths)


@st.cache_resource(show_spinner="Finding the suite these runs answered…", max_entries=8)
def _suite_lookup(suite_id: str | None, suite_hash: str | None, paths: tuple[str, ...], limits: decision_media.Limits,
                  stamps: tuple[Stamp, ...]) -> decision_media.SuiteLookup:
    return decision_media.find_suite(suite_id, suite_hash, list(paths), limits)


def suite_lookup(run: StoredRun, paths: tuple[str, ...]) -> decision_media.SuiteLookup:
    """The suite `run` answered (media included), from `paths` (the user's file first), the run's own --suite or
    the built-in suite of its id; cached until a file among them changes. Kept as a resource: a suite with its
    media inline is large, and copying it on every rerun (as cache_data would) is slow."""
    own = decision_media.run_suite_path(run)
    paths = tuple(p for p in (*paths, own) if p)
    return _suite_lookup(run.suite_id, run.suite_hash, paths, decision_media.run_limits(run),
                         _file_stamps(paths))


@st.cache_resource(show_spinner="Decoding the record's media…", max_entries=32)
def record_media(_lookup: decision_media.SuiteLookup, suite_hash: str, record_id: str,
                 limits: decision_media.Limits) -> list[decision_media.Decoded]:
    """One record's media, decoded (`suite_hash` keys the cache: the lookup itself is not hashed)."""
    return decision_media.record_media(_lookup.suite, record_id, limits)
