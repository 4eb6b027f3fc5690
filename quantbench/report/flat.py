"""The report as one flat table: a row per variant of each (GPU, model, suite) group with every raw figure (what
`report --format csv` writes, the JSON report's `rows`, the dashboard's tables), and the csv's rows for batched
runs beside them. Nothing here decides: the rows and their figures come from quantbench.analysis.recommend."""

from __future__ import annotations

from typing import Any

import pandas as pd

from quantbench.analysis import efficiency, parity
from quantbench.analysis import significance as sig
from quantbench.analysis.recommend import GpuReport, Row
from quantbench.store.records import StoredRun


def flat_rows(reports: list[GpuReport]) -> pd.DataFrame:
    """Raw figures, one row per variant per report (empty where unknown): the csv and the dashboard."""
    out = []
    for rep in reports:
        for row in rep.rows:
            run, c = row.run, row.comparison
            m = c.paired.mean if c is not None else None
            out.append({
                "gpu": rep.gpu, "gpu_family": rep.gpu_family, "host": run.host, "model_id": rep.model_id,
                "suite_id": rep.suite_id, "suite_hash": rep.suite_hash, "variant": row.label,
                "backend": run.backend, "kernel_path": run.kernel_path,
                "weight_format": run.weight_format, "run_id": run.run_id, "status": run.status,
                "failure": run.failure, "weights": run.weights, "native": run.native,
                "disk_bytes": run.disk_bytes,
                "weights_memory_bytes": row.weights_bytes,
                "weights_memory_kind": "host_tensors" if row.cpu else "vram_allocated",
                "peak_memory_bytes": row.peak_bytes, "peak_memory_kind": row.peak_source,
                "p50_ms": row.p50, "p90_ms": run.p90_ms, "n_timed": run.n_timed,
                **_repeat_columns(row), **_condition_columns(row),
                **efficiency_columns(row.efficiency or efficiency.of_run(run, rep.price_per_gpu_hour)),
                "quality": row.quality,
                "agreement": c.agreement.rate if c else None, "agreement_lo": c.agreement.lo if c else None,
                "agreement_hi": c.agreement.hi if c else None, "n_questions": c.agreement.n if c else None,
                "tv_mean": c.tv.mean if c else None, "kl_mean": c.kl.mean if c else None,
                "verdict": c.verdict.label if c else None,
                "verdict_by_modality": "; ".join(f"{m.modality}: {m.verdict.label}" for m in c.modalities)
                if c else None,
                "worse_on": ", ".join(m.modality for m in c.flagged()) if c else None,
                "modalities": parity.coverage_text(rep.modality_counts) if rep.modality_counts else None,
                "verdict_n_needed": c.verdict.n_needed if c else None,
                **{f"excess_{e.statistic.lower().replace(' ', '_')}{k}": getattr(e, v)
                   for e in (c.verdict.parts if c else ()) for k, v in (("", "diff"), ("_lo", "lo"), ("_hi", "hi"))},
                "delta_accuracy": m.mean if m else None, "delta_accuracy_lo": m.lo if m else None,
                "delta_accuracy_hi": m.hi if m else None, **sig.flat_columns(c.tests if c else None),
                "reference_run_id": rep.reference.run_id if rep.reference else None,
                "own_model_id": run.own_model_id, "paired_by": run.paired_by,
                "recommended": row.recommended, "best_for": row.best_for,
                "source": run.source, "created_at": str(run.created_at),
            })
    return _integers_stay_integers(pd.DataFrame(out))


# Counts and byte sizes: printed as integers beside unknowns (a float column would print 3820171.0).
INTEGER_COLUMNS = ("disk_bytes", "weights_memory_bytes", "peak_memory_bytes", "n_timed", "n_questions",
                   "energy_decisions", "decisions_per_pass")


def _integers_stay_integers(df: pd.DataFrame) -> pd.DataFrame:
    for col in INTEGER_COLUMNS:
        if col in df:
            df[col] = df[col].astype("Int64")
    return df


def _repeat_columns(row: Row) -> dict[str, Any]:
    rep = row.repeats
    out: dict[str, Any] = {"repeat_id": rep.repeat_id if rep else None, "repeat_runs_ok": rep.ok if rep else None}
    for name, stat in (("p50_ms", rep.p50_ms if rep else None), ("j_per_decision", rep.j_per_decision if rep else None)):
        for k in ("mean", "sd", "cv", "lo", "hi"):
            out[f"repeat_{name}_{k}"] = getattr(stat, k) if stat else None
    return out


def _condition_columns(row: Row) -> dict[str, Any]:
    run, f = row.run, row.floors
    return {"cpu_model": run.cpu_model, "cpu_cores": run.cpu_cores, "machine_id": run.machine_id,
            "load_avg_1m": run.load_avg_1m, "cpu_steal_share": run.cpu_steal_share,
            "cpu_others_share": run.cpu_others_share, "busy": row.busy,
            "latency_floor_ms": f.latency_floor_ms if f else None, "latency_floor_fraction": f.latency_fraction if f else None,
            "energy_floor_j": f.energy_floor_j if f else None, "energy_floor_fraction": f.energy_fraction if f else None,
            "floor_spec": f.spec.source if f else None}


def efficiency_columns(e: efficiency.Efficiency) -> dict[str, Any]:
    """The energy and cost figures of a row, as the csv and json name them."""
    d = e.as_dict()
    return {k: d[k] for k in ("j_per_decision", "j_above_idle_per_decision", "mean_w", "idle_w", "energy_phase_s",
                              "energy_decisions", "energy_note", "price_per_gpu_hour", "cost_per_million_decisions",
                              "time_basis")}


def throughput_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in t.items() if k not in ("efficiency", "run")}, **efficiency_columns(t["efficiency"])}
            for t in rows]


# What tells a csv row of the per-decision table from a batched run's: appended after flat_rows' columns, so a
# reader that takes those columns by position or by name reads the per-decision rows as before.
CSV_ROW_KIND_COLUMNS = ("row_kind", "decisions_per_pass", "decisions_per_s", "ms_per_pass")


def csv_rows(reports: list[GpuReport]) -> pd.DataFrame:
    """`report --format csv`: each group's per-decision rows (flat_rows; row_kind "decision", decisions_per_pass 1)
    followed by its batched runs (throughput(); row_kind "throughput", with decisions_per_pass, decisions_per_s and
    ms_per_pass, the energy and cost columns per decision at that batch). A group of batched runs alone has only
    the latter. A batched run's p50/p90 and parity columns stay empty: it timed whole passes at batch N and was
    compared with nothing, and a per-decision reader must not take its figures for batch-1 ones. Last, the runs
    that failed before their model or suite was known (row_kind "failed", with the first line of their `error`),
    which the markdown lists under its tables and the JSON as failed_runs: a store of only those is a header and
    their rows, never an empty file."""
    table = _table_rows(reports)
    failed = _integers_stay_integers(pd.DataFrame([_failed_csv_row(run) for run in getattr(reports, "failed", [])]))
    if failed.empty:
        return table
    if table.empty:
        return failed
    integers = [c for c in table.columns if pd.api.types.is_integer_dtype(table[c])]
    columns = [*table.columns, *(c for c in failed.columns if c not in table.columns)]  # error: the last one
    # all-empty columns are left out of the failed rows' frame: concatenating them would let pandas choose their type
    both = pd.concat([table, failed.dropna(axis=1, how="all")], ignore_index=True)
    return both.astype({c: "Int64" for c in integers}).reindex(columns=columns)


def _table_rows(reports: list[GpuReport]) -> pd.DataFrame:
    """The rows of the groups' tables: per-decision rows, each group's batched runs after them."""
    decisions = flat_rows(reports)
    batched = _integers_stay_integers(pd.DataFrame([{**_throughput_csv_row(rep, t), "_group": i}
                                                    for i, rep in enumerate(reports) for t in rep.throughput]))
    if batched.empty:  # every row a per-decision one (none at all: an empty csv, as before)
        return decisions if decisions.empty else decisions.assign(
            row_kind="decision", decisions_per_pass=1, decisions_per_s=float("nan"), ms_per_pass=float("nan"))
    if decisions.empty:  # only groups of batched runs
        return batched.drop(columns="_group")
    decisions = decisions.assign(_group=[i for i, rep in enumerate(reports) for _ in rep.rows], row_kind="decision",
                                 decisions_per_pass=1, decisions_per_s=float("nan"), ms_per_pass=float("nan"))
    # a batched row's empty cell must not turn a column of integers (cpu_cores) into floats
    integers = [c for c in decisions.columns if pd.api.types.is_integer_dtype(decisions[c])]
    columns = list(dict.fromkeys([*decisions.columns, *batched.columns]))  # the per-decision columns' order first
    columns = [c for c in columns if c not in (*CSV_ROW_KIND_COLUMNS, "_group")] + list(CSV_ROW_KIND_COLUMNS)
    # columns a batched run has no figure for are left out of its frame: concatenating all-empty columns would
    # let pandas choose their type
    both = pd.concat([decisions, batched.dropna(axis=1, how="all")], ignore_index=True)
    both = both.sort_values("_group", kind="stable")  # each group's per-decision rows, then its batched runs
    return both.astype({c: "Int64" for c in integers}).reindex(columns=columns).reset_index(drop=True)


def _failed_csv_row(run: StoredRun) -> dict[str, Any]:
    """A run that belongs to no table (it failed before its model or suite was known) under flat_rows' column
    names: where and what it ran, and why it failed, as the JSON's failed_runs has it."""
    first = (str(run.error or "").strip().splitlines() or [None])[0]
    return {
        "gpu": parity.gpu_label(run), "gpu_family": run.gpu_family, "host": run.host, "model_id": run.model_id,
        "suite_id": run.suite_id, "suite_hash": run.suite_hash, "variant": run.variant, "backend": run.backend,
        "kernel_path": run.kernel_path, "weight_format": run.weight_format, "run_id": run.run_id,
        "status": run.status, "failure": run.failure, "weights": run.weights, "native": run.native,
        "disk_bytes": run.disk_bytes, "cpu_model": run.cpu_model, "cpu_cores": run.cpu_cores,
        "machine_id": run.machine_id, "recommended": False, "source": run.source, "created_at": str(run.created_at),
        "row_kind": "failed", **dict.fromkeys(CSV_ROW_KIND_COLUMNS[1:]), "error": first,
    }


def _throughput_csv_row(rep: GpuReport, t: dict[str, Any]) -> dict[str, Any]:
    """A batched run (throughput()'s row) under flat_rows' column names, and the figures only it has."""
    run: StoredRun = t["run"]
    return {
        "gpu": rep.gpu, "gpu_family": rep.gpu_family, "host": run.host, "model_id": rep.model_id,
        "suite_id": rep.suite_id, "suite_hash": rep.suite_hash, "variant": t["variant"], "backend": run.backend,
        "kernel_path": run.kernel_path, "weight_format": run.weight_format, "run_id": run.run_id,
        "status": run.status, "weights": run.weights, "native": run.native, "disk_bytes": run.disk_bytes,
        "cpu_model": run.cpu_model, "cpu_cores": run.cpu_cores, "machine_id": run.machine_id,
        "load_avg_1m": run.load_avg_1m, "cpu_steal_share": run.cpu_steal_share,
        "cpu_others_share": run.cpu_others_share,
        **efficiency_columns(t["efficiency"]),
        "own_model_id": run.own_model_id, "paired_by": run.paired_by,
        "recommended": False,  # a pick is made from the per-decision rows only
        "source": run.source, "created_at": str(run.created_at),
        "row_kind": "throughput", "decisions_per_pass": t["batch"], "decisions_per_s": t["decisions_per_s"],
        "ms_per_pass": t["ms_per_pass"],
    }
