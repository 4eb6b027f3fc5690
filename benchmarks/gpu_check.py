"""The GPU check's comparison: every figure of a check run (benchmarks/gpu_check.sh) beside the newest stored row of
the same measurement on the same GPU, with the ratio, and a loud list of what is more than 5% worse.

    python benchmarks/gpu_check.py NEW.duckdb [--stored results.duckdb] [--tolerance 0.05]

Matched on the same GPU name, and:
- text decisions (`quantbench run --shape ...`): backend, variant, model id, suite id and decisions per forward;
  the figures are p50 ms per decision and J per decision;
- media decisions (benchmarks/omni_shape.py, suite `omni-shape-bench`): variant and decision kind; the figures are
  end to end (prepare + forward) and forward ms, and whether the media decoder ran from CUDA graphs;
- serving (`quantbench load`): server variant and model, clients; decisions/s, p50 and p99 ms.
A figure with no stored row to compare is printed as new. Exit status 1 when anything is worse than the tolerance
(or a media decoder graph was refused or disabled), so a script can stop on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from quantbench.store import Store, queries  # noqa: E402
from quantbench.store.load import has_load_tables, load_steps  # noqa: E402
from quantbench.store.records import frame  # noqa: E402


def _extra(value: Any) -> dict:
    if isinstance(value, dict):
        return value
    try:
        return json.loads(value or "{}")
    except (TypeError, ValueError):
        return {}


def text_figures(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """(key, figure, value, lower_is_better) rows of the text-decision runs."""
    out = []
    ok = runs[(runs.status == "ok") & (runs.suite_id != "omni-shape-bench") & runs.gpu_name.notna()]
    for _, r in ok.iterrows():
        batch = int(r["batch"]) if "batch" in r and not pd.isna(r["batch"]) else 1
        key = (r.gpu_name, "text", r.backend, r.variant, r.model_id, r.suite_id, batch)
        label = f"{r.variant} text, {r.suite_id}, batch {batch}"
        out.append(dict(key=key + ("p50",), what=f"{label}: p50 ms", value=r.p50_ms, lower=True, run=r))
        if not pd.isna(r.get("energy_j_per_decision")):
            out.append(dict(key=key + ("J",), what=f"{label}: J / decision", value=r.energy_j_per_decision,
                            lower=True, run=r))
    return out


def media_figures(runs: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    ok = runs[(runs.status == "ok") & (runs.suite_id == "omni-shape-bench")]
    for _, r in ok.iterrows():
        shape = _extra(r.extra).get("omni_shape", {})
        graphs = (shape.get("ran", {}).get("media") or {}).get("decoder_graphs") or {}
        for kind, got in shape.get("kinds", {}).items():
            key = (r.gpu_name, "media", r.variant, r.model_id, kind)
            for figure in ("end_to_end_ms", "forward_ms"):
                if got.get(figure) is not None:
                    out.append(dict(key=key + (figure,), what=f"{r.variant} {kind}: {figure.replace('_ms', '')} ms",
                                    value=got[figure], lower=True, run=r))
        if graphs:
            out.append(dict(key=(r.gpu_name, "media", r.variant, r.model_id, "graphs"),
                            what=f"{r.variant}: media decoder graphs", value=_graph_state(graphs), lower=None, run=r))
    return out


def _graph_state(graphs: dict) -> str:
    if graphs.get("disabled"):
        return f"disabled: {graphs['disabled']}"
    if graphs.get("refused"):
        return f"refused: {'; '.join(graphs['refused'].values())}"
    return f"on ({graphs.get('replays', 0)} replays)"


def serve_figures(store: Store) -> list[dict[str, Any]]:
    if not has_load_tables(store):
        return []
    steps = load_steps(store)
    out = []
    for _, s in steps.iterrows():
        key = (s.server_gpu, "serve", s.server_variant, s.server_model, int(s.concurrency), s["mode"])
        label = f"serve {s.server_variant}, {int(s.concurrency)} clients"
        for figure, lower in (("decisions_per_s", False), ("p50_ms", True), ("p99_ms", True)):
            out.append(dict(key=key + (figure,), what=f"{label}: {figure}", value=s[figure], lower=lower, run=s))
    return out


def figures(store: Store) -> list[dict[str, Any]]:
    runs = frame(queries.stored_runs(store))  # every run with its latency (p50, p99, batch), as a table
    return text_figures(runs) + media_figures(runs) + serve_figures(store)


def newest(rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    by_key: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        when = row["run"]["created_at"]
        if row["key"] not in by_key or when > by_key[row["key"]]["run"]["created_at"]:
            by_key[row["key"]] = row
    return by_key


def compare(new: Store, stored: Store, tolerance: float) -> tuple[list[list[str]], list[str]]:
    """Table rows (figure, now, stored, stored at, ratio, verdict) and the figures worse than the tolerance."""
    now_rows, before = newest(figures(new)), newest(figures(stored))
    table, worse = [], []
    for key, row in now_rows.items():
        old = before.get(key)
        value = row["value"]
        if row["lower"] is None:  # a state, not a number: anything but "on" is a regression
            verdict = "ok" if str(value).startswith("on") else "WORSE"
            table.append([row["what"], str(value)[:48], str(old["value"])[:48] if old else "—",
                          str(old["run"]["created_at"])[:16] if old else "—", "", verdict])
            if verdict == "WORSE":
                worse.append(f"{row['what']}: {value}")
            continue
        if old is None or old["value"] is None or pd.isna(old["value"]) or not old["value"]:
            table.append([row["what"], f"{value:.2f}", "—", "—", "", "new"])
            continue
        ratio = value / old["value"]
        bad = ratio > 1 + tolerance if row["lower"] else ratio < 1 - tolerance
        good = ratio < 1 - tolerance if row["lower"] else ratio > 1 + tolerance
        verdict = "WORSE" if bad else "better" if good else "same"
        table.append([row["what"], f"{value:.2f}", f"{old['value']:.2f}", str(old["run"]["created_at"])[:16],
                      f"{ratio:.3f}", verdict])
        if bad:
            worse.append(f"{row['what']}: {value:.2f} against {old['value']:.2f} ({ratio:.2f}x)")
    return table, worse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("new", type=Path, help="the check's store (gpu_check.sh writes OUT/gpu_check.duckdb)")
    p.add_argument("--stored", type=Path, default=ROOT / "results.duckdb", help="the store to compare with")
    p.add_argument("--tolerance", type=float, default=0.05, help="a figure this much worse is flagged (0.05: 5%%)")
    args = p.parse_args(argv)
    table, worse = compare(Store(args.new), Store(args.stored), args.tolerance)
    head = ["figure", "this check", "newest stored", "stored at", "ratio", "verdict"]
    widths = [max(len(str(r[i])) for r in [head, *table]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *table]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    if worse:
        print(f"\n!!! {len(worse)} figure(s) more than {args.tolerance:.0%} worse than the newest stored row:")
        for w in worse:
            print(f"!!!   {w}")
        return 1
    print(f"\nno figure more than {args.tolerance:.0%} worse than the newest stored row "
          f"({sum(1 for r in table if r[-1] == 'new')} without a stored row to compare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
