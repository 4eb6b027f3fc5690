"""The commands over the results store: `runs`, `migrate`, `compare`, `report`, `export`, `merge`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from quantbench.cli.common import DbOpt, _db, _fail, out
from quantbench.errors import QuantbenchError


def runs(
    db: DbOpt = None,
    last: Annotated[int, typer.Option(help="Show the newest N runs")] = 30,
) -> None:
    """List stored runs, one self-describing row each."""
    from quantbench.report.tables import runs_table  # lazy: a fast --help
    from quantbench.store import Store, queries

    try:
        df = queries.newest_run_summaries(Store(_db(db)), last)
    except QuantbenchError as e:
        _fail(e)
    out.print(runs_table(df, f"runs in {_db(db)}"))


def migrate(db: DbOpt = None) -> None:
    """Bring a results store from an older quantbench up to this schema version (in place, keeping every row)."""
    from quantbench.store import Store  # lazy: a fast --help

    try:
        store = Store(_db(db))
        before = store.schema_version()
        after = store.migrate()
        out.print(f"{store.path}: schema version {before} → {after}")
    except QuantbenchError as e:
        _fail(e)


MARGIN_HELP = ("Verdict and TOST: the named margin, fixed before looking: card (2 points of agreement, 0.01 mean TV "
               "beyond the noise floor), mlperf99 / mlperf99.9 (accuracy at least 99% / 99.9% of BF16's), or numbers "
               "(agreement=0.02,tv=0.01 or accuracy=0.01)")
MARGIN_AGREEMENT_HELP = ("Verdict: top-answer agreement a variant may lose beyond the noise floor's and still count "
                         "as equivalent, a fraction (0.02 = 2 points); overrides --margin's")
MARGIN_TV_HELP = ("Verdict: mean total variation a variant may add beyond the noise floor's and still count as "
                  "equivalent; overrides --margin's")
PRICE_HELP = ("USD per GPU hour: adds cost per 1M decisions (from the mean model time per decision at batch 1, or "
              "decisions/s where batched)")


def compare(
    run_id: Annotated[str, typer.Argument(help="Candidate run id (or a unique prefix)")],
    reference: Annotated[str | None, typer.Option(help="Reference run (default: BF16 of the same model, suite, GPU)")] = None,
    noise_floor: Annotated[str | None, typer.Option(help="Noise-floor run (default: the reference's)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
    margin: Annotated[str, typer.Option(help=MARGIN_HELP)] = "card",
    margin_agreement: Annotated[float | None, typer.Option(help=MARGIN_AGREEMENT_HELP)] = None,
    margin_tv: Annotated[float | None, typer.Option(help=MARGIN_TV_HELP)] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(help=PRICE_HELP)] = None,
    db: DbOpt = None,
) -> None:
    """Parity of one run with its BF16 reference, beside the noise floor, with a verdict; then speed, energy and
    cost per decision of both runs."""
    from quantbench.analysis import efficiency  # lazy: a fast --help
    from quantbench.analysis.parity import compare as compare_runs
    from quantbench.analysis.stats import ParityError, margins_from
    from quantbench.report.tables import print_comparison, print_efficiency
    from quantbench.store import Store

    try:
        if fmt not in ("table", "json"):
            raise ParityError(f"--format {fmt!r}: use table or json")
        price = efficiency.check_price(price_per_gpu_hour)
        store = Store(_db(db))
        comp = compare_runs(store, run_id, reference, noise_floor, margins=margins_from(margin, margin_agreement, margin_tv))
        effs = {name: efficiency.of_stored(store, str(run["run_id"]), price)
                for name, run in (("candidate", comp.candidate), ("reference", comp.reference))}
        if fmt == "json":
            print(json.dumps({**comp.to_dict(), "efficiency": {k: e.as_dict() for k, e in effs.items()}},
                             indent=2, default=str))
        else:
            print_comparison(comp)
            print_efficiency(comp, effs)
    except QuantbenchError as e:
        _fail(e)


def report(
    fmt: Annotated[str, typer.Option("--format", help="markdown | csv | json")] = "markdown",
    gpu: Annotated[str | None, typer.Option(help="A GPU family (hopper, cpu …) or part of a GPU name")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model id")] = None,
    vram_budget_gib: Annotated[float | None, typer.Option(help="Rule: peak memory must fit this budget (GiB)")] = None,
    min_agreement: Annotated[float | None, typer.Option(help="Rule: minimum agreement with BF16 (0.95 or 95)")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs made at or after this date / ISO time (UTC)")] = None,
    history: Annotated[bool, typer.Option("--all", help="Every kernel generation's newest run and every fixture build, not only the newest of each variant")] = False,
    margin: Annotated[str, typer.Option(help=MARGIN_HELP)] = "card",
    margin_agreement: Annotated[float | None, typer.Option(help=MARGIN_AGREEMENT_HELP)] = None,
    margin_tv: Annotated[float | None, typer.Option(help=MARGIN_TV_HELP)] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(help=PRICE_HELP)] = None,
    db: DbOpt = None,
) -> None:
    """The "Which quant should I use?" table, one per GPU, from the store."""
    from quantbench.report import report_text  # lazy: a fast --help

    try:
        # Plain print: the report is meant to be pasted (a model card), so no wrapping or markup from rich.
        print(report_text(str(_db(db)), fmt, gpu, model, vram_budget_gib, min_agreement, since=since,
                          history=history, margin=margin, margin_agreement=margin_agreement, margin_tv=margin_tv,
                          price_per_gpu_hour=price_per_gpu_hour), end="")
    except QuantbenchError as e:
        _fail(e)


def export(
    out_path: Annotated[str, typer.Option("--out", help="Parquet file (or folder) to write")] = "results.parquet",
    db: DbOpt = None,
) -> None:
    """Export the store to Parquet, to share results with other machines."""
    from quantbench.report.tables import print_exported  # lazy: a fast --help
    from quantbench.store import Store
    from quantbench.store.transfer import export as export_runs
    from quantbench.store.transfer import exported_load_counts

    try:
        store = Store(_db(db))
        paths = export_runs(store, out_path)
        print_exported(store, paths)
        for path in paths:
            load_runs, steps = exported_load_counts(path)
            if load_runs:
                out.print(f"and {load_runs} load runs ({steps} steps) to {path}", markup=False, soft_wrap=True)
    except QuantbenchError as e:
        _fail(e)


def merge(
    sources: Annotated[list[str], typer.Argument(help="Parquet files, other .duckdb stores, or folders of them")],
    db: DbOpt = None,
) -> None:
    """Merge results from other machines into this store (idempotent: merging twice adds nothing)."""
    from quantbench.report.tables import print_merged  # lazy: a fast --help
    from quantbench.store import Store
    from quantbench.store.transfer import PartialMergeError
    from quantbench.store.transfer import merge as merge_sources

    store = Store(_db(db))
    try:
        summary = merge_sources(store, sources)
    except PartialMergeError as e:  # the sources before the failing one are in: say what they added
        print_merged(store, e.summary)
        _print_merged_load_runs(e.summary)
        _fail(e)
    except QuantbenchError as e:
        _fail(e)
    print_merged(store, summary)
    _print_merged_load_runs(summary)


def _print_merged_load_runs(summary) -> None:
    """Per source that carries load runs (`quantbench load`): how many came in, and whose server they measured."""
    for s in summary.sources:
        if not s.load_runs_in_source:
            continue
        out.print(f"load runs: {s.load_runs_added} new ({s.load_steps_added} steps), {s.load_runs_present} already "
                  f"here, from {s.path}", markup=False, soft_wrap=True)
        for n, variant, gpu, kernel, host in s.load_added:
            out.print(f"  {n} × {variant or 'a server'} on {gpu or 'an unnamed device'}"
                      + (f" ({kernel})" if kernel else "") + f", measured from {host}", markup=False, soft_wrap=True)
