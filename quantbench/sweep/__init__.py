"""Sweeps: models × variants × suites × GPUs × repeats in one command, on this host or on a Ray cluster.

    quantbench sweep sweep.toml                      # local: one process per visible GPU (one at a time on CPU)
    quantbench sweep sweep.toml --executor ray       # one Ray task per run, num_gpus=1, placed by GPU type

The unit of work is `runner.execute(spec) -> RunResult`, the same fresh-process run `quantbench run` does; it
writes nothing. Results come back to the driver, the only process that writes DuckDB. A run whose config hash
(`runner.spec_hash`) is already stored with status ok is skipped unless --rerun (failed runs run again); a run
another live sweep of the store has claimed is waited for, not run twice.

    spec.py       the sweep file: its dataclasses, TOML loading and validation (ConfigError naming file, key, fix)
    planning.py   the matrix expanded into runs, the variants to quantize first, what is already done
    make.py       quantizing the missing variants, each in a fresh process, before the runs
    executor.py   what every executor hands the driver (Event) and the failed row of a run that made none
    claims.py     which runs of a store a live sweep has claimed, so two sweeps at once never run one twice
    local.py      the local executor: one process per GPU
    ray.py        the Ray executor: one Ray task per run (imported only for --executor ray)
    driver.py     run_sweep, the summary, and `quantbench sweep` itself (cli_sweep)
"""

from quantbench.sweep.driver import SweepOutcome, cli_sweep, print_summary, run_sweep
from quantbench.sweep.executor import Event, failed_result
from quantbench.sweep.local import LocalExecutor, Slot, local_slots
from quantbench.sweep.make import make_missing
from quantbench.sweep.planning import Make, PlannedRun, plan, split_finished
from quantbench.sweep.spec import Model, Sweep, Variant, load_sweep

__all__ = [
    "Event", "LocalExecutor", "Make", "Model", "PlannedRun", "Slot", "Sweep", "SweepOutcome", "Variant",
    "cli_sweep", "failed_result", "load_sweep", "local_slots", "make_missing", "plan", "print_summary",
    "run_sweep", "split_finished",
]
