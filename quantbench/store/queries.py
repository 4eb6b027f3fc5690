"""Every read the rest of quantbench makes of a results store, one named function per query.

SQL lives in quantbench/store only (tests/test_import_contracts.py checks it): the CLI, the report, parity, the
sweep and the dashboard call these instead of writing queries of their own. Runs come back typed
(quantbench.store.records.StoredRun, with their latency, accuracy and source), every other read as what `Store.read`
returns, a DataFrame; each opens and closes its connection at once, so a caller never holds the DuckDB lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import duckdb
import pandas as pd

from quantbench.store import Store
from quantbench.store.records import StoredRun
from quantbench.store.schema import RUN_SOURCE

ANSWER_COLS = "record_id, question, benchmark, modality, options, probs, top, gold"


# -- stored runs, typed (quantbench.store.records.StoredRun) -------------------------------------------------
# Every run with the figures derived from its other rows, computed here rather than through the store's own views:
# a store read without being migrated keeps the views of the quantbench that wrote it (an older run_accuracy pooled
# the gold questions). The expressions are those of schema.VIEWS' run_latency and run_accuracy.
STORED_RUNS = """
WITH lat AS (
    SELECT run_id, count(*) AS n_timed, quantile_cont(model_ms, 0.5) AS p50_ms,
           quantile_cont(model_ms, 0.9) AS p90_ms, quantile_cont(model_ms, 0.99) AS p99_ms,
           avg(model_ms) AS mean_ms, avg(prep_ms) AS prep_mean_ms, avg(tokens) AS mean_tokens
    FROM latencies GROUP BY run_id),
full_batch AS (SELECT run_id, max(batch) AS batch FROM latencies GROUP BY run_id),
throughput AS (
    SELECT l.run_id, count(*) / (sum(l.model_ms / l.batch) / 1000) AS decisions_per_s
    FROM latencies l JOIN full_batch b ON l.run_id = b.run_id AND l.batch = b.batch GROUP BY l.run_id),
per_benchmark AS (
    SELECT run_id, coalesce(benchmark, '(none)') AS benchmark, count(*) AS n, count(gold) AS n_gold,
           avg(CASE WHEN gold IS NOT NULL THEN (top = gold)::INTEGER END) AS accuracy
    FROM answers GROUP BY ALL),
acc AS (
    SELECT run_id, sum(n)::BIGINT AS n_answers, sum(n_gold)::BIGINT AS n_gold, avg(accuracy) AS accuracy
    FROM per_benchmark GROUP BY run_id)
SELECT r.*, lat.* EXCLUDE (run_id), full_batch.batch, throughput.decisions_per_s, acc.* EXCLUDE (run_id),
       src.* EXCLUDE (run_id)
FROM runs r LEFT JOIN lat USING (run_id) LEFT JOIN full_batch USING (run_id) LEFT JOIN throughput USING (run_id)
LEFT JOIN acc USING (run_id) LEFT JOIN {source} src USING (run_id)
"""
NO_SOURCE = ("(SELECT NULL::UUID AS run_id, NULL::VARCHAR AS store, NULL::VARCHAR AS store_kind, "
             "NULL::VARCHAR AS bundle_id, NULL::VARCHAR AS bundle, NULL::VARCHAR AS bundle_host, "
             "NULL::TIMESTAMPTZ AS bundle_published_at, NULL::VARCHAR AS pulled_from, NULL::TIMESTAMPTZ AS pulled_at "
             "WHERE false)")


def _stored(store: Store, where: str = "", params: list[Any] | None = None,
            order: str = "r.created_at, r.run_id") -> list[StoredRun]:
    """The runs of STORED_RUNS that pass `where` (on `r`, the runs table), in `order`. A store from before schema 8
    has no bundles: its runs' source fields are None."""
    tail = (f" WHERE {where}" if where else "") + f" ORDER BY {order}"
    try:
        return _records(store, STORED_RUNS.format(source=_run_source(store)) + tail, params)
    except duckdb.CatalogException:
        return _records(store, STORED_RUNS.format(source=NO_SOURCE) + tail, params)


def _records(store: Store, sql: str, params: list[Any] | None) -> list[StoredRun]:
    with store.connect(write=False) as con:
        cursor = con.execute(sql, params or [])
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    return [StoredRun.from_row(dict(zip(columns, row, strict=True))) for row in rows]


def stored_runs(store: Store) -> list[StoredRun]:
    """Every run, oldest first."""
    return _stored(store)


def stored_runs_by_id(store: Store, run_ids: list[str]) -> list[StoredRun]:
    """These runs (whole ids), oldest first."""
    return _stored(store, "CAST(r.run_id AS VARCHAR) IN (SELECT unnest(?::VARCHAR[]))", [list(map(str, run_ids))])


def runs_by_id_prefix(store: Store, prefix: str) -> list[StoredRun]:
    """The runs whose id starts with `prefix` (lower-case), oldest first."""
    return _stored(store, "CAST(r.run_id AS VARCHAR) LIKE ?", [prefix + "%"])


def repeat_runs(store: Store, repeat_id: str) -> list[StoredRun]:
    """The runs of one `run --repeat N`, in order."""
    return _stored(store, "r.repeat_id = ?", [repeat_id], order="r.repeat_index")


def bf16_reference_runs(store: Store, model_id: Any, suite_hash: Any, other_than: str) -> list[StoredRun]:
    """Ok `bf16`-backend runs, not noise floors, of this model and suite, except the run `other_than`."""
    return _stored(
        store, "r.status = 'ok' AND r.backend = 'bf16' AND coalesce(r.role, 'candidate') <> 'noise_floor' AND "
        "r.model_id = ? AND r.suite_hash = ? AND CAST(r.run_id AS VARCHAR) <> ?", [model_id, suite_hash, other_than])


def bf16_trained_runs_of_suite(store: Store, suite_hash: Any) -> list[StoredRun]:
    """Ok `bf16`-backend runs, not noise floors and not synthetic weights, of any model on this suite."""
    return _stored(
        store, "r.status = 'ok' AND r.backend = 'bf16' AND coalesce(r.role, 'candidate') <> 'noise_floor' "
        "AND coalesce(r.weights, '') <> 'synthetic' AND r.suite_hash = ?", [suite_hash])


def noise_floor_runs(store: Store, model_id: Any, suite_hash: Any, other_than: str) -> list[StoredRun]:
    """Ok noise-floor runs of this model and suite, except the run `other_than`."""
    return _stored(
        store, "r.status = 'ok' AND r.role = 'noise_floor' AND r.model_id = ? AND r.suite_hash = ? AND "
        "CAST(r.run_id AS VARCHAR) <> ?", [model_id, suite_hash, other_than])


# -- the report and parity ----------------------------------------------------------------------------------
def confident_flips(store: Store, reference_run: str, candidate_run: str, min_margin: float) -> pd.DataFrame:
    """The questions the reference answered with a margin (its stored p(top) − p(second)) of at least
    `min_margin` and the candidate answered otherwise: record, question, benchmark, modality, gold, both tops and
    both distributions, most confident first."""
    return store.read(
        "SELECT r.record_id, r.question, r.benchmark, r.modality, r.gold, r.top AS top_ref, c.top AS top_cand, "
        "r.margin AS ref_margin, r.options AS options_ref, r.probs AS probs_ref, c.options AS options_cand, "
        "c.probs AS probs_cand FROM answers r JOIN answers c USING (record_id, question) "
        "WHERE r.run_id = ? AND c.run_id = ? AND r.margin >= ? - 1e-9 AND r.top <> c.top "
        "ORDER BY r.margin DESC, r.record_id, r.question", [reference_run, candidate_run, min_margin])


def answers(store: Store, run_id: str) -> pd.DataFrame:
    """One run's answers, ordered by record and question."""
    return store.read(f"SELECT {ANSWER_COLS} FROM answers WHERE run_id = ? ORDER BY record_id, question", [run_id])


# -- the sweep ------------------------------------------------------------------------------------------------
def ok_spec_hashes(store: Store, since: Any = None) -> pd.DataFrame:
    """spec_hash, machine and repeat group of every ok run that has a spec_hash (finished at or after `since`, a
    datetime, where given): what a sweep counts as already finished, and the repeat group it may continue."""
    where = "status = 'ok' AND spec_hash IS NOT NULL" + (" AND finished_at >= ?" if since is not None else "")
    return store.read(f"SELECT spec_hash, gpu_name, gpu_family, host, repeat_id, repeat_index, repeat_count FROM runs WHERE {where}",
                      [since] if since is not None else None)


# -- the dashboard --------------------------------------------------------------------------------------------
def run_count(store: Store) -> int:
    """How many runs the store holds."""
    return int(store.read("SELECT count(*) AS n FROM runs")["n"].iloc[0])


def run_counts(store: Store) -> tuple[int, int]:
    """(runs, ok runs) in the store."""
    counts = store.read("SELECT count(*) AS n, count(*) FILTER (WHERE status = 'ok') AS ok FROM runs")
    return int(counts["n"].iloc[0]), int(counts["ok"].iloc[0])


def latencies(store: Store, run_ids: Iterable[str]) -> pd.DataFrame:
    """Every timed decision of these runs, run_id as text, in order."""
    return store.read(
        "SELECT CAST(run_id AS VARCHAR) AS run_id, seq, phase, model_ms, prep_ms, tokens, batch FROM latencies "
        "WHERE list_contains(?, CAST(run_id AS VARCHAR)) ORDER BY run_id, seq", [list(run_ids)])


# -- where runs came from (quantbench.store.home, quantbench.store.bundle) -------------------------------------
RUN_SOURCE_COLS = ("run_id, store, store_kind, bundle_id, bundle, bundle_host, bundle_published_at, pulled_from, "
                   "pulled_at")


def _run_source(store: Store) -> str:
    """The relation of run sources: the composite's `run_source` view over several stores, else the bundles this
    store pulled (schema.RUN_SOURCE)."""
    return "run_source" if store.beside else f"({RUN_SOURCE})"


def run_sources(store: Store) -> pd.DataFrame:
    """Per run read from several stores, or brought by a pulled bundle: the store it is read from and its bundle.
    A store from before schema 8 has no bundles: an empty frame."""
    try:
        return store.read(f"SELECT {RUN_SOURCE_COLS} FROM {_run_source(store)}")
    except duckdb.CatalogException:
        return pd.DataFrame(columns=[c.strip() for c in RUN_SOURCE_COLS.split(",")])


def bundles(store: Store) -> pd.DataFrame:
    """The bundles pulled into the store (schema 8), oldest first, with how many runs each carried and added."""
    try:
        return store.read(
            "SELECT b.bundle_id, b.name, b.publisher_host, b.published_at, b.quantbench_version, b.quantbench_git_rev, "
            "b.pulled_from, b.pulled_at, b.digest, count(i.item_id) FILTER (WHERE i.kind = 'run') AS runs, "
            "count(i.item_id) FILTER (WHERE i.kind = 'run' AND i.added) AS runs_added, "
            "count(i.item_id) FILTER (WHERE i.kind = 'load_run') AS load_runs "
            "FROM bundles b LEFT JOIN bundle_items i USING (bundle_id) GROUP BY ALL ORDER BY b.pulled_at")
    except duckdb.CatalogException:
        return pd.DataFrame()


def closed_loop_steps(store: Store) -> pd.DataFrame:
    """Every closed-loop load step (a concurrency) with its load run's server and suite, newest load run first:
    the latency of a variant at N clients, where `quantbench load` measured it. A store from before schema 6: empty."""
    try:
        return store.read(
            "SELECT CAST(s.load_id AS VARCHAR) AS load_id, s.step, s.concurrency, s.ok, s.sent, s.decisions_per_s, "
            "s.p50_ms, s.p90_ms, s.p99_ms, s.errors, r.server_model, r.server_variant, r.server_kernel_path, "
            "r.server_gpu, r.suite_hash, r.requests_from, r.created_at, r.host FROM load_steps s "
            "JOIN load_runs r USING (load_id) WHERE r.mode = 'closed' AND s.concurrency IS NOT NULL "
            "ORDER BY r.created_at DESC, s.step")
    except duckdb.CatalogException:
        return pd.DataFrame()
