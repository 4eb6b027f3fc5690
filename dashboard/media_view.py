"""The parity page's media decisions where the variants disagree: the medium itself (the picture, the waveform
of a clip, a video's frames side by side) beside every variant's probability of each option.

The store keeps answers, not media: the record is found again in the suite the runs answered
(quantbench.analysis.decision_media: a file the user names, the run's own --suite, or a built-in suite), only when
its hash is the runs'. When it cannot be found the page says why and still shows the probabilities.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image

from dashboard import figures, store_cache, url_state
from quantbench.analysis import decision_media
from quantbench.analysis.recommend import GpuReport
from quantbench.errors import QuantbenchError
from quantbench.store.records import StoredRun

SHOWN_FRAMES = 8  # a longer video shows this many frames, evenly spaced, and says so
IMAGE_WIDTH = 256  # small suite pictures (64 px) are enlarged without smoothing, so their pixels stay sharp


def runs_of(rep: GpuReport) -> list[StoredRun]:
    """The reference, the noise floor (if any), then every compared variant of the report, each run once."""
    runs = [rep.reference] if rep.reference is not None else []
    if rep.floor is not None:
        runs.append(rep.floor.run)
    runs += [row.run for row in rep.rows if row.comparison is not None]
    seen: set[str] = set()
    out = []
    for run in runs:
        if run.run_id not in seen:
            seen.add(run.run_id)
            out.append(run)
    return out


def label_of(run: StoredRun, rep: GpuReport) -> str:
    row = next((r for r in rep.rows if r.run.run_id == run.run_id), None)
    if row is not None:
        return row.label
    return f"{run.variant} (noise floor, {run.kernel_path})" if run.role == "noise_floor" else str(run.variant)


def all_answers(db: str, mtime, rep: GpuReport) -> pd.DataFrame:
    """Every answer of every run of the report, one row per run and question, with the run's label and whether
    it is the reference."""
    frames = []
    for run in runs_of(rep):
        a = store_cache.answers(db, mtime, run.run_id)
        frames.append(a.assign(run_id=run.run_id, variant=label_of(run, rep),
                               is_reference=run.run_id == rep.reference.run_id, weight_format=str(run.weight_format)))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "modality" not in out:  # a store from before schema 7
        out["modality"] = "text"
    return out


def media_questions(answers: pd.DataFrame, reference_id: str) -> pd.DataFrame:
    """The reference's media questions, each with the variants whose top answer is not the reference's (`differ`,
    empty where every variant agrees)."""
    ref = answers[(answers["run_id"] == reference_id) & (answers["modality"] != "text")]
    ref = ref[["record_id", "question", "benchmark", "modality", "gold", "top"]].rename(columns={"top": "BF16"})
    others = answers[answers["run_id"] != reference_id][["record_id", "question", "top", "variant"]]
    merged = others.merge(ref, on=["record_id", "question"])
    differ = (merged[merged["top"] != merged["BF16"]].groupby(["record_id", "question"])["variant"]
              .agg(lambda v: ", ".join(dict.fromkeys(v))).rename("differ"))
    table = ref.merge(differ, left_on=["record_id", "question"], right_index=True, how="left")
    return table.assign(differ=table["differ"].fillna("")).sort_values(["record_id", "question"],
                                                                      ignore_index=True)


def audio_summary(samples, rate: int) -> str:
    """What the waveform at this scale hides: the strongest frequency (a high and a low tone look alike over a
    second) and the level."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < 2 or not np.any(x):
        return "silence"
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    spectrum[0] = 0.0
    peak_hz = float(np.argmax(spectrum)) * rate / len(x)
    return (f"strongest frequency {peak_hz:,.0f} Hz · peak {np.max(np.abs(x)):.2f} · "
            f"RMS {np.sqrt(np.mean(x ** 2)):.3f} (full scale 1)")


def show_medium(medium) -> None:
    kind = type(medium).__name__
    if kind == "DecodedImage":
        image = medium.image
        scale = max(1, IMAGE_WIDTH // max(image.width, 1))
        big = image.resize((image.width * scale, image.height * scale), Image.NEAREST) if scale > 1 else image
        st.image(big, caption=f"{medium.field}: image {image.width}×{image.height}")
    elif kind == "DecodedAudio":
        st.plotly_chart(figures.waveform(medium.samples, medium.sampling_rate,
                                         f"{medium.field}: audio, {medium.seconds:.2f} s"), width="stretch")
        st.audio(medium.samples, sample_rate=medium.sampling_rate)
        st.caption(audio_summary(medium.samples, medium.sampling_rate))
    elif kind == "DecodedVideo":
        n = len(medium.frames)
        picks = list(range(n)) if n <= SHOWN_FRAMES else [round(i * (n - 1) / (SHOWN_FRAMES - 1))
                                                          for i in range(SHOWN_FRAMES)]
        st.caption(f"{medium.field}: video, {n} frames at {medium.fps:g} fps ({medium.seconds:.2f} s)"
                   + (f"; {len(picks)} of them, evenly spaced" if len(picks) < n else ""))
        for col, i in zip(st.columns(len(picks)), picks, strict=True):
            frame = Image.fromarray(medium.frames[i])
            scale = max(1, (IMAGE_WIDTH // 2) // max(frame.width, 1))
            col.image(frame.resize((frame.width * scale, frame.height * scale), Image.NEAREST),
                      caption=f"frame {i + 1} · {i / medium.fps:.2f} s")


def suite_input(run: dict) -> str:
    """The suite file the user points at (kept in the link as `suite=`), empty for none."""
    url_state.start("suite", "")
    st.text_input("Suite file", key="suite", placeholder="path/to/suite.jsonl (the media files beside it)",
                  help="the JSONL file the runs answered: the store keeps answers, not media. Not needed when the "
                       "runs' own --suite path exists here, or for a built-in suite")
    return url_state.publish("suite", default="").strip()


def section(db: str, mtime, rep: GpuReport, modality: str) -> None:
    """The viewer, for the report's runs, on the media decisions of `modality` ("all": every one)."""
    st.subheader("Media decisions where the variants disagree")
    if rep.reference is None:
        return
    answers = all_answers(db, mtime, rep)
    if modality == "text":
        st.info("Text decisions carry no media: choose another modality (or all) to see media decisions.", icon="ℹ️")
        return
    table = media_questions(answers, rep.reference.run_id)
    kind = "media" if modality == "all" else modality
    if modality != "all":
        table = table[table["modality"] == modality]
    if table.empty:
        st.info(f"These runs answered no {kind} questions.", icon="ℹ️")
        return
    n_differ, total = int((table["differ"] != "").sum()), len(table)
    every = st.toggle("Every media question, not only those where the variants disagree", key="every_media",
                      help="off: the questions on which some variant's top answer is not BF16's")
    if n_differ == 0:
        st.success(f"Every variant gives BF16's top answer on all {len(table)} {kind} questions.", icon="✅")
        if not every:
            return
    if not every:
        table = table[table["differ"] != ""]
    st.caption(f"{n_differ} of {total} {kind} questions where at least one variant's top answer differs from BF16's"
               + ("; all of them listed." if every else "."))
    labels = [f"{r.record_id} · {r.question} · {r.modality} — " + (f"differs: {r.differ}" if r.differ else "all agree")
              for r in table.itertuples()]
    url_state.start("decision", labels[0])
    wanted = st.session_state["decision"]
    if wanted not in labels:  # a link may name only the record
        st.session_state["decision"] = next((lab for lab in labels if lab.startswith(f"{wanted} ·")), labels[0])
    choice = st.selectbox("Decision", labels, key="decision")
    url_state.publish("decision", lambda v: v.split(" · ", 1)[0])
    pick = table.iloc[labels.index(choice)]
    left, right = st.columns([1, 1])
    with left:
        lookup = store_cache.suite_lookup(rep.reference, (suite_input(rep.reference),))
        if lookup.suite is None:
            st.warning(f"Media unavailable. {lookup.problem}", icon="🖼️")
        else:
            try:
                media = store_cache.record_media(lookup, lookup.suite.hash, str(pick["record_id"]),
                                                 decision_media.run_limits(rep.reference))
            except QuantbenchError as e:  # a record not in the suite, a part that does not decode
                st.warning(f"Media unavailable: {e}", icon="🖼️")
                media = []
            st.caption(f"From {lookup.source}.")
            for medium in media:
                show_medium(medium)
    with right:
        one = answers[(answers["record_id"] == pick["record_id"]) & (answers["question"] == pick["question"])]
        gold = pick["gold"] if isinstance(pick["gold"], str) else None
        st.plotly_chart(figures.option_probs(one, gold), width="stretch")
        st.caption(f"{pick['benchmark']}: question “{pick['question']}”; BF16 answers {pick['BF16']}"
                   + (f", gold {gold}" if gold else "")
                   + (f"; differs: {pick['differ']}." if pick["differ"] else "; every variant agrees."))
