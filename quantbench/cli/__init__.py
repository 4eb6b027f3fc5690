"""The `quantbench` command. Each subcommand is a thin wrapper: the work lives in the module it names.

The commands are plain functions in the module of their area (run, store, models, serve), registered here
in the order `quantbench --help` lists them; what they share is in cli/common.py, so no command module
imports this one (no cycle)."""

from __future__ import annotations

import sys

import typer

from quantbench.cli import load, models, plant, run, serve, share, store

app = typer.Typer(
    help="Which quant of a mixture-of-experts model should I use on this GPU? Measured, reproducibly.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command(cls=run.RunCommand)(run.run)
app.command()(run.demo)
app.command()(run.backends)
app.command()(store.runs)
app.command()(store.migrate)
app.command()(models.fixture)
app.command()(models.quantize)
app.command()(plant.plant)
app.command()(store.compare)
app.command()(store.report)
app.command()(store.recommend)
app.command()(store.export)
app.command()(store.merge)
app.command()(share.publish)
app.command()(share.pull)
app.command()(share.sources)
app.command(cls=serve.ServeCommand)(serve.serve)
app.command()(load.load)
app.command()(load.load_runs)
app.command()(run.sweep)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
