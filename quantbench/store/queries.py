"""Every read the rest of quantbench makes of a results store, one named function per query.

SQL lives in quantbench/store only (tests/test_import_contracts.py checks it): the CLI, the report, parity, the
sweep and the dashboard call these instead of writing queries of their own. Each returns what `Store.read` returns,
a DataFrame, opened and closed at once, so a caller never holds the DuckDB lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import duckdb
import pandas as pd

from quantbench.store import Store
from quantbench.store.schema import RUN_SOURCE

ANSWER_COLS = "record_id, question, benchmark, modality, options, probs, top, gold"
# `run_summary` with its accuracy computed here, the one accuracy (the mean over benchmarks, schema.VIEWS'
# run_accuracy): a store read without being migrated keeps the view definitions of the quantbench that wrote it,
# whose accuracy was the pooled share of gold questions.
SUMMARY = (
    "(SELECT s.* REPLACE (a.accuracy AS accuracy) FROM run_summary s LEFT JOIN ("
    "SELECT run_id, avg(accuracy) AS accuracy FROM (SELECT run_id, coalesce(benchmark, '(none)') AS benchmark, "
    "avg(CASE WHEN gold IS NOT NULL THEN (top = gold)::INTEGER END) AS accuracy FROM answers GROUP BY ALL) "
    "GROUP BY run_id) a USING (run_id))"
)


# -- runs, one line each (`quantbench runs`, the demo's and the sweep's tables) -------------------------------
def run_summary(store: Store, run_id: str) -> pd.DataFrame:
    """The `run_summary` row of one run."""
    return store.read(f"SELECT * FROM {SUMMARY} WHERE run_id = ?", [run_id])


def run_summaries(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """The `run_summary` rows of these runs, oldest first."""
    return store.read(f"SELECT * FROM {SUMMARY} WHERE run_id IN (SELECT unnest(?::UUID[])) ORDER BY created_at",
                      [run_ids])


def newest_run_summaries(store: Store, last: int) -> pd.DataFrame:
    """The newest `last` runs' `run_summary` rows, oldest first."""
    return store.read(f"SELECT * FROM (SELECT * FROM {SUMMARY} ORDER BY created_at DESC LIMIT {int(last)}) "
                      "ORDER BY created_at")


def run_error(store: Store, run_id: str) -> pd.DataFrame:
    """The `error` column of one run."""
    return store.read("SELECT error FROM runs WHERE run_id = ?", [run_id])


def run_failure(store: Store, run_id: str) -> pd.DataFrame:
    """The `failure` and `error` columns of one run."""
    return store.read("SELECT failure, error FROM runs WHERE run_id = ?", [run_id])


# -- the report and parity ----------------------------------------------------------------------------------
RUNS_WITH_LATENCY = (
    "WITH b AS (SELECT run_id, max(batch) AS batch FROM latencies GROUP BY run_id), "
    "t AS (SELECT l.run_id, count(*) / (sum(l.model_ms / l.batch) / 1000) AS decisions_per_s "
    "      FROM latencies l JOIN b ON l.run_id = b.run_id AND l.batch = b.batch GROUP BY l.run_id) "
    "SELECT r.*, l.p50_ms, l.p90_ms, l.p99_ms, l.mean_ms, l.n_timed, b.batch, t.decisions_per_s FROM runs r "
    "LEFT JOIN run_latency l USING (run_id) LEFT JOIN b USING (run_id) LEFT JOIN t USING (run_id) "
)


def runs_with_latency(store: Store) -> pd.DataFrame:
    """Every run, oldest first, with its latency summary (p50, p90, mean model ms), its batch size (decisions per
    forward pass, throughput mode) and decisions_per_s over its full-size batches."""
    return store.read(RUNS_WITH_LATENCY + "ORDER BY r.created_at")


def run_with_latency(store: Store, run_id: str) -> pd.DataFrame:
    """One run (by its whole id) as `runs_with_latency` gives it."""
    return store.read(RUNS_WITH_LATENCY + "WHERE CAST(r.run_id AS VARCHAR) = ?", [str(run_id)])


def repeat_runs(store: Store, repeat_id: str) -> pd.DataFrame:
    """The runs of one `run --repeat N`, in order, as `runs_with_latency` gives them."""
    return store.read(RUNS_WITH_LATENCY + "WHERE r.repeat_id = ? ORDER BY r.repeat_index", [repeat_id])


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


def runs_by_id_prefix(store: Store, prefix: str) -> pd.DataFrame:
    """The runs whose id starts with `prefix` (lower-case), oldest first."""
    return store.read("SELECT * FROM runs WHERE CAST(run_id AS VARCHAR) LIKE ? ORDER BY created_at", [prefix + "%"])


def answers(store: Store, run_id: str) -> pd.DataFrame:
    """One run's answers, ordered by record and question."""
    return store.read(f"SELECT {ANSWER_COLS} FROM answers WHERE run_id = ? ORDER BY record_id, question", [run_id])


def bf16_reference_runs(store: Store, model_id: Any, suite_hash: Any, other_than: str) -> pd.DataFrame:
    """Ok `bf16`-backend runs, not noise floors, of this model and suite, except the run `other_than`."""
    return store.read(
        "SELECT * FROM runs WHERE status = 'ok' AND "
        "backend = 'bf16' AND coalesce(role, 'candidate') <> 'noise_floor' AND model_id = ? AND suite_hash = ? "
        "AND CAST(run_id AS VARCHAR) <> ?",
        [model_id, suite_hash, other_than])


def bf16_trained_runs_of_suite(store: Store, suite_hash: Any) -> pd.DataFrame:
    """Ok `bf16`-backend runs, not noise floors and not synthetic weights, of any model on this suite."""
    return store.read(
        "SELECT * FROM runs WHERE status = 'ok' AND backend = 'bf16' AND coalesce(role, 'candidate') <> 'noise_floor' "
        "AND coalesce(weights, '') <> 'synthetic' AND suite_hash = ?", [suite_hash])


def noise_floor_runs(store: Store, model_id: Any, suite_hash: Any, other_than: str) -> pd.DataFrame:
    """Ok noise-floor runs of this model and suite, except the run `other_than`."""
    return store.read(
        "SELECT * FROM runs WHERE status = 'ok' AND "
        "role = 'noise_floor' AND model_id = ? AND suite_hash = ? AND CAST(run_id AS VARCHAR) <> ?",
        [model_id, suite_hash, other_than])


# -- the sweep ------------------------------------------------------------------------------------------------
def ok_spec_hashes(store: Store) -> pd.DataFrame:
    """spec_hash and machine of every ok run that has a spec_hash: what a sweep counts as already finished."""
    return store.read("SELECT spec_hash, gpu_name, gpu_family, host FROM runs "
                      "WHERE status = 'ok' AND spec_hash IS NOT NULL")


# -- the dashboard --------------------------------------------------------------------------------------------
def run_count(store: Store) -> int:
    """How many runs the store holds."""
    return int(store.read("SELECT count(*) AS n FROM runs")["n"].iloc[0])


def run_counts(store: Store) -> tuple[int, int]:
    """(runs, ok runs) in the store."""
    counts = store.read("SELECT count(*) AS n, count(*) FILTER (WHERE status = 'ok') AS ok FROM runs")
    return int(counts["n"].iloc[0]), int(counts["ok"].iloc[0])


def runs_with_percentiles(store: Store) -> pd.DataFrame:
    """Every run, oldest first, with its p50 / p90 / p99 latency and number of timed decisions."""
    return store.read(
        "SELECT r.*, l.p50_ms, l.p90_ms, l.p99_ms, l.n_timed FROM runs r LEFT JOIN run_latency l USING (run_id) "
        "ORDER BY r.created_at")


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


def run_summaries_with_sources(store: Store) -> pd.DataFrame:
    """Every run's `run_summary` row with its source columns and its p99, oldest first."""
    try:
        return store.read(f"SELECT s.*, src.* EXCLUDE (run_id) FROM run_summary s LEFT JOIN {_run_source(store)} src "
                          "USING (run_id) ORDER BY s.created_at")
    except duckdb.CatalogException:
        return store.read("SELECT * FROM run_summary ORDER BY created_at")


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
