"""`serve`'s warm-up: before /healthz says ok, the forward passes whose first run costs what no client should wait
for (first-call costs, and on a GPU the CUDA graph of every batch size at every width the operator expects).

On the H200 the captures a client's request met were the tails: the text decoder's at 8 clients (p99 1,560 ms
against a p50 of 89), then, for the Qwen3-Omni thinker under a load of text and picture decisions, the media
decoder's buckets (p99 3,150 ms against 136, 2026-12-03). So the warm-up runs the text demo request and, for a
model that reads pictures, the same request with a picture, at each batch size and each width."""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
import time
from typing import Any

from quantbench.protocol import parse_request
from quantbench.run.backend import LoadedVariant
from quantbench.server.endpoint import ServerState
from quantbench.server.schema import DEMO_REQUEST

log = logging.getLogger("quantbench.server")

DEMO_PICTURE_SIDE = 448  # the size benchmarks/omni_shape.py and benchmarks/mixed_suite.py time


def warm_sizes(max_batch: int, cuda: bool) -> list[int]:
    """The batches the warm-up runs: on a GPU 1, 2, 4 … max_batch (a CUDA graph bucket each); on a CPU one pass
    (no graphs to capture; at the 30B shape a CPU pass takes tens of seconds)."""
    if not cuda:
        return [1]
    return sorted({min(1 << i, max_batch) for i in range(max_batch.bit_length() + 1)})


def warm_prepared(prepared: Any, widths: tuple[int, ...], pad_id: int) -> list[Any]:
    """The demo request as prepared, and again with its rows padded to each of `widths` tokens (wider than it):
    the warm-up's shapes. A padded copy is only a shape to capture: its answers are never read. (A media row's
    3-D positions no longer match its padded length: the engine makes them again for the padded row.)"""
    longest = max(len(r) for r in prepared.rows)
    return [prepared] + [dataclasses.replace(prepared, rows=[r + [pad_id] * (w - len(r)) for r in prepared.rows])
                         for w in sorted(set(widths)) if w > longest]


def block_picture(side: int, seed: int = 0) -> str:
    """A `side` x `side` PNG of 16-pixel blocks (seeded), as a data URI (also benchmarks/mixed_suite.py's pictures)."""
    import numpy as np
    from PIL import Image

    blocks = (np.random.RandomState(seed).rand(side // 16, side // 16, 3) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(blocks).resize((side, side), Image.NEAREST).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def demo_picture_request(side: int = DEMO_PICTURE_SIDE) -> dict[str, Any]:
    """The demo request with a `side` x `side` block picture (seed 0) in its state."""
    picture = {"type": "image", "data": block_picture(side)}
    return {**DEMO_REQUEST, "state": {**DEMO_REQUEST["state"], "camera": picture}}


def warm_shapes(engine: Any, warm_tokens: tuple[int, ...], cuda: bool) -> list[Any]:
    """The prepared requests the warm-up runs. On a CPU the text demo alone. On a GPU the text demo at its own
    width and padded to each of `warm_tokens`; for a model that reads pictures also the picture demo at its own
    width and padded to each `warm_tokens` width plus the picture's tokens (a text of that length with a picture:
    the media decoder's buckets)."""
    text = engine.prepare(parse_request(DEMO_REQUEST))
    if not cuda:
        return [text]
    pad_id = getattr(engine, "pad_id", 0)
    shapes = warm_prepared(text, warm_tokens, pad_id)
    if "image" in getattr(engine, "modalities", ()):
        picture = engine.prepare(parse_request(demo_picture_request()))
        extra = max(len(r) for r in picture.rows) - max(len(r) for r in text.rows)  # the picture's own tokens
        shapes += warm_prepared(picture, tuple(w + extra for w in warm_tokens), pad_id)
    return shapes


def warm_up(loaded: LoadedVariant, state: ServerState, max_batch: int, warm_tokens: tuple[int, ...]) -> int:
    """On the loading thread: each of `warm_shapes` at each of `warm_sizes`, untimed and uncounted. Returns the
    forward passes run. A failure is logged and reported in /healthz (warm_error); serving goes on."""
    engine = loaded.engine
    cuda = str(getattr(engine, "device", "cpu")).startswith("cuda")
    t0, done = time.perf_counter(), 0
    try:
        warm = getattr(engine, "warm", None)  # an engine without CUDA graphs may not have it
        for one in warm_shapes(engine, warm_tokens, cuda):
            for n in warm_sizes(max_batch, cuda):
                batch = [one] * n
                if warm is not None:
                    warm(batch)
                engine.forward_many(batch)
                done += 1
        engine.synchronize()
    except Exception as e:  # noqa: BLE001 - a warm-up that fails leaves a server that may still answer
        state.warm_error = f"{type(e).__name__}: {e}"
        log.warning("the warm-up forward passes failed (serving anyway): %s", state.warm_error)
    state.warm_s = time.perf_counter() - t0
    return done
