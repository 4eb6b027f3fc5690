"""`load`: the load generator's flags; `load-runs`: the stored load runs. The generator is quantbench.load, its store
quantbench.store.load."""

from __future__ import annotations

from typing import Annotated

import typer

from quantbench.cli.common import DbOpt, SharedOpt, _db, _fail, _reading, err, out
from quantbench.errors import ConfigError, QuantbenchError


def _numbers(text: str | None, flag: str, kind: type) -> list:
    if text is None:
        return []
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give comma-separated numbers, e.g. {flag} 1,8,32") from None


def load(
    endpoint: Annotated[str, typer.Option(help="Base URL of a SystemOne server (quantbench serve, or any other), e.g. http://127.0.0.1:8000")],
    concurrency: Annotated[str | None, typer.Option(help="Closed loop: clients per step, each with one request in flight, e.g. 1,8,32,128 (the default)")] = None,
    rate: Annotated[str | None, typer.Option(help="Open loop: Poisson arrivals, mean requests a second per step, e.g. 50,100")] = None,
    requests: Annotated[int, typer.Option(help="Each step ends after this many requests …")] = 512,
    seconds: Annotated[float, typer.Option(help="… or after this many seconds, whichever comes first")] = 30.0,
    suite: Annotated[str | None, typer.Option(help="Requests from this suite JSONL, round robin. Default: the built-in suite")] = None,
    card_example: Annotated[bool, typer.Option(help="Send the reference card's example request only")] = False,
    api_key: Annotated[str | None, typer.Option(envvar="QUANTBENCH_API_KEY", help="The server's API key")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take before it counts as a timeout")] = 60.0,
    warmup: Annotated[int, typer.Option(help="Untimed requests before the first step")] = 8,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for the server's /healthz to say ready")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the open loop's arrival times")] = 0,
    processes: Annotated[int, typer.Option(help="Generator processes, the clients (or the rate) split between them: more when the 'client CPU' column nears 100%")] = 1,
    retry_after: Annotated[bool, typer.Option("--retry-after/--no-retry-after", help="Closed loop: a client that gets 503 with Retry-After waits that long before its next request (--no-retry-after: it sends at once)")] = True,
    store: Annotated[bool, typer.Option(help="Store the load run in --db")] = True,
    db: DbOpt = None,
) -> None:
    """Drive a SystemOne server: decisions/s, p50/p99, queue time, errors and the saturation point per step; stored."""
    from quantbench.load import LoadSettings, run_load  # lazy: a fast --help
    from quantbench.load.table import breakdown_table, rate_text, run_title, saturation_line, steps_table
    from quantbench.store import Store
    from quantbench.store.load import write_load

    try:
        settings = LoadSettings(endpoint=endpoint, concurrency=_numbers(concurrency, "--concurrency", int),
                                rate=_numbers(rate, "--rate", float), requests=requests, seconds=seconds, suite=suite,
                                card_example=card_example, api_key=api_key, timeout_s=timeout, warmup=warmup,
                                ready_timeout_s=ready_timeout, seed=seed, processes=processes,
                                honor_retry_after=retry_after)
        settings.check()
        if store:
            Store(_db(db)).check_writable()  # before minutes of load, not after

        def progress(step) -> None:
            what = f"{step.rate:g}/s" if step.rate is not None else f"{step.concurrency} clients"
            err.print(f"  {what}: {step.sent} sent, {rate_text(step.decisions_per_s)} decisions/s", soft_wrap=True)

        result = run_load(settings, on_step=progress)
        run = result.run
        out.print(steps_table(result.steps, run_title(run.model_dump())))
        out.print(saturation_line(result.saturation, run.mode), soft_wrap=True)
        if (timing := breakdown_table(result.steps, result.breakdown)) is not None:
            out.print(timing)
        if store:
            load_id = write_load(Store(_db(db)), run, result.steps)
            out.print(f"load run {load_id} stored in {_db(db)}", soft_wrap=True)
    except QuantbenchError as e:
        _fail(e)


def load_runs(
    ids: Annotated[list[str] | None, typer.Argument(help="Load ids or unique prefixes (default: the newest --last)")] = None,
    last: Annotated[int, typer.Option(help="Show the newest N load runs")] = 10,
    fmt: Annotated[str, typer.Option("--format", help="table | markdown (for a README or a model card)")] = "table",
    db: DbOpt = None,
    shared: SharedOpt = None,
) -> None:
    """Stored load runs (`quantbench load`), newest first: each one's steps and saturation point."""
    from quantbench.analysis.load import step_saturation  # lazy: a fast --help
    from quantbench.load.table import load_run_markdown, run_title, saturation_line, steps_table
    from quantbench.store.load import has_load_tables, load_steps, step_records
    from quantbench.store.load import load_runs as stored_load_runs

    try:
        if fmt not in ("table", "markdown"):
            raise ConfigError(f"--format {fmt!r}: use table or markdown")
        store = _reading(db, shared)
        runs = stored_load_runs(store) if has_load_tables(store) else None
        if runs is None or runs.empty:
            raise ConfigError(f"no load runs in {store.describe()}; make one with `quantbench load --endpoint URL`"
                              + ("" if runs is not None else " (an older store: `quantbench migrate` adds the tables)"))
        if ids:
            chosen = []
            for prefix in ids:
                hits = runs[runs["load_id"].str.startswith(prefix)]
                if len(hits) != 1:
                    raise ConfigError(f"load id {prefix!r}: {'no' if hits.empty else len(hits)} stored load runs "
                                      f"match in {store.path}; give a longer prefix (`quantbench load-runs` lists them)")
                chosen.append(hits.iloc[0])
        else:
            chosen = [row for _, row in runs.head(last).iterrows()]
        for run in chosen:
            steps = step_records(load_steps(store, [run["load_id"]]))
            sat = step_saturation(steps)  # the steps' own 503s / 429s too: a one-step run that was refusing load
            if fmt == "markdown":
                print(load_run_markdown(run, steps, sat))  # plain: markdown is pasted, rich would wrap it
            else:
                out.print(steps_table(steps, f"{run_title(run)} — {run['load_id']}"))
                out.print(saturation_line(sat, run["mode"]), soft_wrap=True)
    except QuantbenchError as e:
        _fail(e)
