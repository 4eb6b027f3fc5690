"""The "Which quant should I use?" report as text: markdown (one table per GPU, model and suite, a matrix per
model across GPUs, the failed runs), csv (the raw figures, one row per variant and one per batched run, told apart
by row_kind) and json. The rows and the recommendation come from quantbench.analysis.recommend; nothing here
decides, it only writes down.
"""

from __future__ import annotations

import io
import json
import socket
from dataclasses import asdict, dataclass
from typing import Any

from quantbench.analysis import efficiency, parity, provenance
from quantbench.analysis.margins import margins_from
from quantbench.analysis.recommend import (
    SYNTHETIC_NOTE,
    GpuReport,
    Row,
    Rules,
    build_report,
    stored_runs,
)
from quantbench.errors import ConfigError
from quantbench.report.flat import csv_rows, flat_rows, throughput_json
from quantbench.report.statistics import statistics_markdown, statistics_notes
from quantbench.store import Store
from quantbench.store.records import StoredRun

FORMATS = ("markdown", "csv", "json")


def throughput_notes(rows: list[dict[str, Any]]) -> list[str]:
    """throughput()'s rows as one sentence: the note `--format json` carries (markdown prints a table)."""
    if not rows:
        return []
    parts = [f"{t['variant']} at batch {t['batch']}: {t['decisions_per_s']:.1f}/s"
             + (f", {efficiency.fmt_joules(t['efficiency'].j_per_decision)} per decision"
                if t["efficiency"].j_per_decision is not None else "")
             + (f", {efficiency.cost_text(t['efficiency'])} per 1M decisions"
                if t["efficiency"].cost_per_million is not None else "") for t in rows]
    return ["Throughput (decisions per second, several decisions in one forward pass): " + "; ".join(parts) + "."]


def throughput_markdown(rows: list[dict[str, Any]], under_table: bool = True) -> list[str]:
    """throughput()'s rows as the small table `quantbench report` prints under the latency table (one row per
    variant and batch size: a list of them in one sentence was unreadable past a few); `under_table` False: the
    table of a group of batched runs alone, with no latency table above it."""
    if not rows:
        return []
    priced = rows[0]["efficiency"].price_per_gpu_hour is not None
    head = ["Variant", "Decisions per pass", "Decisions/s", "Mean ms per pass", "Energy per decision",
            *(["Cost per 1M decisions"] if priced else []), "Run"]
    title = "Throughput, several decisions in one forward pass" + (
        " (the table above is one decision at a time):" if under_table else ":")
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in rows:
        e = t["efficiency"]
        cost = f" {efficiency.cost_text(e)} |" if priced else ""
        lines.append(f"| {_md_escape(t['variant'])} | {t['batch']} | {t['decisions_per_s']:.1f} | "
                     f"{t['ms_per_pass']:.1f} | {efficiency.energy_text(e)} |{cost} {t['run_id'][:13]} |")
    return lines + [""]


# -- formatting ----------------------------------------------------------------------------------------------
def fmt_bytes(n: int | None, binary: bool = True) -> str:
    """GiB for memory, GB (10⁹) for disk, as download sizes are quoted; n/a for unknown, never 0."""
    if n is None:
        return "n/a"
    base = 1024 if binary else 1000
    for unit in ("GiB", "MiB", "KiB") if binary else ("GB", "MB", "kB"):
        scale = base ** {"G": 3, "M": 2, "K": 1, "k": 1}[unit[0]]
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    # tenths up to 100 ms: at the real shape 11.8 and 12.3 ms are different answers to a 12 ms goal
    return f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def cells(row: Row, report: GpuReport) -> dict[str, str]:
    """One table row as text, in column order."""
    run, c = row.run, row.comparison
    dagger = "†" if report.reference is not None and row.comparison is not None and parity.gpu_key(
        report.reference) != parity.gpu_key(run) else ""
    if c is not None:
        agree = f"{_pct(c.agreement.rate)} ({100 * c.agreement.lo:.1f}–{100 * c.agreement.hi:.1f}){dagger}"
        tv = f"{c.tv.mean:.3f}"
        m = c.paired.mean
        acc = "no gold answers" if m is None else f"{100 * m.mean:+.2f} pts ({100 * m.lo:+.2f}…{100 * m.hi:+.2f})"
    elif row.is_reference:
        agree, tv = "reference", "—"
        acc = "reference" if report.reference_accuracy is None else (
            f"reference (accuracy {_pct(report.reference_accuracy)}, mean over benchmarks)")
    else:
        agree, tv, acc = row.quality or "n/a", "—", "—"
    verdict = c.verdict_short() if c is not None else "—"
    native = {"native": "yes", "emulated": "no (emulated)"}.get(run.native or "", "—")
    lat = "n/a" if row.p50 is None else f"{fmt_ms(row.p50)} / {fmt_ms(run.p90_ms)} ms"
    rep = row.repeats
    if rep is not None and rep.p50_ms is not None:  # `run --repeat N`: p50 as mean ± its 95% t interval
        lat = (f"{fmt_ms(rep.p50_ms.mean)} ± {fmt_ms(rep.p50_ms.half_width)} / "
               f"{fmt_ms(run.p90_ms)} ms ({_repeat_runs(rep, rep.p50_ms.n)}, CV {100 * rep.p50_ms.cv:.1f}%)")
    if row.busy:
        lat += " ⚠ busy"
    if row.cpu and row.peak_bytes is None and row.ok:
        peak = "—"  # an older run: its stored figure is its launcher's peak (ru_maxrss), not its own
    else:
        peak = fmt_bytes(row.peak_bytes) + ("*" if row.peak_source == "torch_reserved" else "")
    eff = row.efficiency or efficiency.of_run(run, report.price_per_gpu_hour)
    energy = efficiency.energy_text(eff)
    if rep is not None and rep.j_per_decision is not None:
        energy = (f"{rep.j_per_decision.mean:.2f} ± {rep.j_per_decision.half_width:.2f} J "
                  f"({_repeat_runs(rep, rep.j_per_decision.n)}, CV {100 * rep.j_per_decision.cv:.1f}%)")
    floors = {} if report.cpu else {"Against the floors (latency, energy)": row.floors.text() if row.floors else "—"}
    cost = {"Cost per 1M decisions": efficiency.cost_text(eff)} if report.price_per_gpu_hour is not None else {}
    return {
        "Variant": row.label,
        "Format": str(run.weight_format or "n/a"),
        "Size on disk": fmt_bytes(run.disk_bytes, binary=False),
        ("Weights (host memory)" if row.cpu else "VRAM (weights)"): fmt_bytes(row.weights_bytes),
        ("Peak host RSS" if row.cpu else "Peak VRAM"): peak,
        "Latency p50 / p90 (per decision)": lat,
        "Energy per decision": energy,
        **floors,
        **cost,
        "Agrees with BF16 (95% CI)": agree,
        "TV": tv,
        "Verdict": verdict,
        "Δ accuracy vs BF16": acc,
        "Native here?": native,
        "Best for": row.best_for,
        "Kernel": str(run.kernel_path or "n/a"),
    }


def _repeat_runs(rep, n: int) -> str:
    """`3 runs`, or `2 of 3 runs` where runs of the `--repeat` group failed or measured nothing: the interval is
    over those that did (a failed repeat read as `2 runs`, as if two had been asked for)."""
    return f"{n} runs" if n >= rep.runs else f"{n} of {rep.runs} runs"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_batched_only(report: GpuReport) -> str:
    """A group of batched runs alone: its heading, why it has no latency table, and its throughput table."""
    lines = [f"### {report.model_id} on {report.gpu}", "", f"Suite {report.suite_id} (hash {report.suite_hash}).", "",
             f"**No per-decision table:** {report.no_table_note}.", ""]
    lines += throughput_markdown(report.throughput, under_table=False)
    notes = report.notes + efficiency.energy_note(report.price_per_gpu_hour, report.cpu)
    lines += [f"- {_md_escape(n)}" for n in notes]
    return "\n".join(lines)


def _markdown_one(report: GpuReport, n_cells: int = 0) -> str:
    if report.batched_only:
        return _markdown_batched_only(report)
    title = f"### {report.model_id} on {report.gpu}"
    lines = [title, "", f"Suite {report.suite_id} (hash {report.suite_hash})."]
    if report.modality_counts:
        lines[-1] += f" Questions by modality: {parity.coverage_text(report.modality_counts)}."
    table = [cells(r, report) for r in report.rows]
    header = list(table[0])
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(row[h]) for h in header) + " |" for row in table]
    lines.append("")
    lines += modality_markdown(report)
    lines += statistics_markdown(report)
    if report.recommended:
        lines.append(f"**Recommended: {report.recommended.label}**, picked by the rule: {report.rule}.")
    else:
        lines.append(f"**Recommendation:** {report.rule}.")
    lines.append("")
    lines += throughput_markdown(report.throughput)
    notes = list(report.notes)
    ref = report.reference
    if ref is not None and any(r.comparison is not None for r in report.rows):
        counts = {r.label: r.comparison.agreement.n for r in report.rows if r.comparison is not None}
        n = max(counts.values())
        # a variant run on fewer questions (--limit) is judged on those alone: say so, not "the share of 300"
        fewer = "; ".join(f"{label}: {k}" for label, k in counts.items() if k < n)
        notes.append(
            f"Agrees with BF16 is the share of {n} questions"
            + (f" (fewer where a variant answered only some of them: {fewer})" if fewer else "")
            + " where the variant's top answer matches the BF16 run "
            f"{ref.run_id[:13]} ({ref.kernel_path}), with a 95% Wilson interval; TV is the mean total "
            "variation between their per-option distributions; Δ accuracy is the unweighted mean over benchmarks of "
            "paired per-benchmark deltas on identical questions, with a 95% paired bootstrap interval."
        )
    if report.floor is not None:
        f = report.floor
        notes.append(
            f"Noise floor: BF16 against itself under another kernel ({f.run.kernel_path}, run "
            f"{f.run.run_id[:13]}) agrees on {_pct(f.agreement.rate)} ({100 * f.agreement.lo:.1f}–"
            f"{100 * f.agreement.hi:.1f}) of the questions, TV {f.tv.mean:.3f}."
        )
        margins = next((r.comparison.verdict.margins for r in report.rows if r.comparison is not None), None)
        if parity.floor_note(f, margins):
            notes.append("Note: " + parity.floor_note(f, margins) + ".")
    notes += verdict_notes(report)
    notes += [f"{r.label}: {_why_failed(r.run)}." for r in report.rows if not r.ok]
    if any(r.comparison is not None for r in report.rows):
        margins = next(r.comparison.verdict.margins for r in report.rows if r.comparison is not None)
        notes += statistics_notes(margins.describe() if margins else None, n_cells)
    if report.floor is None and ref is not None and not any(r.quality == SYNTHETIC_NOTE for r in report.rows):
        notes.append("No noise-floor run: make one with `quantbench run --noise-floor` to judge how close is close.")
    notes += [n for n in (provenance.table_note([r.run for r in report.rows]),) if n]
    notes += efficiency.energy_note(report.price_per_gpu_hour, report.cpu)
    notes += condition_notes(report)
    if report.cpu:
        notes.append("CPU runs have no VRAM: Weights (host memory) is the bytes of every tensor the loaded model "
                     "holds; Peak host RSS is the run's own process's peak resident memory (VmHWM, reset when the "
                     "run starts); — for a run stored before quantbench read it, whose stored figure (ru_maxrss) "
                     "was the launching process's.")
    else:
        notes.append("VRAM (weights) is the device memory the load allocated; Peak VRAM is NVML's per-process peak "
                     "(what nvidia-smi shows; * = torch's peak reserved, where NVML had no figure).")
    notes.append("Size on disk is in GB (10⁹ bytes), memory in GiB; n/a means not measured, — not applicable.")
    lines += [f"- {_md_escape(n)}" for n in notes]
    return "\n".join(lines)


def condition_notes(report: GpuReport) -> list[str]:
    """Repeats, busy machines and the floors' spec sheets, as footnotes."""
    notes = []
    if any(r.repeats is not None for r in report.rows):
        notes.append("± is the half-width of a 95% t interval over the runs of one `quantbench run --repeat N` (or "
                     "of one configuration of a sweep with `repeats = N`; each in a fresh process, the same "
                     "questions), CV their coefficient of variation; energy: each run's settled-window figure.")
    for r in report.rows:
        if r.busy:
            notes.append(f"⚠ {r.label}: {r.busy}; its latency is not what an idle machine gives.")
    specs = [r.floors.spec for r in report.rows if r.floors is not None]
    if specs:
        from quantbench.analysis.conditions import floors_note

        notes.append(floors_note(specs))
    return notes


def modality_cells(m: parity.ModalityParity) -> dict[str, str]:
    """One variant on one modality's questions, as text: the table of `report` and the rows of `compare`."""
    a, t, f, d = m.agreement, m.tv_ci, m.flips, m.paired.mean
    return {
        "Modality": m.modality, "n": str(a.n),
        "Agrees with BF16 (95% CI)": f"{_pct(a.rate)} ({100 * a.lo:.1f}–{100 * a.hi:.1f})",
        "Mean TV (95% CI)": f"{t.mean:.3f} ({t.lo:.3f}–{t.hi:.3f})",
        "Flips on gold (right→wrong / wrong→right)": f"{f.ref_right_cand_wrong} / {f.ref_wrong_cand_right} of {f.n_gold}",
        "Δ accuracy vs BF16": "no gold answers" if d is None else
        f"{100 * d.mean:+.2f} pts ({100 * d.lo:+.2f}…{100 * d.hi:+.2f})",
        "Noise floor (agreement, TV)": "—" if m.floor_agreement is None else
        f"{_pct(m.floor_agreement.rate)}, {m.floor_tv_ci.mean:.3f}",
        "Verdict": m.verdict.short(),
    }


def modality_markdown(report: GpuReport) -> list[str]:
    """Parity per modality, a row per variant and modality, when the questions hold more than one modality."""
    compared = [r for r in report.rows if r.comparison is not None and r.comparison.per_modality]
    if not compared:
        return []
    rows = [{"Variant": r.label, **modality_cells(m)} for r in compared for m in r.comparison.modalities]
    header = list(rows[0])
    lines = ["Parity per modality (the same figures and verdict rule on each modality's questions; a variant worse "
             "on one modality is not recommended, whatever the others say):", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(row[h]) for h in header) + " |" for row in rows]
    return lines + [""]


def verdict_notes(report: GpuReport) -> list[str]:
    """The rule behind the Verdict column, then each variant's figures: the excess over the floor and its interval."""
    compared = [r for r in report.rows if r.comparison is not None and r.comparison.verdict.parts]
    if not compared:
        return []
    m = compared[0].comparison.verdict.margins
    notes = [
        f"Verdict: each variant's excess over the noise floor on the same questions (disagreement with BF16, mean "
        f"TV; accuracy lost against BF16 itself under an accuracy margin) with a 95% interval, against stated "
        f"margins ({m.describe()}): indistinguishable = within the margin "
        "and not detectably above the floor; different, within margin = detectably above it but within the margin; "
        "worse = wholly beyond the margin; inconclusive = the interval straddles the margin, with how many "
        "questions would tell. Neither worse nor inconclusive is recommended. `--margin` names the margin (`--margin-agreement` / `--margin-tv` change its figures)."
    ]
    for r in compared:
        v = r.comparison.verdict
        figures = "; ".join(
            f"disagreement {100 * e.diff:+.1f} pts [{100 * e.lo:+.1f}, {100 * e.hi:+.1f}]" if e.statistic ==
            "disagreement" else f"accuracy lost {100 * e.diff:+.1f} pts [{100 * e.lo:+.1f}, {100 * e.hi:+.1f}]"
            if e.statistic == "accuracy loss" else f"TV {e.diff:+.4f} " + ("(no interval)" if e.no_interval else
                                                                          f"[{e.lo:+.4f}, {e.hi:+.4f}]")
            for e in v.parts)
        pooled = f" (all {r.comparison.agreement.n} questions pooled)" if r.comparison.per_modality else ""
        judged = v.n_with_floor
        if judged is not None and judged < r.comparison.agreement.n:  # the floor answered fewer questions
            figures += f", on the {judged} of its {r.comparison.agreement.n} questions the noise floor answered too"
        notes.append(f"{r.label}{pooled}: {v.short()}; {figures}.")
        for m in r.comparison.flagged() if r.comparison.per_modality else []:
            notes.append(f"{r.label} on {m.modality} ({m.agreement.n} questions): worse; "
                         + "; ".join(m.verdict.reasons) + ".")
    return notes


def _summary_rows(reports: list[GpuReport]) -> list[dict[str, str]]:
    return [{"GPU": r.gpu, "Model": str(r.model_id), "Suite": str(r.suite_id),
             "Recommended": r.recommended.label if r.recommended else "none", "Rule": r.rule} for r in reports]


@dataclass
class GpuMatrix:
    """Which quant on which GPU, for one model and suite: a cell per variant and GPU, and each GPU's pick."""

    model_id: str | None
    suite_id: str | None
    gpus: list[str]
    cells: dict[str, dict[str, str]]  # variant label → GPU → "p50 · memory · agreement" (⭐ marks the pick)
    picks: dict[str, str]  # GPU → the recommended variant, or why none


def matrix_cell(row: Row, report: GpuReport) -> str:
    """One variant on one GPU in a few words: p50 latency, weights in memory, agreement with BF16."""
    if not row.ok:
        return f"failed ({row.run.failure or 'error'})"
    c = row.comparison
    if c is not None:
        quality = f"{_pct(c.agreement.rate)} agree"
    elif row.is_reference:
        quality = "reference"
    else:
        quality = "speed/memory only" if row.quality == SYNTHETIC_NOTE else (row.quality or "n/a")
    lat = "n/a" if row.p50 is None else f"{fmt_ms(row.p50)} ms"
    text = f"{lat} · {fmt_bytes(row.weights_bytes)} · {quality}"
    return f"⭐ {text}" if row.recommended else text


def gpu_matrices(reports: list[GpuReport]) -> list[GpuMatrix]:
    """One matrix per (model, suite) that ran one decision at a time on more than one GPU (or CPU host), variants
    in the order the tables list them."""
    by_model: dict[tuple, list[GpuReport]] = {}
    for rep in reports:
        if rep.batched_only:  # no per-decision figures to set beside another GPU's (its own table has them)
            continue
        by_model.setdefault((rep.model_id, rep.suite_hash), []).append(rep)
    out = []
    for reps in by_model.values():
        if len({r.gpu for r in reps}) < 2:
            continue
        cells_by: dict[str, dict[str, str]] = {}
        for rep in reps:
            for row in rep.rows:
                cells_by.setdefault(row.label, {})[rep.gpu] = matrix_cell(row, rep)
        picks = {rep.gpu: rep.recommended.label if rep.recommended else rep.rule.removeprefix("no recommendation: ")
                 for rep in reps}
        out.append(GpuMatrix(reps[0].model_id, reps[0].suite_id, [r.gpu for r in reps], cells_by, picks))
    return out


def matrix_markdown(m: GpuMatrix) -> str:
    lines = [f"### Which quant on which GPU: {m.model_id} (suite {m.suite_id})", "",
             "Each cell: p50 latency per decision · weights in memory (VRAM; host memory on a CPU) · agreement with "
             "that GPU's BF16; ⭐ the pick on that GPU.", "",
             "| Variant | " + " | ".join(_md_escape(g) for g in m.gpus) + " |", "|---|" + "---|" * len(m.gpus)]
    for label, by_gpu in m.cells.items():
        lines.append(f"| {_md_escape(label)} | " + " | ".join(_md_escape(by_gpu.get(g, "not run")) for g in m.gpus)
                     + " |")
    lines.append("| **Pick** | " + " | ".join(f"**{_md_escape(m.picks[g])}**" for g in m.gpus) + " |")
    return "\n".join(lines)


FAILED_SHOWN = 10  # the newest failed runs listed under the tables; `quantbench runs` lists every one


def _first_error_line(run: StoredRun) -> str:
    first = str(run.error or "").strip().splitlines()
    return first[0][:160] if first else ""


def _why_failed(run: StoredRun) -> str:
    """A failed row's reason under its table: the label and the error's first line (run id for the rest)."""
    first = _first_error_line(run)
    return f"failed ({run.failure or 'error'})" + (f": {first}" if first else "") + f" (run {run.run_id[:13]})"


def failed_lines(failed: list[StoredRun]) -> list[str]:
    """The failed runs that belong to no table, newest first, one line each: when, which run, what, why."""
    if not failed:
        return []
    lines = [f"### Failed runs ({len(failed)})", "",
             "These runs failed before their model or suite was known, so they have no row in a table:", ""]
    for run in sorted(failed, key=lambda r: str(r.created_at), reverse=True)[:FAILED_SHOWN]:
        when = f"{run.created_at:%Y-%m-%d %H:%M}" if run.created_at else "?"
        why = f"{run.failure or 'error'}" + (f": {first}" if (first := _first_error_line(run)) else "")
        lines.append(f"- {when} {run.run_id[:13]} {run.backend} on {parity.gpu_label(run)}: "
                     f"{_md_escape(why)}")
    if len(failed) > FAILED_SHOWN:
        lines.append(f"- … and {len(failed) - FAILED_SHOWN} older (`quantbench runs` lists every run)")
    return lines


def _markdown(reports: list[GpuReport]) -> str:
    n_cells = getattr(reports, "n_cells", 0)
    parts = [_markdown_one(r, n_cells) for r in reports]
    parts += [matrix_markdown(m) for m in gpu_matrices(reports)]
    if len(reports) > 1:
        rows = _summary_rows(reports)
        cols = ("GPU", "Model", "Suite", "Recommended", "Rule")
        lines = ["### Recommended per GPU", "", "| " + " | ".join(cols) + " |", "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_md_escape(row[k]) for k in cols) + " |" for row in rows]
        parts.append("\n".join(lines))
    if getattr(reports, "failed", None):
        parts.append("\n".join(failed_lines(reports.failed)))
    return "\n\n".join(parts) + "\n"


def to_json(reports: list[GpuReport], rules: Rules | None = None) -> dict[str, Any]:
    flat = flat_rows(reports)
    records = parity.clean_json(flat.astype(object).where(flat.notna(), None).to_dict("records")) if len(flat) else []
    out = []
    for rep in reports:
        f = rep.floor
        per_modality = {r.run.run_id: parity.clean_json(parity.by_modality(r.comparison).to_dict("records"))
                        for r in rep.rows if r.comparison is not None}
        out.append({
            "gpu": rep.gpu, "gpu_family": rep.gpu_family, "cpu": rep.cpu, "model_id": rep.model_id,
            "suite_id": rep.suite_id, "suite_hash": rep.suite_hash,
            "reference_run_id": rep.reference.run_id if rep.reference else None,
            "noise_floor": None if f is None else parity.clean_json({
                "run_id": f.run.run_id, "kernel_path": f.run.kernel_path,
                "agreement": asdict(f.agreement), "tv": asdict(f.tv)}),
            "recommended": rep.recommended.label if rep.recommended else None, "rule": rep.rule,
            "batched_only": rep.batched_only,
            "notes": ([rep.no_table_note] if rep.no_table_note else []) + throughput_notes(rep.throughput) + rep.notes,
            "throughput": throughput_json(rep.throughput),
            "price_per_gpu_hour": rep.price_per_gpu_hour,
            "modality_counts": rep.modality_counts,
            "rows": [{**r, "by_modality": per_modality.get(r["run_id"], [])} for r in records
                     if r["gpu"] == rep.gpu and r["model_id"] == rep.model_id and r["suite_hash"] == rep.suite_hash],
        })
    failed = [parity.clean_json({k: str(getattr(run, k)) if k in ("run_id", "created_at") else getattr(run, k) for k in (
        "run_id", "created_at", "backend", "model_path", "gpu_name", "host", "failure", "error")})
        for run in getattr(reports, "failed", [])]
    return {"rules": asdict(rules) if rules else None, "reports": out, "summary": _summary_rows(reports),
            "gpu_matrices": [asdict(m) for m in gpu_matrices(reports)], "failed_runs": failed}


def render(reports: list[GpuReport], fmt: str = "markdown", rules: Rules | None = None) -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "markdown":
        if not reports:
            return "\n".join(["No runs to report.", "", *failed_lines(getattr(reports, "failed", []))]).rstrip() + "\n"
        return _markdown(reports)
    if fmt == "csv":
        buf = io.StringIO()
        csv_rows(reports).to_csv(buf, index=False)
        return buf.getvalue()
    return json.dumps(to_json(reports, rules), indent=2, default=str) + "\n"


# -- entry points for the CLI and the demo -------------------------------------------------------------------
def report_for_this_machine(store: Store, machine_gpu_name_or_family: str, host: str | None = None,
                            rules: Rules | None = None, model: str | None = None,
                            run_ids: set[str] | None = None, price_per_gpu_hour: float | None = None) -> str:
    """The markdown report for one machine: pass `machine.gpu_name`, or "cpu" (this host's CPU runs unless `host`
    names another); `model` keeps only that model's tables, `run_ids` only those runs (the demo reports on the
    runs it just made, never on older ones of the store)."""
    if machine_gpu_name_or_family.strip().lower() == "cpu" and host is None:
        host = socket.gethostname()
    reports = build_report(store, gpu=machine_gpu_name_or_family, host=host, rules=rules, model=model,
                           run_ids=run_ids, price_per_gpu_hour=price_per_gpu_hour)
    if not reports and not reports.failed:
        where = machine_gpu_name_or_family + (f" on {host}" if host else "")
        return f"No successful or failed runs for {where} in {store.path} yet.\n"
    return render(reports, "markdown", rules)


def report_text(db: str | Store | None = None, fmt: str = "markdown", gpu: str | None = None, model: str | None = None,
                vram_budget_gib: float | None = None, min_agreement: float | None = None,
                host: str | None = None, since: str | None = None, history: bool = False,
                margin_agreement: float | None = None, margin_tv: float | None = None,
                price_per_gpu_hour: float | None = None, margin: str | None = None) -> str:
    """`quantbench report`'s text (plain, so it pastes into a model card); `history` (`--all`) keeps superseded
    kernel generations and fixture builds; `price_per_gpu_hour` adds cost per 1M decisions. When no run matches,
    the error lists what the store has."""
    if min_agreement is not None and 1.0 < min_agreement <= 100.0:
        min_agreement /= 100.0  # --min-agreement 95 means 95%
    rules = Rules(vram_budget_gib=vram_budget_gib, margins=margins_from(margin, margin_agreement, margin_tv),
                  **({"min_agreement": min_agreement} if min_agreement is not None else {}))
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    store = db if isinstance(db, Store) else Store(db)  # a Store: several read as one (quantbench.store.home)
    reports = build_report(store, gpu=gpu, model=model, rules=rules, host=host, since=since, history=history,
                           price_per_gpu_hour=price_per_gpu_hour)
    if not reports and not reports.failed:
        have = sorted({f"{parity.gpu_label(r)}: {r.model_id}" for r in stored_runs(store)})
        asked = " ".join(f"--{k} {v}" for k, v in (("gpu", gpu), ("model", model), ("host", host), ("since", since))
                         if v)
        raise ConfigError(f"no runs match {asked or 'the filters'} in {store.describe()}; the store has: "
                          + ("; ".join(have) or "no runs (run `quantbench demo`)"))
    return render(reports, fmt, rules)
