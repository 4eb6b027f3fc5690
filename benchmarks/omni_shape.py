"""The Qwen3-Omni-30B-A3B thinker at its real shape (random weights, `--shape qwen3-omni-30b-a3b`): per decision,
batch 1, per variant (bf16, int4, nvfp4 packed, fp8), a 512-token text decision and one with a 448 x 448 image, 10 s
of audio and a 2 s, 2 fps video (each beside ~300 text tokens), the time of prepare (decoding, the prompt, the
media processor, the 3-D positions), the towers and the decoder, medians over --reps, and every phase of prepare
and forward on its own (the device synchronized at each: checks, decode, prompt, processor, positions; ids,
upload, towers, merge, decoder, head) beside the figures the H200 measured before (commit 9c4bfeb); with the
pixels made on the GPU, the image and video decisions again with them made on the host (--host-pixels); the
towers of transformers itself (`get_image_features` ...) beside quantbench's (quantbench.models.families.qwen3_omni.towers), with the
ratio; the INT4 image decision end to end (prepare + forward); the thinker's weights in memory against the whole
model's (thinker + talker + code2wav) BF16 weights, counted from its config on the meta device.

Each variant is built as `quantbench run --shape` builds it (backends/*.py: int4 / nvfp4 / fp8 quantized layer by
layer, so the peak is the variant plus one layer of BF16 experts), measured, and freed before the next. One row
per variant goes into --db through quantbench's store (a run with weights `synthetic`, suite
`omni-shape-bench`; the figures in `extra.omni_shape`, one latency row per timed forward), so `quantbench merge`
brings them home. It prints what it does as it goes, and the tables at the end.

    python benchmarks/omni_shape.py --db omni.duckdb                      # the H200: 48 layers, --reps 20
    python benchmarks/omni_shape.py --layers 2 --reps 3 --device cpu      # CPU, real media sizes (slow)
    python benchmarks/omni_shape.py --layers 4 --tiny-media --reps 2 --device cpu   # what the tests run
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from quantbench.run.child import Timer  # noqa: E402  (after the checkout is on the path)

VARIANTS = {  # name -> (backend, its options)
    "bf16": ("bf16", {}),
    "int4": ("int4", {}),
    "nvfp4-packed": ("nvfp4", {"nvfp4_mode": "packed"}),
    "fp8": ("fp8", {}),
}
KINDS = ("text", "image", "audio", "video")
WORDS = ("door wall corridor light player left right ahead enemy item key chest open closed north south east west "
         "stairs window table lamp guard river bridge tower gate").split()
QUESTION = {"action": {"type": "choice", "criteria": {"open": "Open the door", "wait": "Wait", "left": "Turn left",
                                                     "right": "Turn right"}}}


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# -- the decisions ------------------------------------------------------------------------------------------------
def _uri(mime: str, raw: bytes) -> str:
    import base64

    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def _png(size: int, seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    pixels = (rng.rand(size // 16, size // 16, 3) * 255).astype(np.uint8)  # 16 px blocks: PNG stays small
    buf = io.BytesIO()
    Image.fromarray(pixels).resize((size, size), Image.NEAREST).save(buf, "PNG")
    return buf.getvalue()


def _wav(seconds: float) -> bytes:
    import numpy as np
    import soundfile

    t = np.arange(int(16000 * seconds)) / 16000
    samples = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.RandomState(0).randn(len(t))).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, samples, 16000, format="WAV")
    return buf.getvalue()


def media_parts(tiny: bool) -> dict[str, dict[str, Any]]:
    """The media of each decision: a 448 x 448 picture, 10 s of audio, 2 s of video at 2 fps (tiny: 64 x 64, 1 s,
    4 frames of 64 x 64)."""
    side, seconds = (64, 1.0) if tiny else (448, 10.0)
    return {"image": {"type": "image", "data": _uri("image/png", _png(side, 1))},
            "audio": {"type": "audio", "data": _uri("audio/wav", _wav(seconds))},
            "video": {"type": "video", "frames": [_uri("image/png", _png(side, 10 + i)) for i in range(4)], "fps": 2}}


def _request(words: int, part: dict[str, Any] | None):
    from quantbench.protocol import parse_request

    text = " ".join(WORDS[(i * 7 + i // len(WORDS)) % len(WORDS)] for i in range(words))
    state: dict[str, Any] = {"observation": text}
    if part is not None:
        state["sensor"] = part
    return parse_request({"state": state, "questions": QUESTION})


def _words_for(engine: Any, tokens: int) -> int:
    """The number of words whose text-only decision is `tokens` tokens long (bisection on the prompt)."""
    lo, hi = 1, tokens * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if len(engine.prepare(_request(mid, None)).rows[0]) < tokens:
            lo = mid + 1
        else:
            hi = mid
    return lo


def decisions(engine: Any, tiny: bool, text_tokens: int, media_text_tokens: int) -> dict[str, Any]:
    parts = media_parts(tiny)
    text_words, media_words = _words_for(engine, text_tokens), _words_for(engine, media_text_tokens)
    return {"text": _request(text_words, None), **{k: _request(media_words, parts[k]) for k in parts}}


# -- timing -------------------------------------------------------------------------------------------------------
class Clock(Timer):
    """Milliseconds of a call, as `quantbench run` times a forward (run.child.Timer: CUDA events on a GPU, the
    device's time; perf_counter on the CPU), and a synchronize between phases."""

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


PREPARE_PHASES = ("checks", "decode", "prompt", "processor", "positions")
FORWARD_PHASES = ("ids", "upload", "towers", "merge", "decoder", "head")
# What the H200 measured before the media path was reworked (docs/BENCHMARKS.md, commit 9c4bfeb, 2026-12-02):
# printed beside this run's figures. ms, medians of 20.
BEFORE = {("int4", "image"): {"processor_ms": 11.3, "towers_ms": 7.28, "decoder_ms": 15.20, "forward_ms": 23.51,
                              "end_to_end_ms": 44.5},
          ("int4", "audio"): {"processor_ms": 6.3, "towers_ms": 3.92, "decoder_ms": 11.65, "forward_ms": 16.63,
                              "end_to_end_ms": 21.1},
          ("int4", "video"): {"processor_ms": 4.7, "towers_ms": 11.15, "decoder_ms": 19.05, "forward_ms": 31.41,
                              "end_to_end_ms": 45.9},
          ("int4", "text"): {"processor_ms": 0.8, "towers_ms": 0.0, "decoder_ms": 11.97, "forward_ms": 11.97}}


def phase_medians(calls: list[dict[str, float]], names: tuple[str, ...]) -> dict[str, float]:
    return {n: median([c.get(n, 0.0) for c in calls]) for n in names if any(n in c for c in calls)}


def measure_kind(engine: Any, request: Any, clock: Clock, reps: int, end_to_end: bool) -> dict[str, Any]:
    """One decision kind on one variant: prepare, forward and end-to-end medians over `reps` (unsynchronized, as
    a run times them), then the same decision again phase by phase (quantbench.models.families.qwen3_omni.engine.Phases: the device
    synchronized at each mark), and the media parts' decoding without the process's decode cache."""
    from quantbench.models.families.qwen3_omni.engine import Phases
    from quantbench.protocol.media import decode_media

    prepared = engine.prepare(request)  # the first: decodes the media (once per process)
    prep = []
    for _ in range(reps):
        t0 = time.perf_counter()
        prepared = engine.prepare(request)
        prep.append((time.perf_counter() - t0) * 1e3)
    engine.warm([prepared])
    for _ in range(2):  # warm: kernels chosen, graphs replayed once
        engine.forward(prepared)
    forward = [clock(engine.forward, prepared)[1] for _ in range(reps)]
    out: dict[str, Any] = {"tokens": len(prepared.rows[0]), "processor_ms": median(prep),
                           "forward_ms": median(forward), "forward_all_ms": forward}
    if end_to_end:
        e2e = []
        for _ in range(reps):
            t0 = time.perf_counter()
            engine.forward(engine.prepare(request))
            clock.sync()
            e2e.append((time.perf_counter() - t0) * 1e3)
        out["end_to_end_ms"] = median(e2e)
    engine.phases = Phases(engine.device)
    try:
        for _ in range(reps):
            engine.forward(engine.prepare(request))
        calls = engine.phases.calls
    finally:
        engine.phases = None
    out["prepare_phases"] = phase_medians(calls[0::2], PREPARE_PHASES)
    out["forward_phases"] = phase_medians(calls[1::2], FORWARD_PHASES)
    fp = out["forward_phases"]
    out["towers_ms"] = fp.get("towers", 0.0)
    out["decoder_ms"] = fp["merge"] + fp["decoder"] if "decoder" in fp else out["forward_ms"]
    if request.media_parts():
        decode = []
        for _ in range(reps):
            t0 = time.perf_counter()
            decode_media(request.state, engine.limits)
            decode.append((time.perf_counter() - t0) * 1e3)
        out["decode_uncached_ms"] = median(decode)
    return out


def measure_towers(engine: Any, requests: dict[str, Any], clock: Clock, reps: int) -> dict[str, dict[str, float]]:
    """Each tower on each medium: transformers' own (the thinker's get_*_features) and quantbench's, medians."""
    import torch

    from quantbench.models.families.qwen3_omni.media_batch import audio_frames, join_media

    model, out = engine.model, {}
    for kind in ("image", "audio", "video"):
        inputs = join_media([engine.prepare(requests[kind]).media[0]], engine.device, model.dtype)
        if kind == "audio":
            frames, lens = audio_frames(inputs)
            lens = lens.cpu()  # as the engine's forward hands them: the lengths on the host, no sync
            theirs = lambda i=inputs: model.get_audio_features(  # noqa: E731
                i["input_features"], i["feature_attention_mask"], return_dict=True)
            ours = lambda f=frames, n=lens: engine.towers.audio(f, n)  # noqa: E731
            engine.towers.warm_audio(frames, lens)
        else:
            px, grid = ("pixel_values", "image_grid_thw") if kind == "image" else ("pixel_values_videos", "video_grid_thw")
            get = model.get_image_features if kind == "image" else model.get_video_features
            theirs = lambda g=get, p=inputs[px], t=inputs[grid]: g(p, t, return_dict=True)  # noqa: E731
            host_grid = inputs[grid].cpu()  # as the engine's forward hands it: on the host, no sync
            ours = lambda p=inputs[px], t=host_grid: engine.towers.vision(p, t)  # noqa: E731
            engine.towers.warm_vision(inputs[px], host_grid)
        times = {}
        with torch.inference_mode():
            for name, fn in (("transformers_ms", theirs), ("quantbench_ms", ours)):
                for _ in range(2):
                    fn()
                times[name] = median([clock(fn)[1] for _ in range(reps)])
        times["speedup"] = times["transformers_ms"] / times["quantbench_ms"]
        out[kind] = times
        say(f"  {kind} tower: transformers {times['transformers_ms']:.2f} ms, quantbench "
            f"{times['quantbench_ms']:.2f} ms ({times['speedup']:.2f}x)")
    return out


# Thinker + talker + code2wav of Qwen3-Omni-30B-A3B: the published total, which the real encoder sizes reproduce
# (transformers 5.17 on the H200, 2026-12-02: ../shared/reference/qwen3-omni.md §7). transformers' talker config
# defaults do not build here (5.24: no shared_expert_intermediate_size), so the total is not recounted.
WHOLE_MODEL_PARAMETERS = 35_259_818_545


def whole_model_bf16_bytes(shape: str) -> int:
    """BF16 bytes of thinker + talker + code2wav: the thinker counted from its config on the meta device (48
    layers), the talker and code2wav as the published total's remainder."""
    import torch

    from quantbench.models.families.qwen3_omni.synthetic import meta_thinker, thinker_config

    thinker = sum(p.numel() for p in meta_thinker(thinker_config(shape, None, 0, 1), torch.bfloat16).parameters())
    rest = WHOLE_MODEL_PARAMETERS - 31_719_205_488 if shape == "qwen3-omni-30b-a3b" else 0
    return (thinker + rest) * 2


# -- one variant --------------------------------------------------------------------------------------------------
def run_variant(name: str, args: argparse.Namespace, machine: Any, clock: Clock, tower_figures: dict) -> dict:
    import torch

    from quantbench.models.checkpoint import tensor_bytes
    from quantbench.run.backend import get_backend
    from quantbench.run.kernel import kernel_ran, planned_kernel
    from quantbench.run.spec import RunSpec

    backend, options = VARIANTS[name]
    spec = RunSpec(backend=backend, shape=args.shape, layers=args.layers, seed=0, device=args.device, **options)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    say(f"{name}: building the {args.layers or 48}-layer thinker ({backend} backend, layer by layer) …")
    t0 = time.perf_counter()
    loaded = get_backend(backend).load(spec, machine)
    load_s = time.perf_counter() - t0
    engine = loaded.engine
    planned = planned_kernel(loaded)
    weights = (torch.cuda.memory_allocated() - before) if cuda else None
    figures: dict[str, Any] = {"load_s": load_s, "thinker_tensor_bytes": tensor_bytes(loaded.model),
                               "thinker_weights_bytes": weights, "kernel_path": loaded.info.kernel_path, "kinds": {}}
    say(f"{name}: built in {load_s:.1f} s; {figures['thinker_tensor_bytes'] / 2**30:.2f} GiB of tensors"
        + (f", {weights / 2**30:.2f} GiB allocated on the GPU" if weights is not None else ""))
    requests = decisions(engine, args.tiny_media, args.text_tokens, args.media_text_tokens)
    media = getattr(engine, "media", None)
    for kind in args.kinds:
        say(f"{name}: {kind} decision, {args.reps} reps …")
        got = measure_kind(engine, requests[kind], clock, args.reps, end_to_end=(kind != "text"))
        figures["kinds"][kind] = got
        say(f"{name}: {kind}: {got['tokens']} tokens; processor {got['processor_ms']:.1f} ms, towers "
            f"{got['towers_ms']:.2f} ms, decoder {got['decoder_ms']:.2f} ms, forward {got['forward_ms']:.2f} ms"
            + (f", end to end {got['end_to_end_ms']:.1f} ms" if "end_to_end_ms" in got else ""))
        if args.host_pixels and kind in ("image", "video") and media is not None and media.pixels is not None:
            pixels, media.pixels = media.pixels, None  # the same decision with the pixels made on the host
            try:
                host = measure_kind(engine, requests[kind], clock, args.reps, end_to_end=True)
            finally:
                media.pixels = pixels
            figures["kinds"][f"{kind} (host pixels)"] = host
            say(f"{name}: {kind}, pixels on the host: processor {host['processor_ms']:.1f} ms, forward "
                f"{host['forward_ms']:.2f} ms, end to end {host['end_to_end_ms']:.1f} ms")
    if not tower_figures and any(k != "text" for k in args.kinds):  # the towers are BF16 in every variant
        say(f"{name}: the towers alone, transformers' against quantbench's …")
        tower_figures.update(measure_towers(engine, requests, clock, args.reps))
    if cuda:
        figures["peak_allocated_bytes"] = torch.cuda.max_memory_allocated() - before
    report = engine.report()
    figures["ran"] = {"media": report.media, "text_graphs": report.graphs}
    # what the forwards ran (as `run` records it), not the label the backend planned at load (which named the
    # Triton kernel where the Gluon one ran: 2026-12-03's rows)
    kernel, _ = kernel_ran(loaded, planned, args.device)
    figures["kernel_path"] = str(kernel)
    say(f"{name}: kernels ran: {figures['kernel_path']}")
    say(f"{name}: what ran: towers {report.media.get('towers')}, tower graphs {report.media.get('tower_graphs')}"
        + (f" ({'; '.join(report.media['tower_notes'])})" if report.media.get("tower_notes") else "")
        + (f", media decoder graphs {report.media['decoder_graphs']}" if "decoder_graphs" in report.media else ""))
    figures["info"] = loaded.info
    del loaded, engine
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return figures


def store_variant(db: Path, name: str, figures: dict, towers: dict, whole: int, args: argparse.Namespace,
                  machine: Any) -> str:
    """One run row (and a latency row per timed forward) through quantbench's store."""
    from quantbench.run.record import (
        LatencyRow,
        MachineFacts,
        Measured,
        Provenance,
        RunIdentity,
        RunRecord,
        RunResult,
        SuiteFacts,
        uuid7,
    )
    from quantbench.run.runner import provenance
    from quantbench.store import Store

    info = figures.pop("info")
    now = dt.datetime.now(dt.UTC)
    kinds = figures["kinds"]
    extra = {"omni_shape": {**{k: v for k, v in figures.items() if k != "kinds"},
                            "kinds": {k: {f: v for f, v in d.items() if f != "forward_all_ms"} for k, d in kinds.items()},
                            "towers": towers, "whole_model_bf16_bytes": whole, "reps": args.reps,
                            "tiny_media": args.tiny_media, "command": " ".join(sys.argv)},
             "load_note": "random weights at the real shape (benchmarks/omni_shape.py): speed and memory only"}
    measured = Measured(device=args.device, variant=info, load_s=figures["load_s"],
                        model_tensor_bytes=figures["thinker_tensor_bytes"], kernel_path=figures["kernel_path"],
                        suite=SuiteFacts(suite_id="omni-shape-bench", suite_hash="omni-shape-bench:v1",
                                         n_records=len(kinds), n_questions=len(kinds)), extra=extra)
    identity = RunIdentity(run_id=str(uuid7()), status="ok", created_at=now, finished_at=now, backend=VARIANTS[name][0],
                           spec={"benchmark": "benchmarks/omni_shape.py", "shape": args.shape, "layers": args.layers,
                                 "variant": name})
    record = RunRecord.compose(identity, MachineFacts(**machine.as_row()), Provenance(**provenance()), measured)
    if figures.get("thinker_weights_bytes") is not None:
        record.mem_weights_bytes = figures["thinker_weights_bytes"]
        record.mem_peak_allocated_bytes = figures.get("peak_allocated_bytes")
    latencies, seq = [], 0
    for kind, got in kinds.items():
        for ms in got["forward_all_ms"]:
            latencies.append(LatencyRow(seq=seq, phase="latency", record_id=f"omni-shape:{kind}", model_ms=ms,
                                        prep_ms=got["processor_ms"], tokens=got["tokens"], batch=1))
            seq += 1
    return Store(db).write_run(RunResult(run=record, latencies=latencies))


# -- the tables ---------------------------------------------------------------------------------------------------
def tables(results: dict[str, dict], towers: dict, whole: int, before: dict | None = None) -> str:
    """The tables; `before`: the figures measured before at the same settings (BEFORE), shown beside."""
    before = before or {}
    lines = ["| variant | decision | tokens | prepare ms | towers ms | decoder ms | forward ms | end to end ms | "
             "before (9c4bfeb): prepare / towers / decoder / forward / end to end |", "|---|---|---|---|---|---|---|---|---|"]
    for name, fig in results.items():
        for kind, got in fig["kinds"].items():
            e2e = f"{got['end_to_end_ms']:.1f}" if "end_to_end_ms" in got else "—"
            old = before.get((name, kind))
            was = " / ".join(f"{old[k]:g}" for k in ("processor_ms", "towers_ms", "decoder_ms", "forward_ms",
                                                       "end_to_end_ms") if k in old) if old else "—"
            lines.append(f"| {name} | {kind} | {got['tokens']} | {got['processor_ms']:.1f} | {got['towers_ms']:.2f} | "
                         f"{got['decoder_ms']:.2f} | {got['forward_ms']:.2f} | {e2e} | {was} |")
    lines += ["", "Phases, ms (medians; the device synchronized at each phase's end, so they may sum to more than the "
              "unsynchronized figures above):", "",
              "| variant | decision | " + " | ".join(PREPARE_PHASES) + " | decode (uncached) | "
              + " | ".join(FORWARD_PHASES) + " |", "|---|---|" + "---|" * (len(PREPARE_PHASES) + 1 + len(FORWARD_PHASES))]
    for name, fig in results.items():
        for kind, got in fig["kinds"].items():
            pp, fp = got.get("prepare_phases", {}), got.get("forward_phases", {})
            cells = [f"{pp[n]:.2f}" if n in pp else "—" for n in PREPARE_PHASES]
            cells.append(f"{got['decode_uncached_ms']:.2f}" if "decode_uncached_ms" in got else "—")
            cells += [f"{fp[n]:.2f}" if n in fp else "—" for n in FORWARD_PHASES]
            lines.append(f"| {name} | {kind} | " + " | ".join(cells) + " |")
    if towers:
        lines += ["", "| tower, medium | transformers ms | quantbench ms | speed-up |", "|---|---|---|---|"]
        for kind, t in towers.items():
            tower = "audio" if kind == "audio" else "vision"
            lines.append(f"| {tower}, {kind} | {t['transformers_ms']:.2f} | {t['quantbench_ms']:.2f} | "
                         f"{t['speedup']:.2f}x |")
    lines += ["", "| variant | thinker weights GiB (tensors) | GPU allocated by the load GiB | "
              "whole model BF16 GiB | thinker / whole |", "|---|---|---|---|---|"]
    for name, fig in results.items():
        gpu = fig.get("thinker_weights_bytes")
        lines.append(f"| {name} | {fig['thinker_tensor_bytes'] / 2**30:.2f} | "
                     f"{gpu / 2**30 if gpu is not None else float('nan'):.2f} | {whole / 2**30:.2f} | "
                     f"{fig['thinker_tensor_bytes'] / whole:.1%} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-omni-30b-a3b")
    parser.add_argument("--layers", type=int, default=None, help="text decoder layers (default: the real 48)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per figure (medians)")
    parser.add_argument("--device", default=None, help="cuda (default when there is a GPU) or cpu")
    parser.add_argument("--tiny-media", action="store_true", help="64 x 64 pictures, 1 s of audio (tests)")
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--media-text-tokens", type=int, default=300)
    parser.add_argument("--db", type=Path, default=Path("results.duckdb"))
    parser.add_argument("--host-pixels", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the image and video decisions with the pixels made on the host (the "
                             "processor a run used before), when they are made on the device")
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.kinds = [k for k in args.kinds.split(",") if k]
    for v in args.variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    for k in args.kinds:
        if k not in KINDS:
            parser.error(f"--kinds: {k!r} is not one of {', '.join(KINDS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    import torch

    from quantbench.run.machine import detect

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    machine = detect(with_torch=True)
    clock = Clock(args.device)
    say(f"omni shape benchmark: {args.shape}, {args.layers or 48} decoder layers, {', '.join(args.variants)} on "
        f"{machine.gpu_name or 'CPU'} ({args.device}); torch {torch.__version__}, {args.reps} reps")
    whole = whole_model_bf16_bytes(args.shape)
    what = "thinker + talker + code2wav" if args.shape == "qwen3-omni-30b-a3b" else "its thinker only: not the real shape"
    say(f"whole model ({what}, 48 layers) BF16: {whole / 2 / 1e9:.2f} B parameters, {whole / 2**30:.2f} GiB")
    results: dict[str, dict] = {}
    towers: dict[str, dict] = {}
    for name in args.variants:
        results[name] = run_variant(name, args, machine, clock, towers)
        run_id = store_variant(args.db, name, results[name], towers, whole, args, machine)
        say(f"{name}: stored as run {run_id} in {args.db}")
    same = args.shape == "qwen3-omni-30b-a3b" and args.layers is None and not args.tiny_media
    print(tables(results, towers, whole, BEFORE if same else None), flush=True)
    return {"results": results, "towers": towers, "whole_model_bf16_bytes": whole}


if __name__ == "__main__":
    main()
