"""What `quantbench pull` merged and what `quantbench sources` reads, as the CLI prints them."""

from __future__ import annotations

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from quantbench import term
from quantbench.report.tables import machine_labels
from quantbench.store import Store, queries
from quantbench.store.pull import PullSummary


def print_pulled(store: Store, s: PullSummary, console: Console | None = None) -> None:
    """One line on the bundle, one on what it added, and a table of the new runs by machine."""
    console = console or term.console()
    say = lambda text: console.print(text, markup=False, soft_wrap=True, highlight=False)  # noqa: E731
    q = s.quantbench
    say(f"bundle {s.name} ({s.bundle_id}) from {s.source}: published by {s.publisher_host or 'an unnamed host'} on "
        f"{s.published_at or 'an unknown date'} with quantbench {q.get('version') or '?'} ({q.get('commit') or 'no git commit'}); "
        f"manifest sha256 {s.digest}; every file's sha256, size and rows verified")
    loads = (f"; load runs: {s.load_runs_added} new ({s.load_steps_added} steps), {s.load_runs_present} already here"
             if s.load_runs_in_bundle else "")
    say(f"merged into {store.path}: {s.runs_added} new runs ({s.answers_added:,} answers, {s.latencies_added:,} "
        f"timed decisions), {s.runs_present} already here{loads}")
    if s.already_pulled_at:
        say(f"this bundle was pulled before ({s.already_pulled_at}): nothing to add")
    if s.added is None or s.added.empty:
        return
    added = s.added.copy()
    added["where"] = machine_labels(added)  # as merge names them: machines of one host name apart
    grouped = added.groupby(["where", "model_id", "variant", "status"], dropna=False).size().reset_index(name="runs")
    t = Table(title="What came in")
    for col in ("Machine", "Model", "Variant", "Status", "Runs"):
        t.add_column(col, justify="right" if col == "Runs" else "left")
    for row in grouped.itertuples(index=False):  # stored text, not markup: a variant "ref [/x]" raised MarkupError
        t.add_row(*("—" if x is None or (isinstance(x, float) and x != x) else escape(str(x)) for x in row))
    console.print(t)


def print_sources(store: Store, console: Console | None = None) -> None:
    """The stores a reader reads (runs in each) and the bundles pulled into them."""
    console = console or term.console()
    t = Table(title="What the report, runs, compare, recommend and the dashboard read, in this order")
    for col in ("Source", "File", "Runs read from it"):
        t.add_column(col, justify="right" if col.startswith("Runs") else "left", overflow="fold")
    counts = queries.run_sources(store)["store"].value_counts() if store.beside and store.exists() else pd.Series()
    for source in store.sources:
        if not source.path.exists():
            t.add_row(source.label, escape(str(source.path)), "not made yet")
            continue
        n = int(counts.get(source.label, 0)) if store.beside else queries.run_count(Store(source.path))
        t.add_row(source.label, escape(str(source.path)), str(n))  # a path's "[x]" is text, not markup
    console.print(t)
    for source in store.sources:
        if not source.path.exists():
            continue
        pulled = queries.bundles(Store(source.path))
        if pulled.empty:
            continue
        b = Table(title=escape(f"Bundles pulled into {source.path}"))
        for col in ("Bundle", "Published by", "Published", "quantbench", "Pulled from", "Pulled", "Runs", "Added"):
            b.add_column(col, justify="right" if col in ("Runs", "Added") else "left", overflow="fold")
        for r in pulled.itertuples(index=False):
            b.add_row(escape(str(r.name)), escape(str(r.publisher_host)), f"{pd.Timestamp(r.published_at):%Y-%m-%d %H:%M}",
                      f"{r.quantbench_version} {r.quantbench_git_rev or ''}".strip(), escape(str(r.pulled_from)),
                      f"{pd.Timestamp(r.pulled_at):%Y-%m-%d %H:%M}", str(r.runs), str(r.runs_added))
        console.print(b)
