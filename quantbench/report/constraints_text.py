"""`quantbench recommend`'s answers as plain text: per GPU, the pick with its evidence (or plainly why nothing
qualifies), then every variant and the constraints it fails. The decisions are quantbench.analysis.constraints'."""

from __future__ import annotations

from collections import Counter

from quantbench.analysis.constraints import Answer


def answers_text(answers: list[Answer], synthetic: bool = False) -> str:
    """The answers; tables of synthetic (random) weights, which can have no pick, only counted unless `synthetic`."""
    if not answers:
        return "No runs to recommend from.\n"
    c = answers[0].constraints
    lines = [f"Constraints: {c.describe(cpu=all(a.report.cpu for a in answers))}.", ""]
    random = [a for a in answers if a.synthetic]
    shown = answers if synthetic else [a for a in answers if not a.synthetic]
    # two tables of one suite id on one GPU and model: the suite was edited between their runs (a new hash)
    suite_ids = Counter((a.report.gpu_key, a.report.model_id, a.report.suite_id) for a in shown)
    for a in shown:
        r = a.report
        edited = f" (hash {r.suite_hash})" if suite_ids[(r.gpu_key, r.model_id, r.suite_id)] > 1 else ""
        lines.append(f"## {r.gpu} · {r.model_id} · suite {r.suite_id}{edited}")
        lines.append(("Pick: " if a.pick else "") + a.verdict)
        width = max((len(k.label) for k in a.candidates), default=0)  # none in a table of batched runs alone
        for k in a.candidates:
            status = "meets every constraint" if k.passes else "fails " + "; ".join(
                f"{name}: {why}" for name, why in k.failed.items())
            star = "⭐" if k is a.pick else " "
            lines.append(f"  {star} {k.label.ljust(width)}  {status}")
            if c.max_latency_ms is not None and not k.passes and "status" not in k.failed:
                lines.append(f"    {' ' * width}  ({k.latency.text})")
        lines.append("")
    if random and not synthetic:
        lines += [f"{len(random)} table(s) of synthetic (random) weights left out: they measure speed and memory only, "
                  "so nothing there can qualify on quality (--synthetic lists them).", ""]
    picked = sum(a.pick is not None for a in answers)
    lines.append(f"{picked} of {len(answers)} GPU / model tables have a pick under these constraints."
                 if picked else "Nothing qualifies on any GPU under these constraints.")
    return "\n".join(lines) + "\n"
