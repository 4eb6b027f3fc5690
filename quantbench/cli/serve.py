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
    MaxPartDecodedBytes,
    MaxRequestDecodedBytes,
    MaxVideoFrames,
    MaxVideoSeconds,
)
from quantbench.cli.run import RunCommand, backend_settings
from quantbench.errors import QuantbenchError

# quantbench.server's defaults, spelled here so that `--help` does not import the server (torch, fastapi)
DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_QUEUE_MS = 10000.0
DEFAULT_MAX_WAIT_MS = 0.0


# The http backend's settings name a server to call, not a model to serve.
CLIENT_ONLY = ("endpoint", "api_key")


class ServeCommand(RunCommand):
    """`serve`, with the flags of every setting a local backend declares (as `run`: --cuda-graph, --fused-ops,
    --experts-impl, --nvfp4 …), checked against the chosen backend the same way."""

    def option_params(self) -> list:
        return [p for p in super().option_params() if p.name not in CLIENT_ONLY]


def serve(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Checkpoint dir or hub id org/name[@revision]. Default: the embedded fixture (or its variant)")] = None,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8")] = "bf16",
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless told otherwise)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="QUANTBENCH_API_KEY", help="Require this key on every request")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(help="A Host name the server answers besides the loopback names and --host (repeatable; '*': any). Requests addressed to any other name get 400: a web page cannot reach the server by DNS rebinding")] = None,
    demo: Annotated[bool, typer.Option(help="Answer one built-in decision, print it, exit")] = False,
    allow_truncation: Annotated[bool, typer.Option(help="Cut over-long states instead of answering 413")] = False,
    shape: Annotated[str | None, typer.Option(help="Synthetic real-shape model, e.g. qwen3-30b-a3b (random weights, as `run --shape`)")] = None,
    layers: Annotated[int | None, typer.Option(help="Synthetic shape: number of layers")] = None,
    seed: Annotated[int, typer.Option(help="Synthetic shape: seed of its random weights")] = 0,
    dtype: Annotated[str, typer.Option(help="bfloat16 | float32 | float16 (compute dtype)")] = "bfloat16",
    max_batch: Annotated[int, typer.Option(help="Most requests batched into one forward pass")] = DEFAULT_MAX_BATCH,
    max_queue: Annotated[int, typer.Option(help="Most requests admitted at once (being prepared, queued or answered); past it a request gets 503 with Retry-After at once")] = DEFAULT_MAX_QUEUE,
    max_queue_ms: Annotated[float, typer.Option(help="Queue deadline: a request whose expected wait (the forward passes ahead of it) is over this many ms gets 503 with Retry-After at once, and an admitted one still waiting after it gets it then (0: none)")] = DEFAULT_MAX_QUEUE_MS,
    max_wait_ms: Annotated[float, typer.Option(help="How long a forward pass waits for more requests to batch (0: it takes what queued meanwhile)")] = DEFAULT_MAX_WAIT_MS,
    warm: Annotated[bool, typer.Option(help="Before /healthz says ok, answer the demo request (on a GPU at batches 1, 2, 4 … --max-batch: compiles, captures graphs, reports the kernel that ran)")] = True,
    warm_tokens: Annotated[list[int] | None, typer.Option(help="On a GPU the warm-up also captures each batch size padded to this many tokens (repeatable; default 512: the reference workload), and for a model that reads pictures this many tokens plus a 448 x 448 picture's, so no client's first request of that shape waits for a capture")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code")] = False,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 past it)")] = limits.DEFAULT_MAX_BODY_BYTES,
    max_questions: Annotated[int, typer.Option(help="Most questions per request (413 past it)")] = limits.DEFAULT_MAX_QUESTIONS,
    max_options: Annotated[int, typer.Option(help="Most options of one question (422 past it; past 26 they are numbered and scored by continuation)")] = limits.DEFAULT_MAX_OPTIONS,
    max_total_options: Annotated[int, typer.Option(help="Most options over all questions of a request, yes/no counting two (413 past it)")] = limits.DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: Annotated[int, typer.Option(help="Most tokens of a request's sequences, padded (413 past it); also the most per batched forward pass")] = limits.DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout: Annotated[float, typer.Option(help="Seconds from a request's headers to its answer: 408 while its body is read, 504 after (the request is dropped)")] = limits.DEFAULT_REQUEST_TIMEOUT_S,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection may take to send a request's headers before it is closed")] = limits.DEFAULT_HEADER_TIMEOUT_S,
    access_log: Annotated[bool, typer.Option(help="Log a line per request on stderr (off: at hundreds a second it is work on the loop that answers them)")] = False,
    max_media_parts: MaxMediaParts = limits.DEFAULT_MAX_MEDIA_PARTS,
    max_media_bytes: MaxMediaBytes = limits.DEFAULT_MAX_MEDIA_BYTES,
    max_image_pixels: MaxImagePixels = limits.DEFAULT_MAX_IMAGE_PIXELS,
    max_audio_seconds: MaxAudioSeconds = limits.DEFAULT_MAX_AUDIO_SECONDS,
    max_video_frames: MaxVideoFrames = limits.DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: MaxVideoSeconds = limits.DEFAULT_MAX_VIDEO_SECONDS,
    max_part_decoded_bytes: MaxPartDecodedBytes = limits.DEFAULT_MAX_PART_DECODED_BYTES,
    max_request_decoded_bytes: MaxRequestDecodedBytes = limits.DEFAULT_MAX_REQUEST_DECODED_BYTES,
) -> None:
    """Serve the SystemOne decision API (POST /v1/systemone, GET /healthz) over HTTP."""
    from quantbench.server import cli_serve  # lazy: a fast --help

    try:
        options = backend_settings(backend, ctx.meta["backend_options"])
        raise typer.Exit(cli_serve(model, backend, host, port, api_key, demo, allow_truncation, max_batch,
                                   trust_remote_code, max_wait_ms, options=options, shape=shape, layers=layers,
                                   seed=seed, dtype=dtype, max_queue=max_queue, max_queue_ms=max_queue_ms, warm=warm,
                                   warm_tokens=tuple(warm_tokens) if warm_tokens else limits.DEFAULT_WARM_TOKENS,
                                   max_body_bytes=max_body_bytes, max_questions=max_questions,
                                   max_options=max_options, max_total_options=max_total_options,
                                   max_request_tokens=max_request_tokens, request_timeout_s=request_timeout,
                                   header_timeout_s=header_timeout, access_log=access_log,
                                   allowed_hosts=allowed_host or [],
                                   media_limits={"max_media_parts": max_media_parts, "max_media_bytes": max_media_bytes,
                                                 "max_image_pixels": max_image_pixels,
                                                 "max_audio_seconds": max_audio_seconds,
                                                 "max_video_frames": max_video_frames,
                                                 "max_video_seconds": max_video_seconds,
                                                 "max_part_decoded_bytes": max_part_decoded_bytes,
                                                 "max_request_decoded_bytes": max_request_decoded_bytes}) or 0)
    except QuantbenchError as e:
        _fail(e)
