"""Plotly figures. They draw figures the report and parity modules computed; the only geometry made here is
the Pareto frontier (which points no other point beats on both axes)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from quantbench.report import GIB, GpuReport, Rules

# One colour per weight format, stable across charts and GPUs.
FORMAT_COLOURS = {"bf16": "#4C78A8", "fp8": "#F58518", "int4": "#54A24B", "nvfp4": "#B279A2"}
OTHER = ["#E45756", "#72B7B2", "#EECA3B", "#9D755D"]
LAYOUT = {"template": "plotly_white", "margin": {"l": 10, "r": 10, "t": 40, "b": 10}, "height": 440,
          "legend": {"orientation": "h", "y": -0.18}}


def colour(fmt: str) -> str:
    name = str(fmt).lower().replace("bfloat16", "bf16")  # a real run's format reads bfloat16
    for prefix, c in FORMAT_COLOURS.items():
        if name.startswith(prefix):
            return c
    return OTHER[sum(map(ord, str(fmt))) % len(OTHER)]


def pareto(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points nobody beats: no other point is both faster (lower x) and agrees more (higher y)."""
    best = -math.inf
    keep = []
    for i, p in points.sort_values([x, y], ascending=[True, False]).iterrows():
        if p[y] > best:
            keep.append(i)
            best = p[y]
    return points.loc[keep]


def point_labels(variants: pd.Series) -> pd.Series:
    """Short labels for the points: a variant's name without the kernel path in its brackets (the hover keeps the
    whole name); where one variant ran with several paths, the words that tell its runs apart. Whole names put
    side by side at one agreement overlap into an unreadable line."""
    base = variants.str.split(" (", n=1, regex=False).str[0]
    inner = variants.map(lambda v: v.split(" (", 1)[1].removesuffix(")") if " (" in v else "")
    out = base.copy()
    for name, grp in inner.groupby(base):
        if len(grp) < 2:
            continue
        shared = set.intersection(*(set(v.split()) for v in grp))
        for i, v in grp.items():
            own = [w for w in v.split() if w not in shared]
            out[i] = f"{name} · {' '.join(own)}" if own else name
    return out


def label_positions(x: pd.Series) -> pd.Series:
    """Neighbours along x alternate their labels above and below the points, so labels at one height do not run
    together; the leftmost and rightmost points' labels run inwards, where a centred one was cut at the plot's edge
    (seen on the two-point auto-round chart)."""
    rank = x.rank(method="first").astype(int)
    side = pd.Series("center", index=x.index)
    if len(x) > 1:
        side[rank == 1], side[rank == len(x)] = "right", "left"
    return (rank % 2).map({1: "top", 0: "bottom"}) + " " + side


CROWDED = 6  # more points than this on a chart: numbers on the points, the names in the legend


def point_traces(pts: pd.DataFrame) -> list[tuple[str, str, pd.Index, list[str]]]:
    """(legend name, format, rows, point texts) per trace. Up to CROWDED points: one trace per format, each point
    with its label. More (every kernel path of a day's runs) would write the labels over each other: one trace
    per point, numbered fastest first, its label in the legend."""
    labels = point_labels(pts["variant"])
    if len(pts) <= CROWDED:  # labels on the points, long kernel words wrapped so they stay on the plot
        return [(str(fmt), str(fmt), grp.index, [wrap_label(t) for t in labels.loc[grp.index]])
                for fmt, grp in pts.groupby("weight_format", sort=True)]
    order = pts.sort_values("p50_ms", kind="stable").index
    return [(f"{i} · {labels[idx]}", str(pts.at[idx, "weight_format"]), pd.Index([idx]), [str(i)])
            for i, idx in enumerate(order, start=1)]


def _legend_beside(fig: go.Figure, traces: int) -> None:
    """One legend row per point (point_traces past CROWDED): the legend stands beside the plot, untitled (its
    rows are points, not formats)."""
    if traces > CROWDED:
        fig.update_layout(legend={"orientation": "v", "x": 1.02, "y": 1, "xanchor": "left", "yanchor": "top",
                                  "title": {"text": ""}},
                          height=max(440, 60 + 22 * traces))


def _bubble(gib: pd.Series) -> pd.Series:
    """Marker diameter in px; area proportional to memory."""
    top = max(float(gib.max()), 1e-9)
    return 14 + 46 * (gib / top) ** 0.5


def tradeoff(rep: GpuReport, flat: pd.DataFrame, rules: Rules) -> go.Figure:
    """Latency (x) against agreement with BF16 (y); bubble area = weights in memory; colour = format."""
    mem = "memory" if rep.cpu else "VRAM"
    pts = flat[(flat["status"] == "ok") & flat["p50_ms"].notna()].copy()
    is_ref = pts["quality"].eq("reference")
    pts = pts[is_ref | pts["agreement"].notna()]
    is_ref = pts["quality"].eq("reference")
    # The reference agrees with itself by definition: drawn at 100% without an interval.
    pts["y"] = (pts["agreement"].where(~is_ref, 1.0)).astype(float) * 100
    pts["lo"] = (pts["y"] - pts["agreement_lo"].where(~is_ref, 1.0).astype(float) * 100).fillna(0)
    pts["hi"] = (pts["agreement_hi"].where(~is_ref, 1.0).astype(float) * 100 - pts["y"]).fillna(0)
    pts["gib"] = pts["weights_memory_bytes"].astype(float) / GIB
    fig = go.Figure()
    if rep.floor is not None:
        f = rep.floor
        fig.add_hrect(y0=100 * f.agreement.lo, y1=100 * f.agreement.hi, fillcolor="#999999", opacity=0.18,
                      line_width=0, layer="below")
        fig.add_hline(y=100 * f.agreement.rate, line={"color": "#777777", "width": 1},
                      annotation_text=f"noise floor: BF16 vs BF16 ({f.run.kernel_path}) "
                                      f"{100 * f.agreement.rate:.1f}% (95% CI band)",
                      annotation_position="bottom left", annotation_font_color="#555555")
    fig.add_hline(y=100 * rules.min_agreement, line={"color": "#d62728", "width": 1, "dash": "dot"},
                  annotation_text=f"minimum agreement {100 * rules.min_agreement:g}%",
                  annotation_position="top right", annotation_font_color="#d62728")
    if len(pts) > 1:
        front = pareto(pts, "p50_ms", "y")
        fig.add_trace(go.Scatter(x=front["p50_ms"], y=front["y"], mode="lines", name="Pareto frontier",
                                 line={"color": "#333333", "dash": "dash", "width": 1.5, "shape": "hv"},
                                 hoverinfo="skip"))
    positions = label_positions(pts["p50_ms"])
    traces = point_traces(pts)
    for name, fmt, rows, texts in traces:
        grp = pts.loc[rows]
        fig.add_trace(go.Scatter(
            x=grp["p50_ms"], y=grp["y"], mode="markers+text", name=name, legendgroup=fmt,
            text=[("⭐ " if r else "") + t for t, r in zip(texts, grp["recommended"], strict=True)],
            textposition=list(positions.loc[rows]), cliponaxis=False,
            marker={"size": _bubble(pts["gib"]).loc[rows], "color": colour(fmt), "opacity": 0.75,
                    "line": {"width": [3 if r else 1 for r in grp["recommended"]], "color": "#222222"}},
            error_y={"type": "data", "symmetric": False, "array": grp["hi"], "arrayminus": grp["lo"],
                     "color": "#888888", "thickness": 1},
            customdata=grp[["gib", "agreement_lo", "agreement_hi"]].astype(float).fillna(1.0).to_numpy(),
            hovertext=list(grp["variant"]),
            hovertemplate=("%{hovertext}<br>p50 %{x:.1f} ms<br>agreement %{y:.1f}% "
                           "(95% CI %{customdata[1]:.1%}–%{customdata[2]:.1%})<br>"
                           f"weights in {mem} %{{customdata[0]:.1f}} GiB<extra>{fmt}</extra>"),
        ))
    lows = [100 * rules.min_agreement] + list(pts["y"] - pts["lo"])
    if rep.floor is not None:
        lows.append(100 * rep.floor.agreement.lo)
    fig.update_layout(**LAYOUT, title=f"Latency vs agreement with BF16 (bubble area = weights in {mem})",
                      legend_title_text="format")
    _legend_beside(fig, len(traces))
    fig.update_xaxes(title="latency p50 per decision (ms)", rangemode="tozero")
    fig.update_yaxes(title="agrees with BF16 (%)", range=[max(0.0, min(lows) - 2), 101.5])
    return fig


def speed_memory(rep: GpuReport, flat: pd.DataFrame) -> go.Figure:
    """For runs without quality figures (synthetic weights, no reference): latency against memory only."""
    mem = "memory" if rep.cpu else "VRAM"
    pts = flat[(flat["status"] == "ok") & flat["p50_ms"].notna() & flat["weights_memory_bytes"].notna()]
    fig = go.Figure()
    positions = label_positions(pts["p50_ms"])
    traces = point_traces(pts)
    for name, fmt, rows, texts in traces:
        fig.add_trace(go.Scatter(x=pts.loc[rows, "p50_ms"], y=pts.loc[rows, "weights_memory_bytes"].astype(float) / GIB,
                                 mode="markers+text", name=name, legendgroup=fmt, text=texts,
                                 hovertext=list(pts.loc[rows, "variant"]), textposition=list(positions.loc[rows]),
                                 marker={"size": 18, "color": colour(fmt)}))
    fig.update_layout(**LAYOUT, title=f"Latency vs weights in {mem} (speed and memory only)")
    _legend_beside(fig, len(traces))
    # one slow kernel (the eager noise floor) beside the fast paths would press them into one corner: log axis
    wide = len(pts) > 1 and float(pts["p50_ms"].max()) > 20 * float(pts["p50_ms"].min())
    fig.update_xaxes(title="latency p50 per decision (ms)" + (" (log scale)" if wide else ""),
                     type="log" if wide else "linear", rangemode="tozero")
    top = float((pts["weights_memory_bytes"].astype(float) / GIB).max()) if len(pts) else 1.0
    fig.update_yaxes(title=f"weights in {mem} (GiB)", range=[0, 1.3 * top])  # room for the labels above the top
    return fig


def wrap_label(label: str, width: int = 44) -> str:
    """A row label broken at spaces into lines of about `width` characters (plotly's <br>)."""
    lines: list[str] = []
    for word in label.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def latency_box(lat: pd.DataFrame, order: list[str], kind: str = "box") -> go.Figure:
    """Per-decision model latency, one horizontal box (or violin) per variant: the labels (variant, kernel path,
    suite) read along the rows instead of squeezing the plot. A log axis when the slowest decision is over 20x the
    fastest median (the eager noise-floor kernel beside the fast paths, or one far outlier), so every box stays
    visible."""
    fig = go.Figure()
    medians = []
    lines = 0
    for label in reversed(order):  # plotly stacks the first trace at the bottom
        grp = lat[lat["variant"] == label]
        fmt = str(grp["weight_format"].iloc[0]) if len(grp) else ""
        if len(grp):
            medians.append(float(grp["model_ms"].median()))
        name = wrap_label(label)  # long kernel paths on one line left the boxes a sliver of the width
        lines += name.count("<br>") + 1
        common = {"x": grp["model_ms"], "name": name, "marker_color": colour(fmt), "showlegend": False,
                  "orientation": "h"}
        if kind == "violin":
            fig.add_trace(go.Violin(**common, box_visible=True, meanline_visible=False, points="outliers"))
        else:
            fig.add_trace(go.Box(**common, boxpoints="outliers"))
    top = float(lat.loc[lat["variant"].isin(order), "model_ms"].max()) if medians else 0.0
    log = bool(medians) and min(medians) > 0 and top / min(medians) > 20  # a far outlier squeezes boxes too
    fig.update_layout(**{**LAYOUT, "height": max(260, 90 + 20 * len(order) + 14 * lines)},
                      title="Model time per decision")
    fig.update_xaxes(title="ms per decision" + (" (log scale)" if log else ""), type="log" if log else "linear",
                     rangemode="normal" if log else "tozero")
    fig.update_yaxes(automargin=True)
    return fig


def buckets(df: pd.DataFrame) -> go.Figure:
    """Agreement by the reference's margin p(top) − p(second), with Wilson intervals."""
    d = df[df["n"] > 0]
    fig = go.Figure(go.Bar(
        x=d["margin"], y=100 * d["rate"], marker_color="#4C78A8", text=[f"n={n}" for n in d["n"]],
        textposition="inside", insidetextanchor="start",
        error_y={"type": "data", "symmetric": False, "array": 100 * (d["ci_hi"] - d["rate"]),
                 "arrayminus": 100 * (d["rate"] - d["ci_lo"])},
    ))
    fig.update_layout(**LAYOUT, title="Agreement by the reference's confidence (margin between its top two)")
    fig.update_xaxes(title="reference margin p(top) − p(second)", type="category")
    fig.update_yaxes(title="agrees with BF16 (%)", range=[0, 105])
    return fig


def paired_deltas(by: pd.DataFrame, mean: tuple[float, float, float] | None) -> go.Figure:
    """Candidate minus reference accuracy per benchmark (points), with 95% paired bootstrap intervals."""
    names = list(by["benchmark"].astype(str))
    y = list(100 * by["delta"])
    lo = list(100 * (by["delta"] - by["lo"]))
    hi = list(100 * (by["hi"] - by["delta"]))
    if mean is not None:
        names.append("mean (unweighted)")
        y.append(100 * mean[0])
        lo.append(100 * (mean[0] - mean[1]))
        hi.append(100 * (mean[2] - mean[0]))
    fig = go.Figure(go.Scatter(
        x=y, y=names, mode="markers", marker={"size": 11, "color": ["#4C78A8"] * len(by) + ["#222222"] * (mean is not None)},
        error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        hovertemplate="%{y}: %{x:+.2f} pts<extra></extra>"))
    fig.add_vline(x=0, line={"color": "#777777", "width": 1})
    fig.update_layout(**LAYOUT, title="Δ accuracy vs BF16 on identical questions (points, 95% CI)")
    fig.update_layout(height=max(240, 70 * len(names) + 120))
    fig.update_xaxes(title="accuracy points (candidate − BF16)")
    fig.update_yaxes(autorange="reversed")
    return fig


def throughput_latency(steps: pd.DataFrame, percentile: str = "p99_ms") -> go.Figure:
    """Load runs: decisions/s against end-to-end latency (`percentile`: p50_ms or p99_ms), one line per run
    through its steps in order, each point labelled by its clients (or rate). A log latency axis when the slowest
    step is over 20x the fastest (past saturation p99 runs away), so the knee stays visible. The legend names a
    run by its `legend` column where there is one (else its `label`), one run a row below the x axis title."""
    fig = go.Figure()
    for i, (label, run) in enumerate(steps.groupby("label", sort=False)):
        run = run.sort_values("step")
        name = str(run["legend"].iloc[0]) if "legend" in run.columns else str(label)
        load = [f"{r:g}/s" if r == r and r is not None else f"{int(c)}" for r, c in zip(run["rate"], run["concurrency"],
                                                                                           strict=True)]
        fig.add_trace(go.Scatter(
            x=run["decisions_per_s"], y=run[percentile], mode="lines+markers+text", name=wrap_label(name, 110),
            text=load, textposition="top center", marker={"color": OTHER[i % len(OTHER)], "size": 9},
            hovertemplate=f"{name}<br>" + "%{text}: %{x:.1f} decisions/s, %{y:.1f} ms<extra></extra>"))
    values = steps[percentile].dropna()
    log = len(values) > 0 and float(values.min()) > 0 and float(values.max()) / float(values.min()) > 20
    rows = sum(name.count("<br>") + 1 for name in (t.name for t in fig.data))
    # The legend sits at the foot of the figure (the container, not the plot), in a bottom margin made for its
    # rows under the x axis title: put at y=-0.18 of the plot it was anchored at its bottom and grew upwards over
    # the axis title as its names took more rows.
    fig.update_layout(**{**LAYOUT, "height": 400 + 22 * rows,
                         "margin": {**LAYOUT["margin"], "b": 70 + 22 * rows},
                         "legend": {"orientation": "h", "yanchor": "bottom", "y": 0, "x": 0, "xanchor": "left",
                                    "yref": "container", "traceorder": "normal"}},
                      title="Throughput against latency (points: clients, or arrivals a second)")
    fig.update_xaxes(title="decisions/s (answered)", rangemode="tozero")
    fig.update_yaxes(title=f"{percentile.removesuffix('_ms')} end to end, ms" + (" (log scale)" if log else ""),
                     type="log" if log else "linear")
    return fig


# One colour per modality, the same on every page (the parity breakdown, the disagreement viewer, latency).
# Hues apart from the format colours above (a chart of variants and one of modalities sit on one page).
MODALITY_COLOURS = {"text": "#5F6B7A", "image": "#D62976", "audio": "#17A2B8", "video": "#6F42C1", "mixed": "#A0522D"}
MODALITY_ORDER = list(MODALITY_COLOURS)


def modality_colour(modality: str) -> str:
    return MODALITY_COLOURS.get(str(modality), OTHER[0])


def modality_sorted(modalities) -> list[str]:
    """Modalities in the fixed order (text, image, audio, video, mixed), any other after them."""
    return sorted(set(map(str, modalities)), key=lambda m: (MODALITY_ORDER.index(m) if m in MODALITY_ORDER else 99, m))


def waveform(samples, rate: int, title: str) -> go.Figure:
    """An audio clip's samples against time (at most ~4,000 points: the min and max of each slice, so a
    burst survives the thinning)."""
    import numpy as np

    x = np.asarray(samples, dtype=np.float32)
    step = max(1, len(x) // 2000)
    n = len(x) // step * step
    if step > 1 and n:
        blocks = x[:n].reshape(-1, step)
        y = np.column_stack([blocks.min(axis=1), blocks.max(axis=1)]).ravel()
        t = np.repeat(np.arange(len(blocks)) * step / rate, 2)
    else:
        y, t = x, np.arange(len(x)) / rate
    fig = go.Figure(go.Scatter(x=t, y=y, mode="lines", line={"color": MODALITY_COLOURS["audio"], "width": 1},
                               hoverinfo="skip"))
    fig.update_layout(**{**LAYOUT, "height": 220, "margin": {"l": 10, "r": 10, "t": 36, "b": 10}}, title=title,
                      showlegend=False)
    fig.update_xaxes(title="seconds", range=[0, len(x) / rate])
    fig.update_yaxes(title="amplitude", range=[-1.05, 1.05])
    return fig


def variant_colours(formats: list[str]) -> list[str]:
    """A colour per variant: its format's for the first of each format, then the spare colours (two int4
    variants side by side must not share one)."""
    used: set[str] = set()
    spare = iter(OTHER * 3)
    out = []
    for fmt in formats:
        c = colour(fmt)
        while c in used:
            c = next(spare)
        used.add(c)
        out.append(c)
    return out


def option_probs(answers: pd.DataFrame, gold: str | None) -> go.Figure:
    """Each variant's probability of each option on one question: one bar per variant (colour = its format) in
    each option's group, the reference's hatched; the gold option named on the axis."""
    fig = go.Figure()
    options = list(answers["options"].iloc[0]) if len(answers) else []
    colours = variant_colours(answers["weight_format"].astype(str).tolist())
    for (_, a), c in zip(answers.iterrows(), colours, strict=True):
        probs = dict(zip(a["options"], a["probs"], strict=True))
        fig.add_trace(go.Bar(
            x=[f"{o} ✓" if o == gold else o for o in options], y=[probs.get(o, 0.0) for o in options],
            name=str(a["variant"]), marker_color=c,
            marker_pattern_shape="/" if a["is_reference"] else "",
            text=[f"{probs.get(o, 0.0):.2f}" for o in options], textposition="outside",
            hovertemplate="%{x}: %{y:.3f}<extra>" + str(a["variant"]) + "</extra>"))
    fig.update_layout(**{**LAYOUT, "height": 340, "legend": {"orientation": "h", "y": -0.25}}, barmode="group",
                      title="Each variant's probability per option (✓ gold)")
    fig.update_yaxes(title="probability", range=[0, 1.12])
    return fig


def modality_breakdown(df: pd.DataFrame, floor: bool = True) -> go.Figure:
    """Per modality (quantbench.analysis.parity.by_modality's rows): agreement with BF16 and Δ accuracy, each with
    its 95% interval, one colour per modality; the noise floor's agreement on the same questions as a hollow
    mark."""
    from plotly.subplots import make_subplots

    df = df.reset_index(drop=True)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("agrees with BF16 (%, 95% CI)", "Δ accuracy vs BF16 (points, 95% CI)"))
    names = [f"{m} (n={n})" for m, n in zip(df["modality"], df["n"], strict=True)]
    colours = [modality_colour(m) for m in df["modality"]]
    agree = 100 * df["agreement"].astype(float)
    fig.add_trace(go.Scatter(
        x=agree, y=names, mode="markers", marker={"size": 12, "color": colours}, showlegend=False,
        error_x={"type": "data", "symmetric": False, "array": 100 * df["agreement_hi"].astype(float) - agree,
                 "arrayminus": agree - 100 * df["agreement_lo"].astype(float)},
        hovertemplate="%{y}: %{x:.1f}%<extra>agreement</extra>"), row=1, col=1)
    if floor and df["floor_agreement"].notna().any():
        fig.add_trace(go.Scatter(
            x=100 * df["floor_agreement"].astype(float), y=names, mode="markers", name="noise floor (same questions)",
            marker={"size": 11, "symbol": "diamond-open", "color": "#555555"},
            hovertemplate="%{y}: floor %{x:.1f}%<extra></extra>"), row=1, col=1)
    gold = df[df["delta_accuracy"].notna()]
    if len(gold):
        delta = 100 * gold["delta_accuracy"].astype(float)
        fig.add_trace(go.Scatter(
            x=delta, y=[names[i] for i in gold.index], mode="markers", showlegend=False,
            marker={"size": 12, "color": [colours[i] for i in gold.index], "symbol": "square"},
            error_x={"type": "data", "symmetric": False,
                     "array": 100 * gold["delta_accuracy_hi"].astype(float) - delta,
                     "arrayminus": delta - 100 * gold["delta_accuracy_lo"].astype(float)},
            hovertemplate="%{y}: %{x:+.1f} pts<extra>Δ accuracy</extra>"), row=1, col=2)
    fig.add_vline(x=0, line={"color": "#777777", "width": 1}, row=1, col=2)
    fig.update_layout(**{**LAYOUT, "height": max(240, 90 + 44 * len(df)),
                         "legend": {"orientation": "h", "y": -0.12, "yanchor": "top"}})
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(range=[max(0.0, float((100 * df["agreement_lo"].astype(float)).min()) - 5), 101], row=1, col=1)
    return fig


def agreement_by_modality(rep: GpuReport) -> go.Figure:
    """The report's variants side by side, their agreement with BF16 on each modality's questions (colour =
    modality, as on the parity page), with 95% intervals; a modality judged worse is drawn as ✕."""
    from quantbench.analysis.parity import by_modality

    rows = [r for r in rep.rows if r.comparison is not None and not r.is_reference]
    frames = [by_modality(r.comparison).assign(variant=r.label) for r in rows]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    fig = go.Figure()
    for m in modality_sorted(df["modality"]) if len(df) else []:
        d = df[df["modality"] == m]
        y = 100 * d["agreement"].astype(float)
        fig.add_trace(go.Scatter(
            x=d["variant"], y=y, mode="markers", name=m, offsetgroup=m,
            marker={"size": 13, "color": modality_colour(m),
                    "symbol": ["x" if v == "worse" else "circle" for v in d["verdict"]],
                    "line": {"width": 1, "color": "#222222"}},
            error_y={"type": "data", "symmetric": False, "array": 100 * d["agreement_hi"].astype(float) - y,
                     "arrayminus": y - 100 * d["agreement_lo"].astype(float), "color": modality_colour(m)},
            customdata=d[["n", "verdict"]].to_numpy(),
            hovertemplate="%{x} · " + m + ": %{y:.1f}% of %{customdata[0]} questions, %{customdata[1]}<extra></extra>"))
    fig.update_layout(**LAYOUT, title="Agreement with BF16 per modality (95% CI; ✕ = worse beyond the margin)",
                      scattermode="group", legend_title_text="modality")
    low = float((100 * df["agreement_lo"].astype(float)).min()) if len(df) else 90.0
    fig.update_yaxes(title="agrees with BF16 (%)", range=[max(0.0, low - 3), 101.5])
    return fig
