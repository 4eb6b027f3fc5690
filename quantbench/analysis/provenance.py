"""Where each run came from: your store, a pulled bundle (its name, publisher host and date), the results shipped
with quantbench. The report, `runs`, `recommend` and the dashboard say it the same way, from these functions."""

from __future__ import annotations

from typing import Any

import pandas as pd

from quantbench.analysis.parity import records
from quantbench.store import Store, queries

SOURCE_COLUMNS = ("store", "store_kind", "bundle_id", "bundle", "bundle_host", "bundle_published_at", "pulled_from",
                  "pulled_at")


def _day(value: Any) -> str | None:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return f"{pd.Timestamp(value):%Y-%m-%d}"


def source_text(run: dict[str, Any]) -> str:
    """A run's source in a few words: "bundle h200-fixture (published by vm on 2026-12-03)", "your store",
    "shipped with quantbench", or "this store" (a store named by --db, for a run measured into it or merged)."""
    bundle = run.get("bundle") or run.get("bundle_id")
    if bundle:
        by = run.get("bundle_host")
        day = _day(run.get("bundle_published_at"))
        detail = " ".join(x for x in (f"published by {by}" if by else None, f"on {day}" if day else None) if x)
        return f"bundle {bundle}" + (f" ({detail})" if detail else "")
    return str(run.get("store") or "this store")


def origin_text(run: dict[str, Any]) -> str:
    """Source, host and date of a run: "bundle h200-fixture (published by vm on 2026-12-03), measured on vm
    2026-12-02"."""
    when = _day(run.get("created_at"))
    return f"{source_text(run)}, measured on {run.get('host') or 'an unnamed host'}" + (f" {when}" if when else "")


def attach(store: Store, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every run dict its source columns (SOURCE_COLUMNS) and `source`, the text of source_text."""
    by_id = {str(r["run_id"]): r for r in records(queries.run_sources(store))}
    own = store.sources[0]  # a store read alone: its runs are "your store" or "this store"
    for run in runs:
        found = by_id.get(str(run["run_id"]), {})
        for col in SOURCE_COLUMNS:
            run[col] = found.get(col)
        run["store"] = run["store"] or own.label
        run["store_kind"] = run["store_kind"] or own.kind
        run["source"] = source_text(run)
    return runs


def table_note(runs: list[dict[str, Any]]) -> str | None:
    """One line under a report table naming where its rows came from, when they did not all come from one place
    (or came from a bundle): "Sources: bf16, int4 from bundle h200 (published by vm on 2026-12-03); fp8 from your
    store"."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        groups.setdefault(run.get("source") or "this store", []).append(
            str(run.get("variant") or run.get("backend")) + f" ({run.get('host')}, {_day(run.get('created_at'))})")
    if len(groups) <= 1 and not any(r.get("bundle_id") for r in runs):
        return None
    return "Sources: " + "; ".join(f"{', '.join(names)} from {src}" for src, names in groups.items()) + "."
