"""The "Which quant should I use?" report: the rule lives in quantbench.analysis.recommend, the text in
quantbench.report.render (its flat table quantbench.report.flat), the rich tables of the CLI in quantbench.report.tables. The names the dashboard and the
tests use are importable from here."""

from quantbench.analysis.recommend import (
    FIXTURE_PREFIX,
    GIB,
    SYNTHETIC_NOTE,
    GpuReport,
    Rules,
    build_report,
    since_filter,
    throughput,
)
from quantbench.report.flat import flat_rows
from quantbench.report.render import (
    GpuMatrix,
    cells,
    fmt_ms,
    gpu_matrices,
    render,
    report_for_this_machine,
    report_text,
    throughput_notes,
)

__all__ = ["FIXTURE_PREFIX", "GIB", "SYNTHETIC_NOTE", "GpuMatrix", "GpuReport", "Rules", "build_report", "cells",
           "flat_rows", "fmt_ms", "gpu_matrices", "render", "report_for_this_machine", "report_text", "since_filter",
           "throughput", "throughput_notes"]
