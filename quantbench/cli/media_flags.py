"""The media limit flags `run` and `serve` share (quantbench.limits.MEDIA_LIMITS), declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from quantbench import limits

MaxMediaParts = Annotated[int, typer.Option(help="Most media parts in one request's state (413 past it)")]
MaxMediaBytes = Annotated[int, typer.Option(help="Largest encoded media part, in bytes (413 past it)")]
MaxImagePixels = Annotated[int, typer.Option(help="Most pixels of an image or video frame, read from its header (413 past it)")]
MaxAudioSeconds = Annotated[int, typer.Option(help="Longest audio part, in seconds, read from its header (413 past it)")]
MaxVideoFrames = Annotated[int, typer.Option(help="Most frames of a video part (413 past it)")]
MaxVideoSeconds = Annotated[int, typer.Option(help="Longest video part, in seconds, read from its stream header (413 past it)")]
MaxPartDecodedBytes = Annotated[int, typer.Option(help="Most bytes one media part decodes to (pixels x frames x 3, samples x channels x 4), from its header before decoding (413 past it)")]
MaxRequestDecodedBytes = Annotated[int, typer.Option(help="Most bytes all the media parts of one request decode to, from their headers before decoding (413 past it)")]
DEFAULTS = {name: getattr(limits, "DEFAULT_" + name.upper()) for name in limits.MEDIA_LIMITS}


def media_limits(**given: int) -> dict[str, int]:
    """The media limits given, by name (max_media_bytes ...), only those that differ from their default."""
    return {name: value for name, value in given.items() if value != DEFAULTS[name]}
