"""The driver of `quantbench sweep`: plan, skip what is finished, make missing variants, run, store, summarise.

The unit of work is `runner.execute(spec) -> RunResult`, the same fresh-process run `quantbench run` does; it
writes nothing. Results come back to this driver, the only process that writes DuckDB, from whichever executor
ran them (`local`: this host; `ray`: a Ray cluster). The driver claims the runs it will run
(quantbench.sweep.claims) and gives each claim back once its run is stored.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quantbench import term
from quantbench.errors import ConfigError, QuantbenchError
from quantbench.models.scorer import describe as describe_scorer
from quantbench.models.scorer import require_trust
from quantbench.report import report_for_this_machine
from quantbench.report.tables import runs_table
from quantbench.run.record import RunResult
from quantbench.run.spec import is_remote
from quantbench.store import Store, StoreError, queries
from quantbench.sweep.claims import Claims, Holder
from quantbench.sweep.executor import Event, failed_result
from quantbench.sweep.local import LocalExecutor
from quantbench.sweep.make import make_missing
from quantbench.sweep.planning import PlannedRun, plan, split_finished, text_or_none
from quantbench.sweep.spec import Sweep, load_sweep

WAIT_POLL_S = 2.0  # how often a sweep waiting for another sweep's runs looks again
WAIT_REMIND_S = 300.0  # how often it says that it still waits


@dataclass
class SweepOutcome:
    planned: int = 0
    skipped: int = 0  # already finished (same config hash, status ok)
    unplaceable: list[tuple[PlannedRun, str]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # stored by this sweep, in the order they finished
    ok: int = 0
    failed: int = 0
    unsaved: list[str] = field(default_factory=list)  # runs the store could not take: where each was kept
    not_started: int = 0  # placeable runs never started (the sweep was told to stop)
    by_others: int = 0  # runs another sweep of the store had claimed and stored while this one waited
    interrupted: int = 0  # runs stopped in flight by a stop signal and stored so


class _Display:
    """One progress line for the whole matrix, and one line per finished run above it."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[running]} in flight · [green]{task.fields[ok]} ok[/] · "
                       "[red]{task.fields[failed]} failed[/]"),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("sweep", total=total, running=0, ok=0, failed=0)
        self.running = self.ok = self.failed = 0

    def __enter__(self) -> _Display:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, event: Event) -> None:
        self.running += 1
        if not self.console.is_terminal:  # to a file or a pipe the bar is not drawn: say when each run starts
            self.progress.console.print(f"▶ {escape(event.run.label)} started ({escape(str(event.where))})")
        self.progress.update(self.task, running=self.running)

    def finished(self, event: Event) -> None:
        run = event.result.run
        self.running -= 1
        if run.status == "ok":
            self.ok += 1
            seconds = (run.finished_at - run.created_at).total_seconds()
            self.progress.console.print(f"[green]✓[/] {escape(event.run.label)} [dim]({escape(str(event.where))}, "
                                        f"{seconds:.1f} s)[/]")
        else:
            self.failed += 1
            first = (run.error or "").strip().splitlines()[:1]
            self.progress.console.print(f"[red]✗ {escape(event.run.label)}: {run.failure}[/] "
                                        f"[dim]({escape(str(event.where))})[/] " + escape(first[0][:200] if first else ""))
        self.progress.update(self.task, advance=1, running=self.running, ok=self.ok, failed=self.failed)


def run_sweep(sweep: Sweep, executor: Any, store: Store, *, rerun: bool = False,
              console: Console | None = None) -> SweepOutcome:
    """Plan, skip what is finished, make missing variants, run the rest on `executor`, store every result.

    Runs another live sweep of the store has claimed (quantbench.sweep.claims) are not run twice: this sweep runs
    the others first, then waits for those; the ones it stores ok are skipped here, and any it does not (failed,
    stopped, or it died) run here, as a sweep run again would run them."""
    console = console or Console(stderr=True)
    store.check_writable()  # refused before any run, not after the matrix
    runs = plan(sweep)
    refuse_untrusted_scorers(sweep, runs)  # before any run or quantize: a model whose own scorer may not run
    began = dt.datetime.now(dt.UTC)
    todo, skipped = split_finished(runs, store, executor.accepts, rerun)
    outcome = SweepOutcome(planned=len(runs), skipped=len(skipped))
    placeable = []
    for run in todo:
        why = executor.placeable(run)
        if why:
            outcome.unplaceable.append((run, why))
        else:
            placeable.append(run)
    console.print(f"[bold]sweep {escape(sweep.name)}[/]: {len(runs)} runs planned, {len(skipped)} already finished"
                  + (f", {len(outcome.unplaceable)} cannot be placed" if outcome.unplaceable else "")
                  + f"; {len(placeable)} to run on {executor.where()}")
    for run, why in outcome.unplaceable:
        console.print(f"[yellow]not run:[/] {escape(run.label)}: {escape(why)}")
    if placeable:
        with Claims(store.path, sweep.name) as claims:
            _run_claimed(placeable, executor, store, outcome, console, claims, since=began if rerun else None)
    # Told to stop, the executor starts no more runs: count them, or the summary reads as a finished matrix.
    outcome.not_started = len(placeable) - outcome.ok - outcome.failed - outcome.by_others
    return outcome


def _run_claimed(runs: list[PlannedRun], executor: Any, store: Store, outcome: SweepOutcome, console: Console,
                 claims: Claims, since: dt.datetime | None) -> None:
    """Run the runs no other live sweep of the store has claimed, then wait for those it has and run here what it
    left unfinished. `since`: with --rerun, only what the other sweep stored since this one began counts."""
    while runs:
        found = claims.claim(r.claim_key() for r in runs)
        _say_dropped(console, found.dropped)
        waiting = [r for r in runs if r.claim_key() in found.held]
        mine = [r for r in runs if r.claim_key() not in found.held]
        if waiting:
            _say_waiting(console, waiting, found.held, len(mine))
        _run(mine, executor, store, outcome, console, claims)
        if not waiting or not _wait_for(waiting, claims, console):
            return
        runs, done = split_finished(waiting, store, executor.accepts, since=since)
        outcome.by_others += len(done)
        console.print(f"{len(done)} of the {len(waiting)} runs this sweep waited for were stored by the sweep that "
                      f"held them; {len(runs)} left to run here")


def _run(runs: list[PlannedRun], executor: Any, store: Store, outcome: SweepOutcome, console: Console,
         claims: Claims) -> None:
    """Make the variants `runs` need, run them on `executor` and store each result as it comes (the driver is the
    only DuckDB writer), giving its claim back once stored."""

    def store_result(run: PlannedRun, result: RunResult) -> None:
        try:
            outcome.run_ids.append(store.write_run(result))
        except StoreError as e:
            # The store refused it (disk full, file gone): write_run kept the run in a side file and says where.
            # Raising here dropped the sweep mid-matrix, and the runs in flight on other GPUs died unstored.
            outcome.unsaved.append(str(e))
            console.print(f"[red]{escape(str(e))}[/]")
        claims.release([run.claim_key()])
        if result.run.status == "ok":
            outcome.ok += 1
        else:
            outcome.failed += 1
            outcome.interrupted += result.run.failure == "interrupted"

    if not runs:
        return
    unmade = make_missing(runs, console)
    with _Display(console, len(runs)) as display:
        ready = []
        for run in runs:
            if run.make in unmade:
                event = Event("finished", run, failed_result(run.spec, "error", unmade[run.make],
                                                             repeat=run.repeat_tag), "quantize")
                store_result(run, event.result)
                display.started(event)
                display.finished(event)
            else:
                ready.append(run)
        for event in executor.run(ready):
            if event.kind == "started":
                display.started(event)
            else:
                store_result(event.run, event.result)
                display.finished(event)


def _say_waiting(console: Console, waiting: list[PlannedRun], held: dict[str, Holder], others: int) -> None:
    """Who holds which of this sweep's runs, and what this sweep does about it."""
    by_holder: dict[Holder, int] = {}
    for run in waiting:
        holder = held[run.claim_key()]
        by_holder[holder] = by_holder.get(holder, 0) + 1
    for holder, n in by_holder.items():
        console.print(f"[yellow]{escape(str(holder))}[/] holds {n} of these runs of this store (its sweep "
                      f"{escape(holder.sweep)!r}): this one waits for them instead of running them twice; the ones "
                      "it stores ok are skipped here, any it does not (failed, stopped, or it died) run here"
                      + (f"; running the other {others} first" if others else ""))


def _say_dropped(console: Console, dropped: list[Holder]) -> None:
    for holder in dropped:
        console.print(f"[yellow]sweep {escape(holder.sweep)!r} (pid {holder.pid} on {escape(holder.host)}, started "
                      f"{holder.started}) is no longer running:[/] the runs it had claimed are free again")


def _wait_for(runs: list[PlannedRun], claims: Claims, console: Console) -> bool:
    """Wait until no other live sweep holds any of `runs` (each is stored, or its sweep ended); False when this
    sweep is told to stop first."""
    from quantbench.run.runner import stopping

    keys = [r.claim_key() for r in runs]
    began = said = time.monotonic()
    while not stopping():
        found = claims.held(keys)
        _say_dropped(console, found.dropped)
        if not found.held:
            return True
        if time.monotonic() - said >= WAIT_REMIND_S:
            holders = ", ".join(sorted({str(h) for h in found.held.values()}))
            console.print(f"still waiting for {len(found.held)} run(s) held by {escape(holders)} "
                          f"(waited {(time.monotonic() - began) / 60:.0f} min)")
            said = time.monotonic()
        time.sleep(WAIT_POLL_S)
    return False


def refuse_untrusted_scorers(sweep: Sweep, runs: list[PlannedRun]) -> None:
    """ConfigError naming the sweep file's model when a checkpoint a run loads (or quantizes from) names its own
    scorer (quantbench.models.scorer) and the model does not set trust_remote_code."""
    for run in runs:
        if run.spec.shape or is_remote(run.spec.backend):  # random weights, or a server's own model
            continue
        for path in (run.spec.model, run.make.source if run.make else None):
            if path is not None and Path(path, "config.json").is_file():
                require_trust(describe_scorer(path), run.spec.trust_remote_code,
                              f"trust_remote_code = true on model {run.model!r} in {sweep.path}")


def print_summary(store: Store, outcome: SweepOutcome, out: Console | None = None) -> None:
    """The runs this sweep stored, then the which-quant report for each GPU they ran on."""
    out = out or term.console()  # to a pipe: whole rows, not cut to 80 columns ("sta…", "var…")
    left = (f"; {outcome.not_started} not started (the sweep was stopped): run the same sweep again to run them, "
            "finished runs are skipped" if outcome.not_started else "")
    if outcome.unsaved:  # each kept whole in a side file; the store may not even be readable now
        out.print(f"sweep: {len(outcome.unsaved)} run(s) could not be stored in {store.path} and were kept aside:",
                  markup=False)
        for why in outcome.unsaved:
            out.print(f"- {why}", markup=False, soft_wrap=True)
    others = (f", {outcome.by_others} stored by another sweep of this store while this one waited"
              if outcome.by_others else "")
    if not outcome.run_ids:
        if outcome.unsaved:
            return
        out.print(f"Nothing ran: {outcome.skipped} of {outcome.planned} runs were already finished "
                  f"(--rerun runs them again){others}, {len(outcome.unplaceable)} could not be placed{left}.",
                  markup=False)
        return
    stored = queries.stored_runs_by_id(store, outcome.run_ids)
    out.print(runs_table(stored, f"sweep: {outcome.ok} ok, {outcome.failed} failed, {outcome.skipped} already "
                                 f"finished{others}{left} — stored in {store.path}"))
    for gpu, host in dict.fromkeys((text_or_none(r.gpu_name), text_or_none(r.host)) for r in stored):
        try:
            out.print(report_for_this_machine(store, gpu or "cpu", None if gpu else host), markup=False, soft_wrap=True)
        except QuantbenchError as e:
            out.print(f"report for {gpu or f'CPU ({host})'}: {e}", markup=False)


def cli_sweep(path: str | os.PathLike[str], executor: str = "local", address: str | None = None,
              rerun: bool = False, db: str | os.PathLike[str] | None = None,
              parquet_dir: str | None = None) -> SweepOutcome:
    """`quantbench sweep FILE [--executor local|ray] [--address auto] [--rerun] [--db PATH] [--parquet-dir DIR]`.
    Returns the outcome (the CLI exits 1 when outcome.failed)."""
    sweep = load_sweep(path)
    if executor == "local":
        for option, value in (("--address", address), ("--parquet-dir", parquet_dir)):
            if value:
                raise ConfigError(f"{option} is for --executor ray; remove it (a local sweep stores into --db)")
        ex: Any = LocalExecutor()
    elif executor == "ray":
        from quantbench.sweep.ray import RayExecutor

        ex = RayExecutor(address=address, parquet_dir=parquet_dir, **sweep.ray)
    else:
        raise ConfigError(f"--executor {executor!r}: use local or ray")
    store = Store(db)
    try:
        outcome = run_sweep(sweep, ex, store, rerun=rerun)
    finally:
        ex.close()
    print_summary(store, outcome)
    return outcome
