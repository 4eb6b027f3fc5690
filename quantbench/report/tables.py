"""The rich tables the CLI and the sweep print: stored runs one line each, a parity comparison, what an export
wrote and what a merge added. Domain modules return data (stored runs, a Comparison, a MergeSummary); these
functions only present it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from quantbench import term
from quantbench.analysis import efficiency, parity
from quantbench.analysis import hypothesis as hy
from quantbench.analysis import significance as sig
from quantbench.analysis import stats as an
from quantbench.analysis.parity import Comparison
from quantbench.store import Store
from quantbench.store.records import StoredRun
from quantbench.store.transfer import MergeSummary, exported_counts


# -- stored runs (`quantbench runs`, `run`, `demo`, `sweep`) -------------------------------------------------
def stored_value(x: Any) -> Any:
    """A stored value, or None for SQL NULL (pandas gives NaN, NA or NaT)."""
    return None if x is None or (not isinstance(x, list | tuple) and pd.isna(x)) else x


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.1f} MiB"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


NUMERIC = ("decisions", an.ACCURACY_NAME, "p50 ms", "p90 ms", "weights", "load s")


def runs_table(runs: list[StoredRun], title: str, sourced: bool = False) -> Table:
    """One self-describing row per run (llama-bench style): what ran, where, and what it measured; `sourced`
    (`quantbench runs`): where each row came from (read from several stores, or pulled)."""
    # Stored text is escaped, not read as markup: a sweep's variant "ref [/x]" made `quantbench runs` raise
    # MarkupError, and " [noise floor]" or a path's "[x]" vanished from the table as an unknown style.
    t = Table(title=escape(title), title_justify="left")
    for col in ("run", "status", "model", "variant", "kernel", "where", *NUMERIC, *(("from",) if sourced else ())):
        t.add_column(col, justify="right" if col in NUMERIC else "left")
    if any(r.weights == "synthetic" for r in runs):  # their answers are chance: the accuracy must not read as quality
        t.caption = "* random (synthetic) weights: speed and memory only; their accuracy is chance, not quality"
        t.caption_justify = "left"
    for r in runs:
        if r.mem_weights_bytes is not None:
            weights = _mib(r.mem_weights_bytes)
        elif r.model_tensor_bytes is not None:
            weights = _mib(r.model_tensor_bytes) + " (host)"
        else:
            weights = "—"
        status = "[green]ok[/]" if r.status == "ok" else f"[red]failed: {escape(str(r.failure))}[/]"
        variant = (r.variant or r.backend) + (" [noise floor]" if r.role == "noise_floor" else "")
        accuracy = "—" if r.accuracy is None else f"{r.accuracy:.1%}"
        if r.weights == "synthetic" and r.accuracy is not None:
            accuracy += " (random weights*)"
        t.add_row(r.run_id[:13], status, escape(r.model_id or "—"), escape(variant), escape(r.kernel_path or "—"),
                  escape(r.gpu_name or "cpu"), "—" if r.n_records is None else str(r.n_records), accuracy,
                  _ms(r.p50_ms), _ms(r.p90_ms), weights, _ms(r.load_s), *((escape(str(r.source)),) if sourced else ()))
    return t


# -- parity (`quantbench compare`) --------------------------------------------------------------------------
def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _agree_txt(a: an.Agreement) -> str:
    return f"{_pct(a.rate)} [{_pct(a.lo)}, {_pct(a.hi)}] ({a.k}/{a.n})"


def _dist_txt(d: an.Dist, digits: int = 4, low_tail: bool = False) -> str:
    f = f"{{:.{digits}f}}".format
    if low_tail:
        return f"mean {f(d.mean)}  min {f(d.min)}  p1 {f(d.p1)}  p10 {f(d.p10)}  median {f(d.median)}  max {f(d.max)}"
    return f"mean {f(d.mean)}  p50 {f(d.median)}  p90 {f(d.p90)}  p99 {f(d.p99)}  max {f(d.max)}"


def print_comparison(comp: Comparison, console: Console | None = None) -> None:
    console = console or term.console()  # to a pipe: whole rows, not wrapped to 80 columns
    c, r = comp.candidate, comp.reference
    console.print(f"[bold]{escape(parity.describe(c))}[/] vs reference [bold]{escape(parity.describe(r))}[/] "
                  f"({comp.reference_how})")  # stored names are text: a variant "ref [/x]" raised MarkupError
    console.print(f"model {c.model_id}, suite {c.suite_id}, {parity.gpu_label(c)}", markup=False)
    for note in comp.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")  # notes quote stored names and paths

    t = Table(title="Parity with the reference", show_lines=False)
    t.add_column("Statistic")
    t.add_column("Candidate")
    t.add_column("Noise floor")
    t.add_column("n", justify="right")
    fl = comp.floor
    t.add_row("Top-answer agreement (95% Wilson)", _agree_txt(comp.agreement), _agree_txt(fl.agreement) if fl else "—",
              str(comp.agreement.n))
    t.add_row("Mean TV (95% bootstrap)", f"{comp.tv_ci.mean:.4f} [{comp.tv_ci.lo:.4f}, {comp.tv_ci.hi:.4f}]",
              f"{fl.tv_ci.mean:.4f} [{fl.tv_ci.lo:.4f}, {fl.tv_ci.hi:.4f}]" if fl else "—", str(comp.tv.n))
    t.add_row("TV per question", _dist_txt(comp.tv), _dist_txt(fl.tv) if fl else "—", str(comp.tv.n))
    t.add_row("KL(ref ‖ cand) per question, nats", _dist_txt(comp.kl), "", str(comp.kl.n))
    if comp.tests is not None:
        fc = comp.tests.flips
        t.add_row(f"Flips by BF16's margin (near-tie < {sig.NEAR_TIE:g} / middle / confident ≥ {sig.CONFIDENT:g})",
                  f"{fc.near_tie_flips} of {fc.near_tie_n} / {fc.middle_flips} of {fc.middle_n} / "
                  f"{fc.confident_flips} of {fc.confident_n}", "", str(fc.n))
    t.add_row("Δp of the reference's top", _dist_txt(comp.dp, low_tail=True), "", str(comp.dp.n))
    f = comp.flips
    t.add_row("Flips on gold (ref right → cand wrong / reverse)",
              f"{f.ref_right_cand_wrong} / {f.ref_wrong_cand_right} (both right {f.both_right}, both wrong "
              f"{f.both_wrong})", "", str(f.n_gold))
    console.print(t)
    if comp.n_candidate_only or comp.n_reference_only:
        console.print(f"questions only the candidate answered: {comp.n_candidate_only}; only the reference: "
                      f"{comp.n_reference_only} (left out)")
    colour = {an.INDISTINGUISHABLE: "green", an.WITHIN_MARGIN: "green", an.WORSE: "red"}.get(comp.verdict.label,
                                                                                            "yellow")
    console.print(f"Verdict: [bold {colour}]{comp.verdict.label}[/]"
                  + (f" (margins: {comp.verdict.margins.describe()})" if comp.verdict.parts else ""))
    for reason in comp.verdict.reasons:
        console.print(f"  - {reason}", markup=False)
    print_tests(comp, console)
    if comp.per_modality:
        print_modalities(comp, console)

    b = Table(title="Agreement by the reference's margin p(top) − p(second)")
    for col in ("Margin", "n", "Agree", "95% CI", "Mean TV"):
        b.add_column(col, justify="left" if col == "Margin" else "right")
    for row in comp.buckets.itertuples():
        b.add_row(row.margin, str(row.n), _pct(row.rate), f"[{_pct(row.ci_lo)}, {_pct(row.ci_hi)}]" if row.n else "—",
                  "—" if not row.n else f"{row.mean_tv:.4f}")
    console.print(b)

    if not comp.paired.by_benchmark.empty:
        a = Table(title="Accuracy on gold, paired on identical questions (Δ in points, 95% paired bootstrap)")
        for col in ("Benchmark", "n", "Reference", "Candidate", "Δ", "95% CI"):
            a.add_column(col, justify="left" if col == "Benchmark" else "right")
        for row in comp.paired.by_benchmark.itertuples():
            a.add_row(str(row.benchmark), str(row.n), f"{100 * row.acc_ref:.1f}", f"{100 * row.acc_cand:.1f}",
                      f"{100 * row.delta:+.1f}", f"[{100 * row.lo:+.1f}, {100 * row.hi:+.1f}]")
        m = comp.paired.mean
        if m is not None:
            a.add_row("mean over benchmarks (unweighted)", str(m.n), "", "", f"{100 * m.mean:+.2f}",
                      f"[{100 * m.lo:+.2f}, {100 * m.hi:+.2f}]")
        console.print(a)
    else:
        console.print("no gold answers in this suite: no accuracy figures")


def print_tests(comp: Comparison, console: Console) -> None:
    """McNemar against BF16 and the floor, TOST against the named margin and the smallest detectable difference,
    for the whole comparison; with several modalities, a table of each modality's (Holm-adjusted across them)."""
    from quantbench.report.statistics import cell_text, comparison_cells

    ct = comp.tests
    if ct is None:
        return
    console.print("McNemar exact, vs BF16 on gold answers (lost / gained): "
                  + (ct.mcnemar_ref.text(adjusted=False) if ct.mcnemar_ref else "— (no gold answers)"))
    console.print("McNemar exact, vs the noise floor on flips (extra / fewer): "
                  + (ct.mcnemar_floor.text(adjusted=False) if ct.mcnemar_floor else "— (no noise floor)"))
    margins = ct.verdict.margins
    console.print(f"Equivalence (TOST, α 0.05) against the margin {margins.describe() if margins else '—'}: "
                  f"{_tost_words(ct.tost_p)}")
    for e in ct.verdict.parts:
        if e.tost is not None:
            sides = (f"p(Δ ≤ −margin) {hy.fmt_p(e.tost.p_lower)}, " if e.tost.p_lower is not None else "one-sided, ")
            console.print(f"  - {e.statistic}: {sides}p(Δ ≥ +margin) {hy.fmt_p(e.tost.p_upper)}")
    # each statistic's own questions: those the floor answered too, the gold ones for accuracy (not the comparison's)
    n_text = " / ".join(sorted({str(e.n) for e in ct.verdict.parts}, key=int)) or str(comp.agreement.n)
    console.print(f"Smallest detectable difference (α 0.05 two-sided, power 80%, n = {n_text}): "
                  f"{ct.mdd_text()}")
    if comp.per_modality:
        cells = comparison_cells(comp)
        t = Table(title=f"Tests per modality (p-values Holm-adjusted across these {len(cells)} modalities)")
        rows = [cell_text(tests, modality, n) for modality, n, tests in cells]
        for col in rows[0]:
            t.add_column(col, justify="right" if col == "n" else "left")
        for row in rows:
            t.add_row(*row.values())
        console.print(t)


def _tost_words(p: float | None) -> str:
    if p is None:
        return "not testable (no statistic of the margin could be computed)"
    return (f"[green]equivalent[/] (p {hy.fmt_p(p)})" if p < hy.ALPHA else
            f"[yellow]not shown equivalent[/] (p {hy.fmt_p(p)})")


def print_modalities(comp: Comparison, console: Console) -> None:
    """Parity per modality, then why each modality on which the variant is worse is worse."""
    from quantbench.report.render import modality_cells

    rows = [modality_cells(m) for m in comp.modalities]
    t = Table(title="Parity per modality (the same figures and verdict rule on each modality's questions)")
    for col in rows[0]:
        t.add_column(col, justify="right" if col == "n" else "left")
    colour = {an.INDISTINGUISHABLE: "green", an.WITHIN_MARGIN: "green", an.WORSE: "red"}
    for m, row in zip(comp.modalities, rows, strict=True):
        verdict = row.pop("Verdict")
        t.add_row(*row.values(), f"[{colour.get(m.verdict.label, 'yellow')}]{verdict}[/]")
    console.print(t)
    for m in comp.flagged():
        console.print(f"[bold red]worse on {m.modality}[/] ({m.agreement.n} questions):")
        for reason in m.verdict.reasons:
            console.print(f"  - {reason}")


def print_efficiency(comp: Comparison, effs: dict[str, efficiency.Efficiency], console: Console | None = None) -> None:
    """Speed, energy and cost per decision of the candidate and its reference (`quantbench compare`)."""
    console = console or term.console()
    priced = any(e.price_per_gpu_hour is not None for e in effs.values())
    t = Table(title="Speed, energy and cost per decision")
    for col in ("Run", "Time per decision", "Energy per decision", "Mean power", "Idle power",
                *(["Cost per 1M decisions"] if priced else [])):
        t.add_column(col, justify="left" if col == "Run" else "right")
    runs = {"candidate": comp.candidate, "reference": comp.reference}
    for name, e in effs.items():
        per = "n/a" if e.seconds_per_decision is None else f"{1e3 * e.seconds_per_decision:,.2f} ms"
        t.add_row(f"{name}: {parity.describe(runs[name])}", per, efficiency.energy_text(e),
                  efficiency.fmt_watts(e.mean_w), efficiency.fmt_watts(e.idle_w),
                  *([efficiency.cost_text(e)] if priced else []))
    console.print(t)
    basis = {e.time_basis for e in effs.values()}
    console.print("time per decision: " + "; ".join(sorted(basis)))
    for name, e in effs.items():
        if e.energy_note:
            console.print(f"{name} energy: {e.energy_note}")
    if priced and not any(e.gpu for e in effs.values()):
        console.print(f"cost: n/a ({efficiency.NO_GPU_COST})")


# -- sharing (`quantbench export`, `quantbench merge`) -------------------------------------------------------
def print_exported(store: Store, paths: list[Path], console: Console | None = None) -> None:
    """One line per file an export wrote: how many runs and answers, its size and schema version."""
    console = console or term.console()
    for p in paths:
        runs, answers = exported_counts(p)
        console.print(f"exported {runs} runs ({answers} answers) from {escape(str(store.path))} to [bold]{escape(str(p))}[/] "
                      f"({p.stat().st_size / 1e6:.2f} MB, schema version {store.schema_version()})")


def print_merged(store: Store, summary: MergeSummary, console: Console | None = None) -> None:
    """What a merge added, per source and per machine."""
    console = console or term.console()
    t = Table(title=escape(f"Merged into {store.path}"))  # a path's "[x]" is text, not markup
    for col in ("Source", "Kind", "Schema", "Runs", "Added", "Already here", "Answers", "Latencies"):
        t.add_column(col, justify="left" if col in ("Source", "Kind") else "right", overflow="fold")
    for s in summary.sources:
        t.add_row(escape(s.path), s.kind, str(s.schema_version), str(s.runs_in_source), str(s.runs_added),
                  str(s.runs_present), str(s.answers_added), str(s.latencies_added))
    console.print(t)
    for note in summary.skipped:
        console.print(f"skipped {note}", markup=False)
    if summary.added.empty:
        console.print("nothing new: every run was already in the store")
        return
    added = summary.added.copy()
    added["where"] = machine_labels(added)
    grouped = added.groupby(["where", "model_id", "variant", "status"], dropna=False).size().reset_index(name="runs")
    w = Table(title="What came in")
    for col in ("Machine", "Model", "Variant", "Status", "Runs"):
        w.add_column(col, justify="right" if col == "Runs" else "left")
    for row in grouped.itertuples(index=False):
        w.add_row(*("—" if x is None or (isinstance(x, float) and x != x) else escape(str(x)) for x in row))
    console.print(w)


def machine_labels(added: pd.DataFrame) -> list[str]:
    """Each new run's machine, as "What came in" names it: its GPU (or CPU) and host name, and where machines of
    one such name differ (two hosts both called localhost, two containers of one name on other hardware), what
    tells them apart, so that they are two lines: "NVIDIA H200 (localhost, machine 3d1219c7)"."""
    rows = added.to_dict("records")
    names = [_device_and_host(r) for r in rows]
    marks = [_machine_marks(r) for r in rows]
    seen: dict[tuple[str, str], set[tuple]] = {}
    for name, mark in zip(names, marks, strict=True):
        seen.setdefault(name, set()).add(mark)
    # a mark is shown where it differs among the machines of one name: the common case keeps its short label
    differs = {name: [i for i, values in enumerate(zip(*m, strict=True)) if len(set(values)) > 1]
               for name, m in seen.items()}
    return [f"{device} ({', '.join([host, *(mark[i] or '—' for i in differs[(device, host)])])})"
            for (device, host), mark in zip(names, marks, strict=True)]


def _device_and_host(run: dict[str, Any]) -> tuple[str, str]:
    gpu, host = stored_value(run.get("gpu_name")), stored_value(run.get("host"))
    device = "CPU" if run.get("device") == "cpu" or gpu is None else str(gpu)
    return device, "—" if host is None else str(host)  # a value not stored reads "—", never "None"


def _machine_marks(run: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """What tells a machine from another of its host name: its machine id (sha256 of /etc/machine-id), or, for a
    run without one (an older run, a container without that file), its GPU's UUID; then its CPU model and count.
    None where not stored."""
    machine, uuid, cpu, cores = (stored_value(run.get(k)) for k in ("machine_id", "gpu_uuid", "cpu_model", "cpu_cores"))
    ident = f"machine {str(machine)[:8]}" if machine is not None else (str(uuid)[:12] if uuid is not None else None)
    return ident, None if cpu is None else str(cpu), None if cores is None else f"{int(cores)} CPUs"
