"""Figures over the runs of one `quantbench run --repeat N`: the same variant and questions, N fresh processes.

One run's p50 is one draw: another process, another allocator state, another neighbour on the machine moves it.
NVIDIA AIPerf repeats a profile and reports mean, CV and a t-based confidence interval; quantbench does the same
over the repeats' own figures: latency p50 (each run's median decision time) and energy per decision (each run's
settled-window figure; NULL in a run leaves it out). A figure with fewer than two values has no interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantbench.analysis import hypothesis as hy
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun


@dataclass(frozen=True)
class RepeatFigures:
    repeat_id: str
    runs: int  # runs of the group stored (ok or not)
    ok: int
    p50_ms: hy.RepeatStat | None
    j_per_decision: hy.RepeatStat | None

    def as_dict(self) -> dict[str, Any]:
        def d(s: hy.RepeatStat | None) -> dict[str, float] | None:
            return None if s is None else {"n": s.n, "mean": s.mean, "sd": s.sd, "cv": s.cv, "lo": s.lo, "hi": s.hi}

        return {"repeat_id": self.repeat_id, "runs": self.runs, "ok": self.ok, "p50_ms": d(self.p50_ms),
                "j_per_decision": d(self.j_per_decision)}


def figures(repeat_id: str, runs: list[StoredRun]) -> RepeatFigures:
    """The figures of a group from its runs (their p50_ms and energy_j_per_decision)."""
    ok = [r for r in runs if r.status == "ok"]
    return RepeatFigures(
        repeat_id, len(runs), len(ok),
        hy.t_interval([r.p50_ms for r in ok if r.p50_ms is not None]),
        hy.t_interval([r.energy_j_per_decision for r in ok if r.energy_j_per_decision is not None]),
    )


def by_group(runs: list[StoredRun]) -> dict[str, RepeatFigures]:
    """Every repeat group among `runs`, by repeat_id."""
    groups: dict[str, list[StoredRun]] = {}
    for r in runs:
        rid = r.repeat_id
        if rid:
            groups.setdefault(str(rid), []).append(r)
    return {rid: figures(rid, members) for rid, members in groups.items()}


def stat_text(s: hy.RepeatStat, unit: str, digits: int = 1) -> str:
    """`6.2 ± 0.3 ms (95% t, 3 runs, CV 4.1%)`."""
    f = f"{{:.{digits}f}}".format
    return f"{f(s.mean)} ± {f(s.half_width)} {unit} (95% t, {s.n} runs, CV {100 * s.cv:.1f}%)"


def repeat_summary_text(store: Store, repeat_id: str) -> str:
    """What `run --repeat N` prints at its end."""
    fig = figures(repeat_id, queries.repeat_runs(store, repeat_id))
    lines = [f"repeat {repeat_id[:13]}: {fig.ok} of {fig.runs} runs ok, each in a fresh process on the same questions"]
    lines.append("  latency p50 per decision: " + (stat_text(fig.p50_ms, "ms", 2) if fig.p50_ms else
                                                     "no interval (fewer than two runs with a p50)"))
    lines.append("  energy per decision: " + (stat_text(fig.j_per_decision, "J", 2) if fig.j_per_decision else
                                              "no interval (fewer than two runs measured it; a CPU run has none)"))
    return "\n".join(lines)
