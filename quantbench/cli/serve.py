"""`serve`: the flags of the decision server; the server itself is quantbench.server."""

from __future__ import annotations

from typing import Annotated

import typer

from quantbench import limits
from quantbench.cli.common import _fail
from quantbench.cli.media_flags import (
    MaxAudioSeconds,
    MaxImagePixels,
    MaxMediaBytes,
    MaxMediaParts,
    MaxVideoFrames,
    MaxVideoSeconds,
)
from quantbench.errors import QuantbenchError


def serve(
    model: Annotated[str | None, typer.Option(help="Checkpoint dir or hub id org/name[@revision]. Default: the embedded fixture (or its variant)")] = None,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8")] = "bf16",
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless told otherwise)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="QUANTBENCH_API_KEY", help="Require this key on every request")] = None,
    demo: Annotated[bool, typer.Option(help="Answer one built-in decision, print it, exit")] = False,
    allow_truncation: Annotated[bool, typer.Option(help="Cut over-long states instead of answering 413")] = False,
    max_batch: Annotated[int, typer.Option(help="Most requests batched into one forward pass")] = 16,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code")] = False,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 past it)")] = limits.DEFAULT_MAX_BODY_BYTES,
    max_questions: Annotated[int, typer.Option(help="Most questions per request (413 past it)")] = limits.DEFAULT_MAX_QUESTIONS,
    max_options: Annotated[int, typer.Option(help="Most options of one question (422 past it; past 26 they are numbered and scored by continuation)")] = limits.DEFAULT_MAX_OPTIONS,
    max_total_options: Annotated[int, typer.Option(help="Most options over all questions of a request, yes/no counting two (413 past it)")] = limits.DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: Annotated[int, typer.Option(help="Most tokens of a request's sequences, padded (413 past it); also the most per batched forward pass")] = limits.DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout: Annotated[float, typer.Option(help="Seconds from a request's headers to its answer: 408 while its body is read, 504 after (the request is dropped)")] = limits.DEFAULT_REQUEST_TIMEOUT_S,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection may take to send a request's headers before it is closed")] = limits.DEFAULT_HEADER_TIMEOUT_S,
    max_media_parts: MaxMediaParts = limits.DEFAULT_MAX_MEDIA_PARTS,
    max_media_bytes: MaxMediaBytes = limits.DEFAULT_MAX_MEDIA_BYTES,
    max_image_pixels: MaxImagePixels = limits.DEFAULT_MAX_IMAGE_PIXELS,
    max_audio_seconds: MaxAudioSeconds = limits.DEFAULT_MAX_AUDIO_SECONDS,
    max_video_frames: MaxVideoFrames = limits.DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: MaxVideoSeconds = limits.DEFAULT_MAX_VIDEO_SECONDS,
) -> None:
    """Serve the SystemOne decision API (POST /v1/systemone, GET /healthz) over HTTP."""
    from quantbench.server import cli_serve  # lazy: a fast --help

    try:
        raise typer.Exit(cli_serve(model, backend, host, port, api_key, demo, allow_truncation, max_batch,
                                   trust_remote_code, max_body_bytes=max_body_bytes, max_questions=max_questions,
                                   max_options=max_options, max_total_options=max_total_options,
                                   max_request_tokens=max_request_tokens, request_timeout_s=request_timeout,
                                   header_timeout_s=header_timeout,
                                   media_limits={"max_media_parts": max_media_parts, "max_media_bytes": max_media_bytes,
                                                 "max_image_pixels": max_image_pixels,
                                                 "max_audio_seconds": max_audio_seconds,
                                                 "max_video_frames": max_video_frames,
                                                 "max_video_seconds": max_video_seconds}) or 0)
    except QuantbenchError as e:
        _fail(e)
