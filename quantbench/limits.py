"""The size limits of one decision request, and their defaults: what `quantbench serve` refuses before any model
work, and what `quantbench run` allows in a suite.

A module of its own, importing nothing heavy, so the CLI can show the defaults in --help without loading pydantic.
Each limit has the flag that sets it; refusals name both (see quantbench.protocol.LimitError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from quantbench.errors import ConfigError

# Options of one choice question. Past 26 there are no single-letter labels: the options are numbered and
# scored by continuation (quantbench.protocol.prompt.option_labels), one sequence per option, each holding the
# whole prompt. The two defaults fit together: 32 options of a prompt up to 1,024 tokens are 32,768 padded tokens,
# DEFAULT_MAX_REQUEST_TOKENS (with 64 options the same prompt was 65,536: no 64-option question with its options
# listed could pass, so the limit could not be reached). 32 still asks a 30-tool router.
DEFAULT_MAX_OPTIONS = 32
OPTION_ROW_TOKENS = 1024  # the prompt length the defaults are sized for (tests/test_hostile_requests.py holds them)
# Questions of one request: each is its own sequence in the forward pass.
DEFAULT_MAX_QUESTIONS = 64
# Options over all questions of one request (a boolean question has two): bounds the sequences of a request.
DEFAULT_MAX_TOTAL_OPTIONS = 512
# Tokens of all sequences of one request, padded to the longest (what the forward pass computes over). The server
# also batches concurrent requests only up to this many padded tokens per forward pass.
DEFAULT_MAX_REQUEST_TOKENS = 32_768
DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # from the request's headers to its answer
DEFAULT_HEADER_TIMEOUT_S = 10.0  # a connection that sends no complete request headers this long is closed
# `serve`'s warm-up captures every batch size at these widths too, on a GPU (the reference workload's decisions)
DEFAULT_WARM_TOKENS = (512,)
# Media parts (quantbench.protocol.media): each checked before the part is decoded in full, so a small body cannot
# unpack into gigabytes (a 30,000 x 30,000 PNG is 874 KB; an hour of silence in FLAC about 90 KB).
# A state this many characters per token of context is tokenized only as far as that: a 4 MB state took 13 s to
# tokenize whole (docs/BENCHMARKS.md) only to be refused as over a 512-token context, and with truncation it was
# tokenized whole twice per question. The server bounds a request's state so (quantbench.server.schema), and
# `run` a suite's before its child loads the model (quantbench.run.checks).
STATE_PREFIX_CHARS_PER_TOKEN = 16
STATE_PREFIX_MARGIN_TOKENS = 64  # the prefix's cut word and the prompt's template can shift a few tokens

DEFAULT_MAX_MEDIA_PARTS = 16  # parts in one request's state (each frame of a `frames` video counts as a frame)
DEFAULT_MAX_MEDIA_BYTES = 16 << 20  # 16 MiB of encoded bytes per part (a file, or a data URI's decoded base64)
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096  # per image or video frame, read from its header
DEFAULT_MAX_AUDIO_SECONDS = 600  # per audio part, read from its header
DEFAULT_MAX_VIDEO_FRAMES = 256  # per video part, after sampling to its fps
DEFAULT_MAX_VIDEO_SECONDS = 600  # per video part, read from its stream header
# Decoded bytes, the memory a part takes once decoded (pixels x frames x 3 for pictures and video, samples x
# channels x 4 for audio, as float32), computed from the headers before anything is decoded and counted again
# while decoding. Each limit above is per dimension: a 59 KB mp4 of 256 black 4096^2 frames is inside all of them
# and decodes to 12.9 GB; these bound the product. 256 MiB holds a 4096^2 picture five times over, 256 frames of
# 640 x 480, or ten minutes of 48 kHz stereo.
DEFAULT_MAX_PART_DECODED_BYTES = 256 << 20
DEFAULT_MAX_REQUEST_DECODED_BYTES = 512 << 20  # over all the parts of one request


# The media limits' names, in the order the CLI shows their flags.
MEDIA_LIMITS = ("max_media_parts", "max_media_bytes", "max_image_pixels", "max_audio_seconds", "max_video_frames",
                "max_video_seconds", "max_part_decoded_bytes", "max_request_decoded_bytes")


@dataclass(frozen=True)
class Limits:
    """Limits on the shape of one request, checked on the parsed JSON before it is validated field by field."""

    max_options: int = DEFAULT_MAX_OPTIONS
    max_questions: int = DEFAULT_MAX_QUESTIONS
    max_total_options: int = DEFAULT_MAX_TOTAL_OPTIONS
    max_media_parts: int = DEFAULT_MAX_MEDIA_PARTS
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_audio_seconds: int = DEFAULT_MAX_AUDIO_SECONDS
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES
    max_video_seconds: int = DEFAULT_MAX_VIDEO_SECONDS
    max_part_decoded_bytes: int = DEFAULT_MAX_PART_DECODED_BYTES
    max_request_decoded_bytes: int = DEFAULT_MAX_REQUEST_DECODED_BYTES

    def __post_init__(self) -> None:
        for f in fields(self):
            # a choice question has at least two options; every other limit counts from one
            least = 2 if f.name in ("max_options", "max_total_options") else 1
            if why := bound_refusal(flag(f.name), getattr(self, f.name), least=least):
                raise ConfigError(why)


def flag(name: str) -> str:
    """The command-line flag of a limit: max_total_options -> --max-total-options."""
    return "--" + name.replace("_", "-")


def bound_refusal(where: str, value: float, *, least: float | None = None, above: float | None = None,
                  most: float | None = None, unit: str = "") -> str | None:
    """Why a number is refused by its bounds (values below `least`, at or below `above`, above `most`), naming the
    flag `where` and the fix; None when it is inside them. The one check of `run`'s and `serve`'s numeric settings and of the request limits.
    NaN passes a plain `value < least` (`run --latency-min-seconds nan` ran as if unset, `serve --max-wait-ms nan`
    batched with a NaN wait) and an infinite value with only a lower bound is a phase that never ends: both refused.
    (`above` refuses NaN itself; an infinite `above`-only value, a --timeout, is a run with no deadline.)"""
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    units = f" {unit}" if unit else ""
    if least is not None and isinstance(value, float) and not math.isfinite(value):
        return f"{where} {shown}: give a finite number, {least:g} or more{units}"
    if least is not None and value < least:
        return f"{where} {shown}: give {least:g} or more{units}"
    if most is not None and value > most:
        return f"{where} {shown}: give {most:g} or fewer{units}"
    if above is not None and not value > above:
        number = "a positive number" if above == 0 else f"a number above {above:g}"
        return f"{where} {shown}: give {number}{' of ' + unit if unit else ''}"
    return None
