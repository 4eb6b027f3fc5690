"""The report table as a DataFrame: the text cells of `quantbench report` plus the raw agreement for its bar."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from dashboard.figures import point_labels
from quantbench.analysis.provenance import origin_text
from quantbench.report import GpuMatrix, GpuReport, cells, flat_rows

AGREEMENT = "Agreement"  # the numeric column behind the progress bar
AGREE_TEXT = "Agrees with BF16 (95% CI)"
DIFFERS = "Kernel differs by"  # the words of the kernel path that tell one variant's runs apart
ENERGY = "Energy per decision"  # report.cells' columns: J/decision beside latency, cost when a price is given
COST = "Cost per 1M decisions"
HIGHLIGHT = "background-color: rgba(255, 196, 0, 0.3)"
FAILED = "color: #9a9a9a"
SOURCE = "Source"


def report_frame(rep: GpuReport, history: bool = False) -> pd.DataFrame:
    """One row per variant: `report.cells` (the very strings `quantbench report` prints) and the agreement
    fraction from `report.flat_rows`, put just before its text; with `history` (rows named by their whole kernel
    path), the words of the path that tell one variant's rows apart."""
    flat = flat_rows([rep])
    rows = []
    for row, raw in zip(rep.rows, flat.to_dict("records"), strict=True):
        text = cells(row, rep)
        out: dict[str, object] = {}
        for k, v in text.items():
            if k == AGREE_TEXT:
                out[AGREEMENT] = raw["agreement"]
            out[k] = v
        out[SOURCE] = origin_text(row.run)  # where the row came from: its bundle, host and date
        rows.append(out)
    df = pd.DataFrame(rows)
    df[AGREEMENT] = pd.to_numeric(df[AGREEMENT], errors="coerce")
    # Where one variant ran under several kernels, its label ends in the whole kernel path, which the pinned
    # Variant column cuts off before the words that differ (seen in the H200 screenshots): show those words.
    short = point_labels(df["Variant"])
    apart = short.map(lambda s: s.split(" · ", 1)[1] if " · " in s else "")
    if history and apart.any():
        df.insert(1, DIFFERS, apart)
    return df


def matrix_frame(matrix: GpuMatrix) -> pd.DataFrame:
    """`report.gpu_matrices`' matrix as a table: a row per variant, a column per GPU, and the pick per GPU last."""
    rows = [{"Variant": label, **{g: by_gpu.get(g, "not run") for g in matrix.gpus}}
            for label, by_gpu in matrix.cells.items()]
    rows.append({"Variant": "Pick", **{g: matrix.picks[g] for g in matrix.gpus}})
    return pd.DataFrame(rows)


def matrix_column_config(matrix: GpuMatrix) -> dict:
    cc = st.column_config
    return {"Variant": cc.TextColumn("Variant", width=160, pinned=True),
            **{g: cc.TextColumn(g, width=260) for g in matrix.gpus}}


def styled(rep: GpuReport, df: pd.DataFrame) -> Styler:
    """The recommended row highlighted, failed rows greyed."""
    marks = [HIGHLIGHT if r.recommended else FAILED if not r.ok else "" for r in rep.rows]
    return df.style.apply(lambda col: marks, axis=0).format({AGREEMENT: lambda v: "" if pd.isna(v) else f"{v:.1%}"})


def column_config(rep: GpuReport) -> dict:
    mem = "host memory" if rep.cpu else "VRAM"
    cc = st.column_config
    return {
        "Variant": cc.TextColumn("Variant", width=190, pinned=True),  # "bf16 (transformers grouped_mm)" whole
        DIFFERS: cc.TextColumn(DIFFERS, width=390, help="where one variant ran under several kernels: the words of "
                               "its kernel path that tell the runs apart (the whole path is in Variant)"),
        AGREEMENT: cc.ProgressColumn("Agreement", min_value=0.0, max_value=1.0, format="percent",
                                     width=105,
                                     help="share of questions where the variant's top answer matches BF16's"),
        AGREE_TEXT: cc.TextColumn("95% CI (Wilson)", width=120, help="agreement and its 95% Wilson interval; † = against "
                                  "BF16 on another GPU"),
        "TV": cc.TextColumn("TV", width="small", help="mean total variation between the per-option distributions"),
        "Δ accuracy vs BF16": cc.TextColumn("Δ accuracy vs BF16", help="paired, on identical questions, 95% "
                                            "bootstrap interval"),
        "Latency p50 / p90 (per decision)": cc.TextColumn("p50 / p90", width=88, help="per decision; ± a 95% t "
                                                          "interval over the runs of `run --repeat N`; ⚠ busy: "
                                                          "measured while others used the machine"),
        "Against the floors (latency, energy)": cc.TextColumn("Against the floors", width=230, help="floor ÷ "
                                                              "measured: the weights in VRAM ÷ the spec sheet's "
                                                              "bandwidth, and that time at the board's power"),
        ENERGY: cc.TextColumn("J / decision", width=130, help="GPU energy per decision over the whole timed phase "
                              "(NVML's energy counter), and above the idle power; n/a on a CPU or where not measured"),
        COST: cc.TextColumn("$ / 1M decisions", width=110, help="at the price per GPU hour given: from the mean model "
                            "time per decision at batch 1; n/a on a CPU"),
        "Best for": cc.TextColumn("Best for", width=425),
        "Kernel": cc.TextColumn("Kernel", width=420, help="the kernel path the run used (History shows every "
                                "generation's newest run)"),
        "Native here?": cc.TextColumn("Native here?", width=92),
        SOURCE: cc.TextColumn(SOURCE, width=330, help="where the row came from: your store, a pulled bundle (who "
                              "published it and when) or the results shipped with quantbench; the host and day it "
                              "was measured"),
        "Size on disk": cc.TextColumn("Disk", width="small", help="GB (10⁹ bytes)"),
        "Format": cc.TextColumn("Format", width="small"),
        **{k: cc.TextColumn(k, width=w, help=f"GiB of {mem}") for k, w in (
            ("VRAM (weights)", 100), ("Peak VRAM", 100), ("Weights (host memory)", 140), ("Peak host RSS", 105))},
    }


# What decides first (quality, speed, memory, the verdict), then the details a wide screen also shows.
ORDER = ["Variant", DIFFERS, AGREEMENT, AGREE_TEXT, "Verdict", "Latency p50 / p90 (per decision)", ENERGY, COST,
         "Against the floors (latency, energy)",
         "VRAM (weights)",
         "Weights (host memory)", "Peak VRAM", "Peak host RSS", "Native here?", "Best for", SOURCE, "Kernel",
         "Δ accuracy vs BF16", "TV",
         "Size on disk", "Format"]


def column_order(df: pd.DataFrame) -> list[str]:
    return [c for c in ORDER if c in df.columns] + [c for c in df.columns if c not in ORDER]
