"""The host side of a Qwen3-Omni media decision (prepare: decoding, the prompt, the media processor, the 3-D
positions) at the real media sizes, without the 30B model: the real shape's processor settings and token ids on a
small thinker (the processor does not depend on the model's size). For each decision of benchmarks/omni_shape.py
(a 448 x 448 picture, 10 s of audio, a 2 s video at 2 fps, each beside ~300 text tokens): transformers' processor
call (what prepare ran before, `MediaProcessor.through_transformers`) against quantbench's (`MediaProcessor.__call__`,
pixels on the host and, for pictures and frames, made by torch ops on --device), and prepare's phases; on a GPU,
the audio's mel features by transformers' torch STFT there against the host (time and largest difference): whether
moving them is worth it.

    python benchmarks/omni_prepare.py --reps 20                  # CPU
    python benchmarks/omni_prepare.py --reps 20 --device cuda    # a GPU: the pixels made there
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMALL = "omni-prepare-small"


def small_shape() -> str:
    """The real shape's vocabulary, token ids, rope and media settings with small dims, registered as a shape."""
    from quantbench.models.families.qwen3_omni import synthetic as SO

    dims = {"text": dict(SO.OMNI_TEXT, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, num_hidden_layers=1,
                         rope_parameters=dict(SO.OMNI_TEXT["rope_parameters"], mrope_section=[12, 10, 10])),
            "vision": dict(SO.OMNI_VISION, depth=1, hidden_size=64, intermediate_size=128, num_heads=4,
                           out_hidden_size=256, deepstack_visual_indexes=[0]),
            "audio": dict(SO.OMNI_AUDIO, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64,
                          output_dim=256, downsample_hidden_size=32),
            **{k: SO.OMNI_SHAPES["qwen3-omni-30b-a3b"][k] for k in ("position_id_per_seconds", "seconds_per_chunk",
                                                                     "user_token_id")}}
    SO.OMNI_SHAPES[SMALL] = dims
    return SMALL


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(engine, request, kind: str, device_pixels, args: argparse.Namespace) -> dict:
    """One decision's prepare: the processor call both ways, prepare with host / device pixels, its phases."""
    from benchmarks.omni_shape import PREPARE_PHASES
    from quantbench.models.families.qwen3_omni.engine import Phases
    from quantbench.models.families.qwen3_omni.media_batch import video_array
    from quantbench.protocol.media import DecodedAudio, DecodedImage, DecodedVideo
    from quantbench.protocol.media_cache import decode_media_once
    from quantbench.protocol.prompt import render_prompt, state_segments

    media = engine.media
    parts = decode_media_once(request.state, engine.limits)
    name = next(iter(request.questions))
    text = render_prompt(engine.tokenizer, request, name,
                         state_text="".join(t for t, _ in state_segments(request.state, engine.placeholders)))
    call = {"images": [p.image for p in parts if isinstance(p, DecodedImage)],
            "audio": [p.samples for p in parts if isinstance(p, DecodedAudio)],
            "videos": [video_array(p) for p in parts if isinstance(p, DecodedVideo)],
            "fps": [p.fps for p in parts if isinstance(p, DecodedVideo)]}

    def sync() -> None:
        if args.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()

    row = {"kind": kind, "tokens": len(engine.prepare(request).rows[0])}
    row["transformers_call_ms"] = median_ms(lambda: media.through_transformers(text, **call), args.reps)
    media.pixels = None
    row["quantbench_call_host_ms"] = median_ms(lambda: media(text, **call), args.reps)
    row["prepare_host_ms"] = median_ms(lambda: engine.prepare(request), args.reps)
    if kind != "audio":
        media.pixels = device_pixels
        row["quantbench_call_device_ms"] = median_ms(lambda: (media(text, **call), sync()), args.reps)
        row["prepare_device_ms"] = median_ms(lambda: (engine.prepare(request), sync()), args.reps)
    if kind == "audio" and args.device != "cpu":  # the mel features by transformers' torch STFT on the device
        fe = media.processor.feature_extractor
        kw = {"sampling_rate": fe.sampling_rate, "padding": True, "truncation": False, "return_attention_mask": True,
              "return_tensors": "pt"}
        row["features_host_ms"] = median_ms(lambda: fe(call["audio"], **kw), args.reps)
        row["features_device_ms"] = median_ms(lambda: fe(call["audio"], device=args.device, **kw), args.reps)
        host, dev = (fe(call["audio"], **kw)["input_features"],
                     fe(call["audio"], device=args.device, **kw)["input_features"])
        row["features_device_max_abs_diff"] = float((host - dev).abs().max())
    engine.phases = Phases(engine.device)
    for _ in range(args.reps):
        engine.prepare(request)
    calls, engine.phases = engine.phases.calls, None
    row["phases"] = {n: statistics.median(c.get(n, 0.0) for c in calls) for n in PREPARE_PHASES}
    media.pixels = None
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kinds", default="image,audio,video")
    args = parser.parse_args(argv)

    from backends.bf16 import Bf16Backend
    from benchmarks.omni_shape import PREPARE_PHASES, decisions
    from quantbench.models.families.qwen3_omni.pixels import DevicePixels
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    engine = Bf16Backend().load(RunSpec(backend="bf16", shape=small_shape(), layers=1, device=args.device),
                                detect()).engine
    media = engine.media
    media.pixels = None
    device_pixels = DevicePixels(media.processor.image_processor, args.device, media.video_size)
    requests = decisions(engine, False, 512, 300)
    rows = []
    for kind in args.kinds.split(","):
        rows.append(measure(engine, requests[kind], kind, device_pixels, args))
        print(rows[-1], flush=True)
    print("| decision | tokens | transformers' processor call ms | quantbench's call, host pixels ms | "
          f"quantbench's call, pixels on {args.device} ms | prepare, host pixels ms | prepare, pixels on "
          f"{args.device} ms | prepare phases ({', '.join(PREPARE_PHASES)}) ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        dev = (f"{r['quantbench_call_device_ms']:.2f}", f"{r['prepare_device_ms']:.2f}") if "prepare_device_ms" in r \
            else ("—", "—")
        print(f"| {r['kind']} | {r['tokens']} | {r['transformers_call_ms']:.2f} | {r['quantbench_call_host_ms']:.2f} | "
              f"{dev[0]} | {r['prepare_host_ms']:.2f} | {dev[1]} | "
              + " / ".join(f"{v:.2f}" for v in r["phases"].values()) + " |")
    return rows


if __name__ == "__main__":
    main()
