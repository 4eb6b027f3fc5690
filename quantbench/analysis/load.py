"""The saturation point of a load run: the concurrency (or arrival rate) past which throughput stops rising, and
what is kept of the peak beyond it. Pure functions of the steps' (load, decisions/s) pairs, so the load generator,
the report and the dashboard compute it the same way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A step within this fraction of the peak throughput counts as having reached it: run-to-run noise of a few
# percent must not move the saturation point to a later step.
PEAK_TOLERANCE = 0.05


@dataclass(frozen=True)
class Saturation:
    """`point`: the smallest load whose throughput is within PEAK_TOLERANCE of the peak, when a larger load was
    measured after it (None: throughput still rose at the last step, the sweep did not reach saturation).
    `peak`: the highest decisions/s. `kept`: the last step's throughput over the peak (the target of issue #26
    is >= 0.9 at 4x the saturating concurrency)."""

    point: float | None
    peak: float
    kept: float | None
    beyond: float | None  # the largest load measured past `point` (None: none)


def saturation(loads: Sequence[float], throughput: Sequence[float], tolerance: float = PEAK_TOLERANCE) -> Saturation:
    """The saturation of a sweep of (load, decisions/s), in any order."""
    if len(loads) != len(throughput):
        raise ValueError("loads and throughput differ in length")
    if not loads:
        return Saturation(point=None, peak=0.0, kept=None, beyond=None)
    pairs = sorted(zip(loads, throughput, strict=True))
    peak = max(t for _, t in pairs)
    first = next(x for x, t in pairs if t >= (1.0 - tolerance) * peak)
    last_x, last_t = pairs[-1]
    if first == last_x:
        return Saturation(point=None, peak=peak, kept=None, beyond=None)
    return Saturation(point=first, peak=peak, kept=last_t / peak if peak else None, beyond=last_x)
