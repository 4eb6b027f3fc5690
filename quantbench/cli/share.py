"""Sharing results as bundles: `publish` (your runs as Parquet + a manifest), `pull` (someone's bundle, verified,
merged) and `sources` (what a reader reads: your store, pulled bundles, the shipped results)."""

from __future__ import annotations

import datetime as dt
import socket
from pathlib import Path
from typing import Annotated

import typer

from quantbench.cli.common import DbOpt, SharedOpt, _db, _fail, _not_a_folder, _reading, out
from quantbench.errors import ConfigError, QuantbenchError

GIB = 1 << 30


def publish(
    out_path: Annotated[Path | None, typer.Option("--out", help="A new folder, or an archive: .tar, .tar.gz, .zip. "
                                                               "Default: ./quantbench-bundle-HOST-DATE/")] = None,
    name: Annotated[str | None, typer.Option(help="The bundle's name (default: from the GPUs and the date)")] = None,
    model: Annotated[str | None, typer.Option(help="Only runs of this model id (or part of it)")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only runs on this GPU: cpu, a family (hopper …) or part of its name")] = None,
    variant: Annotated[str | None, typer.Option(help="Only this variant or backend")] = None,
    suite: Annotated[str | None, typer.Option(help="Only runs of this suite (its id, or the start of its hash)")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only the runs a sweep made (its name, or its .toml file)")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs made at or after this date / ISO time (UTC)")] = None,
    with_failed: Annotated[bool, typer.Option(help="Failed runs too (their errors say what went wrong)")] = False,
    load_runs: Annotated[bool, typer.Option("--load-runs/--no-load-runs", help="The load runs (`quantbench load`) of the same models and GPUs")] = True,
    db: DbOpt = None,
) -> None:
    """Write the selected runs as a result bundle: Parquet files and a manifest with every file's sha256, readable
    without quantbench (docs/BUNDLES.md). Share the folder or archive, and the sha256 printed for its manifest."""
    from quantbench.analysis.select import RunFilter, bundle_choice  # lazy: a fast --help
    from quantbench.run.runner import provenance
    from quantbench.store import Store
    from quantbench.store.bundle import publish as write_bundle

    try:
        store = Store(_db(db))
        if not store.path.exists():
            raise ConfigError(f"no results store at {store.path}; run `quantbench demo` first, or give --db")
        choice = bundle_choice(store, RunFilter(model=model, gpu=gpu, variant=variant), suite=suite, sweep=sweep,
                               since=since, with_failed=with_failed, load_runs=load_runs)
        day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        host = socket.gethostname()
        label = name or "-".join([*(g.split(" (")[0].replace("NVIDIA ", "").replace(" ", "-") for g in choice.gpus[:3]),
                                  day]).lower()
        target = out_path or Path(f"quantbench-bundle-{host}-{day}")
        published = write_bundle(store, target, choice.run_ids, choice.load_ids, name=label,
                                 selection=choice.selection, publisher={**provenance(), "host": host})
    except QuantbenchError as e:
        _fail(e)
    m = published.manifest
    out.print(f"bundle {m['name']} ({m['bundle_id']}) written to {published.path}: {len(m['run_ids'])} runs"
              + (f", {len(m['load_ids'])} load runs" if m["load_ids"] else "")
              + f" on {', '.join(choice.gpus) or 'servers'}", markup=False, soft_wrap=True, highlight=False)
    for f in published.files:
        out.print(f"  {f['name']}: {f['rows']:,} rows, {f['bytes']:,} bytes, sha256 {f['sha256']}", markup=False,
                  soft_wrap=True, highlight=False)
    out.print(f"manifest.json sha256 {published.digest}", markup=False, soft_wrap=True, highlight=False)
    out.print(f"Others pull it with: quantbench pull {published.path} --sha256 {published.digest}  (or its URL)",
              markup=False, soft_wrap=True, highlight=False)


def pull(
    source: Annotated[str, typer.Argument(help="A bundle: its folder, a .tar / .tar.gz / .zip of it, or an http(s) "
                                               "URL (of the archive, or of the folder, ending in /)")],
    sha256: Annotated[str | None, typer.Option("--sha256", help="The manifest's sha256 as its publisher announced it: refused if it differs")] = None,
    max_bytes: Annotated[float, typer.Option("--max-gib", help="Refuse a bundle larger than this (GiB, downloaded and unpacked)")] = 2.0,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for a connection or for the next bytes of a download")] = 30.0,
    deadline: Annotated[float, typer.Option(help="Seconds the whole download may take")] = 600.0,
    db: Annotated[Path | None, typer.Option("--db", help="The store to merge into. Default: $QUANTBENCH_HOME/pulled.duckdb, read beside your own")] = None,
) -> None:
    """Verify a result bundle (every file's sha256, sizes, rows, schema) and merge it; a bundle that fails any check
    is refused, naming the file and the reason, with nothing merged. Pulling it again adds nothing."""
    from quantbench.report.sharing import print_pulled  # lazy: a fast --help
    from quantbench.store import Store, home
    from quantbench.store.fetch import Limits
    from quantbench.store.pull import pull as pull_bundle

    try:
        if max_bytes <= 0 or timeout <= 0 or deadline <= 0:
            raise ConfigError("--max-gib, --timeout and --deadline take positive numbers")
        target = _not_a_folder(Path(db), "--db") if db else home.pulled_db()  # a folder: DuckDB's line named no flag
        if not db:
            target.parent.mkdir(parents=True, exist_ok=True)
        store = Store(target)
        store.check_writable()
        summary = pull_bundle(store, source, Limits(max_bytes=int(max_bytes * GIB), timeout_s=timeout,
                                                   deadline_s=deadline), sha256)
    except QuantbenchError as e:
        _fail(e)
    print_pulled(store, summary)


def sources(db: DbOpt = None, shared: SharedOpt = None) -> None:
    """What the readers (report, runs, compare, recommend, the dashboard) read: your store, pulled bundles and the
    results shipped with quantbench, with how many runs each holds and the bundles pulled."""
    from quantbench.report.sharing import print_sources  # lazy: a fast --help

    try:
        print_sources(_reading(db, shared))
    except QuantbenchError as e:
        _fail(e)
