"""The commands over the results store: `runs`, `migrate`, `compare`, `report`, `export`, `merge`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from quantbench.cli.common import DbOpt, SharedOpt, _db, _fail, _reading, err, out
from quantbench.errors import ConfigError, QuantbenchError


def runs(
    db: DbOpt = None,
    last: Annotated[int, typer.Option(help="Show the newest N runs that pass the filters (0: all)")] = 30,
    model: Annotated[str | None, typer.Option(help="Only runs of this model id (or part of it)")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only runs on this GPU: cpu, a family (hopper …) or part of its name")] = None,
    variant: Annotated[str | None, typer.Option(help="Only this variant (int4, nvfp4-unpacked …) or backend (nvfp4)")] = None,
    status: Annotated[str | None, typer.Option(help="ok | failed")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json")] = "table",
    shared: SharedOpt = None,
) -> None:
    """List stored runs, one self-describing row each (with where it came from), newest last."""
    from quantbench.analysis.select import RunFilter, summaries  # lazy: a fast --help
    from quantbench.report.tables import runs_table
    from quantbench.store import queries
    from quantbench.store.records import SOURCE_FIELDS, SUMMARY_FIELDS

    try:
        if fmt not in RUNS_FORMATS:
            raise ConfigError(f"--format {fmt!r}: use one of {', '.join(RUNS_FORMATS)}")
        if last < 0:
            raise ConfigError(f"--last {last}: give 0 (every run) or a positive number")
        run_filter = RunFilter(model=model, gpu=gpu, variant=variant, status=status)
        store = _reading(db, shared)
        runs = summaries(store, run_filter)
        # Where each run came from is listed unless the store holds no run at all.
        sourced = bool(runs) or queries.run_count(store) > 0
    except QuantbenchError as e:
        _fail(e)
    if last:
        runs = runs[-last:]
    if fmt == "table":
        where = store.describe() + ("" if run_filter.describe() == "no filter" else f", {run_filter.describe()}")
        out.print(runs_table(runs, f"runs in {where}", sourced=sourced))
        return
    columns = [*SUMMARY_FIELDS, *SOURCE_FIELDS, *(("source",) if sourced else ())]
    rows = [{c: getattr(r, c) for c in columns} for r in runs]
    for row in rows:  # timestamps as text: one row a record
        for col in row:
            if col.endswith("_at") and row[col] is not None:
                row[col] = str(row[col])
    if fmt == "csv":
        import pandas as pd

        print(pd.DataFrame(rows, columns=columns, dtype=object).to_csv(index=False), end="")
    else:
        print(json.dumps(rows, indent=2, default=str))


RUNS_FORMATS = ("table", "csv", "json")


def migrate(db: DbOpt = None) -> None:
    """Bring a results store from an older quantbench up to this schema version (in place, keeping every row)."""
    from quantbench.store import Store  # lazy: a fast --help

    try:
        store = Store(_db(db))
        if not store.path.exists():  # a mistyped --db made a new empty store and said "schema version 0 → 9"
            raise ConfigError(f"no results store at {store.path}: nothing to migrate; give the store's file with --db")
        before = store.schema_version()
        after = store.migrate()
        out.print(f"{store.path}: schema version {before} → {after}", markup=False)
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
    run_id: Annotated[str, typer.Argument(help="Candidate: a run id (or a unique prefix), or a variant or backend "
                                               "(int4, nvfp4-unpacked): its newest successful run, on this machine "
                                               "when it has one (--gpu / --model narrow it)")],
    reference: Annotated[str | None, typer.Option(help="Reference run or variant (default: BF16 of the same model, suite, GPU)")] = None,
    noise_floor: Annotated[str | None, typer.Option(help="Noise-floor run, or `noise-floor`: the newest one (default: the reference's)")] = None,
    gpu: Annotated[str | None, typer.Option(help="Choose the runs named by variant on this GPU (cpu, a family, part of its name)")] = None,
    model: Annotated[str | None, typer.Option(help="Choose the runs named by variant of this model (or part of its id)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
    margin: Annotated[str, typer.Option(help=MARGIN_HELP)] = "card",
    margin_agreement: Annotated[float | None, typer.Option(help=MARGIN_AGREEMENT_HELP)] = None,
    margin_tv: Annotated[float | None, typer.Option(help=MARGIN_TV_HELP)] = None,
    price_per_gpu_hour: Annotated[float | None, typer.Option(help=PRICE_HELP)] = None,
    db: DbOpt = None,
    shared: SharedOpt = None,
) -> None:
    """Parity of one run with its BF16 reference, beside the noise floor, with a verdict; then speed, energy and
    cost per decision of both runs."""
    from quantbench.analysis import efficiency  # lazy: a fast --help
    from quantbench.analysis.margins import margins_from
    from quantbench.analysis.parity import compare as compare_runs
    from quantbench.analysis.select import RunFilter, select_run
    from quantbench.analysis.stats import ParityError
    from quantbench.report.tables import print_comparison, print_efficiency

    try:
        if fmt not in ("table", "json"):
            raise ParityError(f"--format {fmt!r}: use table or json")
        price = efficiency.check_price(price_per_gpu_hour)
        for what, given in (("RUN", run_id), ("--reference", reference), ("--noise-floor", noise_floor)):
            if given is not None and not given.strip():  # "" matched every run: the newest of any variant was taken
                raise ParityError(f"{what} is empty; give a run id (or a unique prefix), or a variant or backend "
                                  "that `quantbench runs` lists (int4, fp8, nvfp4-packed ...)")
        store = _reading(db, shared)
        chosen = RunFilter(model=model, gpu=gpu)
        run_id, note = select_run(store, run_id, chosen)
        for flag, given in (("reference", reference), ("noise_floor", noise_floor)):
            if given:  # a run id, or a variant (`--reference bf16`, `--noise-floor noise-floor`): its newest run
                picked, picked_note = select_run(store, given, chosen)
                reference, noise_floor = (picked, noise_floor) if flag == "reference" else (reference, picked)
                note = "; ".join(n for n in (note, picked_note) if n)
        if note:
            err.print(note, markup=False, soft_wrap=True, highlight=False)
        comp = compare_runs(store, run_id, reference, noise_floor, margins=margins_from(margin, margin_agreement, margin_tv))
        effs = {name: efficiency.of_run(run, price) for name, run in (("candidate", comp.candidate),
                                                                       ("reference", comp.reference))}
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
    gpu: Annotated[str | None, typer.Option(help="A GPU family (hopper, cpu …), part of a GPU name, or all. Default: "
                                                 "this machine's GPU (or CPU) when the store has runs of it, else all")] = None,
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
    shared: SharedOpt = None,
) -> None:
    """The "Which quant should I use?" table, one per GPU, from the store."""
    from quantbench.report import report_text  # lazy: a fast --help

    try:
        store = _reading(db, shared)
        gpu, host = _default_gpu(store, gpu, "report")
        # Plain print: the report is meant to be pasted (a model card), so no wrapping or markup from rich.
        print(report_text(store, fmt, gpu, model, vram_budget_gib, min_agreement, host=host, since=since,
                          history=history, margin=margin, margin_agreement=margin_agreement, margin_tv=margin_tv,
                          price_per_gpu_hour=price_per_gpu_hour), end="")
    except QuantbenchError as e:
        _fail(e)


def _default_gpu(store, gpu: str | None, command: str) -> tuple[str | None, str | None]:
    """(--gpu, host) for a reader: `all` is every GPU; none given is this machine's GPU (its host's CPU) when the
    store has runs of it, else every GPU. Says on stderr which, so stdout stays the table."""
    from quantbench.analysis.select import ALL, RunFilter, summaries, this_machine  # lazy: a fast --help

    if gpu is not None:
        return (None if gpu.strip().lower() == ALL else gpu), None
    here, host, label = this_machine()
    if len(summaries(store, RunFilter(gpu=here, host=host))):
        err.print(f"{command}: {label}, this machine (--gpu all: every GPU; --gpu NAME: another)", markup=False,
                  soft_wrap=True, highlight=False)
        return here, host
    err.print(f"{command}: no runs of this machine ({label}) in {store.describe()}: every GPU", markup=False,
              soft_wrap=True, highlight=False)
    return None, None


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


def recommend(
    gpu: Annotated[str | None, typer.Option(help="A GPU family (hopper, cpu …), part of a GPU name, or all. Default: "
                                                 "this machine's GPU (or CPU) when the store has runs of it, else all")] = None,
    max_latency_ms: Annotated[float | None, typer.Option(help="Latency target per decision (ms) at --concurrency clients")] = None,
    concurrency: Annotated[int, typer.Option(help="Clients in flight the latency target holds at (from load runs where they exist, else batch-1 figures)")] = 1,
    percentile: Annotated[int, typer.Option(help="The latency percentile the target is for: 50, 90 or 99")] = 50,
    max_vram_gib: Annotated[float | None, typer.Option(help="Peak VRAM budget (GiB); peak host RSS on a CPU")] = None,
    max_energy_j: Annotated[float | None, typer.Option(help="Energy budget per decision (J), GPU runs")] = None,
    margin: Annotated[float, typer.Option(help="Quality margin per modality: agreement a variant may lose beyond the noise floor's (0.02 = 2 points)")] = 0.02,
    min_agreement: Annotated[float, typer.Option(help="Minimum agreement with BF16 (0.95 or 95)")] = 0.95,
    objective: Annotated[str, typer.Option(help="Among the variants that qualify: memory (smallest weights) | latency | energy")] = "memory",
    model: Annotated[str | None, typer.Option(help="Only this model id (or part of it)")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs made at or after this date / ISO time (UTC)")] = None,
    synthetic: Annotated[bool, typer.Option("--synthetic", help="List the tables of synthetic (random) weights too (speed and memory only: never a pick)")] = False,
    fmt: Annotated[str, typer.Option("--format", help="text | json")] = "text",
    db: DbOpt = None,
    shared: SharedOpt = None,
) -> None:
    """One pick per GPU under your constraints (latency at a concurrency, VRAM, energy, quality per modality), with
    the evidence for it, or which constraint no variant meets. Exits 1 when nothing qualifies anywhere."""
    from quantbench.analysis.constraints import Constraints, answer  # lazy: a fast --help
    from quantbench.report.constraints_text import answers_text

    try:
        if fmt not in ("text", "json"):
            raise ConfigError(f"--format {fmt!r}: use text or json")
        if 1.0 < min_agreement <= 100.0:
            min_agreement /= 100.0  # --min-agreement 95 means 95%
        c = Constraints(max_latency_ms=max_latency_ms, concurrency=concurrency, percentile=percentile,
                        max_vram_gib=max_vram_gib, max_energy_j=max_energy_j, margin=margin,
                        min_agreement=min_agreement, objective=objective)
        store = _reading(db, shared)
        gpu, host = _default_gpu(store, gpu, "recommend")
        answers = answer(store, c, gpu=gpu, host=host, model=model, since=since)
        if not answers:
            raise ConfigError(f"no runs match in {store.describe()}" + (f" for --gpu {gpu}" if gpu else "")
                              + "; `quantbench runs` lists what the store holds")
    except QuantbenchError as e:
        _fail(e)
    if fmt == "json":
        print(json.dumps({"constraints": c.describe(), "answers": [a.as_dict() for a in answers]}, indent=2,
                         default=str))
    else:
        print(answers_text(answers, synthetic), end="")
    if not any(a.pick for a in answers):
        raise typer.Exit(1)
