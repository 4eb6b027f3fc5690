"""A media request's context length from its parts' headers, before any part is decoded.

quantbench.protocol.media_cache reads every part's header before decoding anything and hands the headers to the
engine's check: here, for OmniEngine. Each part's tokens are counted as the checkpoint's processor will count them
(quantbench.models.families.qwen3_omni.processor.MediaProcessor.header_tokens: transformers' own patch count for a picture or frame, the
audio encoder's output length for a clip), so a request whose media alone are over the model's context is refused
having decoded nothing: a 30 KB mp4 of 256 frames was decoded to 7.35 GB before its refusal came (issue #33).
"""

from __future__ import annotations

from typing import Any

from quantbench.errors import ContextLengthError, RequestError
from quantbench.protocol import DecisionRequest
from quantbench.protocol.media import AUDIO_SAMPLING_RATE, MediaHeader
from quantbench.protocol.prompt import render_state

# The shortest clip the audio encoder answers: the omni default model's answers were NaN for clips of up to 1,401
# samples at 16 kHz (8 feature frames) and fine from 1,451 on (three signals, 201 to 6,000 samples, CPU,
# 2026-12-04); below 201 samples the feature extractor's padding fails outright. A tenth of a second (10 frames,
# the encoder's 2 tokens) is what is asked for.
MIN_AUDIO_SAMPLES = AUDIO_SAMPLING_RATE // 10


def check_media_headers(engine: Any, request: DecisionRequest, headers: list[MediaHeader]) -> None:
    """RequestError naming a part the processor cannot take (an aspect ratio over 200, a clip under a tenth of a
    second: MIN_AUDIO_SAMPLES); unless truncation may drop
    parts, ContextLengthError when the state's text with its parts' tokens is over the context already (a lower
    bound of every question's prompt: the question and options add to it), naming the part with the most tokens.
    `engine`: an OmniEngine (its `media` processor, placeholders, tokenizer, max_tokens and truncate)."""
    if engine.media is None or not headers:
        return
    total, largest = 0, ("state", -1)
    for h in headers:
        samples = h.samples if h.rate in (0, AUDIO_SAMPLING_RATE) else -(-h.samples * AUDIO_SAMPLING_RATE // h.rate)
        if h.kind == "audio" and samples < MIN_AUDIO_SAMPLES:
            raise RequestError(h.source, f"the clip is {1000 * samples / AUDIO_SAMPLING_RATE:.1f} ms long, shorter "
                               f"than the {1000 * MIN_AUDIO_SAMPLES // AUDIO_SAMPLING_RATE} ms the model's audio "
                               "encoder answers (its answers to shorter clips are not numbers)",
                               "send at least a tenth of a second of audio")
        try:
            tokens = engine.media.header_tokens(h.kind, width=h.width, height=h.height, frames=h.frames,
                                                samples=samples)
        except ValueError as e:
            raise RequestError(h.source, f"the model's processor cannot take a {h.width} x {h.height} "
                               f"{'picture' if h.kind == 'image' else 'frame'} ({e})",
                               "send pictures whose longer side is at most 200 times the shorter") from None
        total += tokens
        largest = max(largest, (h.field, tokens), key=lambda pair: pair[1])
    if engine.truncate:
        return
    text = engine._encode(render_state(request.state, engine.placeholders), False)  # a part: one pad token
    tokens = len(text) + total - len(headers)
    if tokens > engine.max_tokens:
        raise ContextLengthError(largest[0], tokens, engine.max_tokens)
