"""Where each run came from: your store, a pulled bundle (its name, publisher host and date), the results shipped
with quantbench. The report, `runs`, `recommend` and the dashboard say it the same way: the record's own source
fields and its `source` (quantbench.store.records.StoredRun), and these functions."""

from __future__ import annotations

from dataclasses import replace

from quantbench.store import Store
from quantbench.store.records import StoredRun, day_of


def origin_text(run: StoredRun) -> str:
    """Source, host and date of a run: "bundle h200-fixture (published by vm on 2026-12-03), measured on vm
    2026-12-02"."""
    when = day_of(run.created_at)
    return f"{run.source}, measured on {run.host or 'an unnamed host'}" + (f" {when}" if when else "")


def attach(store: Store, runs: list[StoredRun]) -> list[StoredRun]:
    """The runs with the store they were read from filled in where the read left it empty: a store read alone
    names no store on its runs, so they are the label of that store ("your store", "this store")."""
    own = store.sources[0]
    return [replace(run, store=run.store or own.label, store_kind=run.store_kind or own.kind) for run in runs]


def table_note(runs: list[StoredRun]) -> str | None:
    """One line under a report table naming where its rows came from, when they did not all come from one place
    (or came from a bundle): "Sources: bf16, int4 from bundle h200 (published by vm on 2026-12-03); fp8 from your
    store"."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        groups.setdefault(run.source, []).append(f"{run.variant or run.backend} ({run.host}, {day_of(run.created_at)})")
    if len(groups) <= 1 and not any(r.bundle_id for r in runs):
        return None
    return "Sources: " + "; ".join(f"{', '.join(names)} from {src}" for src, names in groups.items()) + "."
