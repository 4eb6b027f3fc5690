"""Print the table of benchmarks/kernel_stalls.sh: one column per profiled kernel launch (ncu --csv --page raw), its
time, occupancy, issue-slot use, DRAM throughput, and each warp-stall reason per issued instruction, largest first.

    python3 benchmarks/kernel_stalls.py OUT/ncu-int4.csv
"""

from __future__ import annotations

import csv
import sys

STALL = "smsp__average_warps_issue_stalled_"
NAMED = {
    "gpu__time_duration.sum": "time",
    "launch__registers_per_thread": "registers a thread",
    "launch__occupancy_limit_registers": "programs an SM (registers allow)",
    "launch__occupancy_limit_shared_mem": "programs an SM (shared memory allows)",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue slots busy %",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput %",
    "smsp__inst_executed.sum": "warp instructions",
}


def launches(path: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The kernel rows of an ncu raw CSV (the lines before its header are ncu's and the program's own output) and
    the units row."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.DictReader(lines[start:]))
    return rows[1:], rows[0]  # the first row after the header holds the units


def short(name: str) -> str:
    return name.split("(")[0][-40:]


def table(rows: list[dict[str, str]], units: dict[str, str]) -> str:
    heads = [short(r.get("Kernel Name", "?")) for r in rows]
    lines = ["| figure | " + " | ".join(heads) + " |", "|---|" + "---|" * len(rows)]
    for metric, label in NAMED.items():
        if metric in units:
            unit = f" ({units[metric]})" if metric == "gpu__time_duration.sum" else ""
            lines.append(f"| {label}{unit} | " + " | ".join(r.get(metric, "") for r in rows) + " |")
    stalls = [m for m in units if m.startswith(STALL)]

    def total(m: str) -> float:
        return sum(float(r.get(m) or 0) for r in rows)

    for m in sorted(stalls, key=total, reverse=True):
        reason = m[len(STALL):].removesuffix("_per_issue_active.ratio")
        lines.append(f"| stalled: {reason} (per issued instruction) | " + " | ".join(r.get(m, "") for r in rows) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    kernels, unit_row = launches(sys.argv[1])
    print(table(kernels, unit_row))
