"""What an executor hands the driver: an `Event` per run started and finished, and a failed result for a run
that never produced one itself.

An executor (`quantbench.sweep.local.LocalExecutor`, `quantbench.sweep.ray.RayExecutor`) has `where()` (where
the runs go, in words), `placeable(run)` (None, or why no machine can take it), `accepts(run, row)` (whether a
stored ok run on that row's machine satisfies this run's GPU requirement), `run(runs)` (yields a started and a
finished `Event` per run, the finished one with its RunResult) and `close()`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from quantbench.run.record import RunResult, uuid7
from quantbench.run.spec import RunSpec
from quantbench.sweep.planning import PlannedRun


@dataclass
class Event:
    kind: str  # started | finished
    run: PlannedRun
    result: RunResult | None = None
    where: str = ""


def failed_result(spec: RunSpec, failure: str, error: str, *, repeat: tuple[str, int, int] | None = None,
                  **extra: Any) -> RunResult:
    """A `failed` row for a run that never produced one itself (a lost Ray worker, a variant that could not be
    made). It has no spec_hash: only ok runs count as finished. `repeat`: the run's repeat tag, so its group
    counts it as a run that failed."""
    from quantbench.run.runner import provenance, stored_spec

    now = dt.datetime.now(dt.UTC)
    tag = dict(zip(("repeat_id", "repeat_index", "repeat_count"), repeat, strict=True)) if repeat else {}
    return RunResult(run={
        **provenance(), "run_id": str(uuid7()), "created_at": now, "finished_at": now, "status": "failed",
        "failure": failure, "error": error, "backend": spec.backend, "role": spec.role, "gpu_requested": spec.gpu,
        "spec": stored_spec(spec), "extra": extra or None, **tag,  # secrets masked, as every run's row
    })
