"""The table benchmarks/tile_plans.py prints: per format and plan, the projections' µs per layer on the model's
routing (batch 1 and 8) and on uniform routing, the whole model's CUDA-graph decision time, each with its ratio
to the first plan (the one-size tiles of before), and the checks."""

from __future__ import annotations

from typing import Any

COLUMNS = [("model512", "b1"), ("model4096", "b8"), ("uniform512", "uniform")]


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value:.1f} ({base / value:.2f}x)" if value >= 10 else f"{value:.3f} ({base / value:.2f}x)"


def report(result: dict[str, Any], plans: dict[str, dict]) -> str:
    lines = [f"# tile plans, {result['gpu']}, {result['layers']} layers"]
    for fmt, r in result["formats"].items():
        lines.append(f"\n## {fmt}" + (f"  inputs as before: {r['inputs_as_before']}" if "inputs_as_before" in r else "")
                     + (f"  default plan's bits as before: {r['base_as_before']}" if "base_as_before" in r else ""))
        head = ["plan"] + [f"{c} {w} us" for _, c in COLUMNS for w in ("gate_up", "down")] + \
            ["model b1 ms", "model b8 ms", "logits diff b1", "checks"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        first = next(iter(plans[fmt]))  # the reference plan: every ratio is to it
        base_k = r["kernel_us"].get(first, {})
        base_m = r["model_ms"].get(first, {})
        for name in plans[fmt]:
            k, m, c = r["kernel_us"].get(name, {}), r["model_ms"].get(name, {}), r["checks"].get(name, {})
            cells = [name]
            for routing, _ in COLUMNS:
                for which in ("gate_up", "down"):
                    key = f"{routing} {which}"
                    cells.append(_ratio(k.get(key), base_k.get(key)))
            for batch in ("batch 1", "batch 8"):
                cells.append(_ratio(m.get(batch, {}).get("ms"), base_m.get(batch, {}).get("ms")))
            cells.append(f"{m['batch 1']['logits_max_diff']:.3g}" if "batch 1" in m else "-")
            cells.append("; ".join(f"{a}={v}" for a, v in c.items() if a != "rel_err_vs_float64")
                         + (f"; vs float64 {c['rel_err_vs_float64']}" if "rel_err_vs_float64" in c else ""))
            lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(lines)
