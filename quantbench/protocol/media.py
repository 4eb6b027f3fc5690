"""Media parts of a decision state decoded: image -> RGB PIL image, audio -> float32 mono samples at 16 kHz,
video -> RGB frames and their rate. The JSON of a part is defined (and checked) in quantbench.protocol.

Each limit of quantbench.limits.Limits is checked before the part is decoded in full, from what its container's
header says: encoded bytes before base64 is decoded or a file is read, pixels from the image header (a 30,000 x
30,000 PNG is 874 KB, 2.7 GB decoded), seconds from the audio header, frames and seconds from the mp4 stream
header (and again while decoding, should the header lie), and the length of a `frames` list before any frame.
Every problem is a RequestError naming the field (`state.camera.data`, `state.clip.frames[7]`); every broken
limit a LimitError naming its flag.

The decoders are imported when a part of their type arrives, so a text-only run never loads them: Pillow,
soundfile (libsndfile: WAV, FLAC), PyAV (FFmpeg: mp4; PyPI's torchvision does not import beside torch 2.13 CPU).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quantbench.errors import RequestError
from quantbench.limits import Limits, flag
from quantbench.protocol import (
    MEDIA_MIMES,
    MEDIA_NOUNS,
    DecisionRequest,
    LimitError,
    check_media_part,
    data_uri_format,
    media_parts,
    media_too_large,
)

if TYPE_CHECKING:
    from PIL.Image import Image

AUDIO_SAMPLING_RATE = 16_000  # what Qwen3-Omni's (Whisper) feature extractor takes
IMAGE_FORMATS = frozenset(MEDIA_MIMES["image"].values())
AUDIO_FORMATS = frozenset(MEDIA_MIMES["audio"].values())


@dataclass(frozen=True)
class DecodedImage:
    field: str
    image: Image  # RGB


@dataclass(frozen=True)
class DecodedAudio:
    field: str
    samples: np.ndarray  # float32, mono, at `sampling_rate`
    seconds: float
    sampling_rate: int = AUDIO_SAMPLING_RATE


@dataclass(frozen=True)
class DecodedVideo:
    field: str
    frames: list[np.ndarray]  # uint8 [height, width, 3] RGB, all of one size
    fps: float

    @property
    def seconds(self) -> float:
        return len(self.frames) / self.fps


Decoded = DecodedImage | DecodedAudio | DecodedVideo


def decode_media(state: dict[str, Any], limits: Limits, *, base: Path | None = None) -> list[Decoded]:
    """Every media part of `state`, checked and decoded, in order. `base`: the folder `path` sources are read
    from (a suite file's); None refuses them (a request from the network)."""
    return [decode_part(field, part, limits, base=base) for field, part in media_parts(state)]


def decode_part(field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
    """One part (its JSON checked again here, so this is safe on a part that never went through parse_request)."""
    check_media_part(field, part, limits)
    kind = part["type"]
    if "frames" in part:
        return _frames_video(field, part["frames"], float(part["fps"]), limits)
    raw, source, declared = _part_bytes(field, part, limits, base)
    if kind == "image":
        return DecodedImage(field, _image(source, raw, declared, limits))
    if kind == "audio":
        samples, seconds = _audio(source, raw, declared, limits)
        return DecodedAudio(field, samples, seconds)
    frames, fps = _mp4(source, raw, limits)
    return DecodedVideo(field, frames, fps)


def resolve_media_path(base: Path, path: str, field: str) -> Path:
    """`path` inside the folder `base`, or RequestError: `..`, absolute paths and symlinks out are refused."""
    root = base.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        raise RequestError(
            field, f"{path!r} is outside the suite's folder {root}",
            "keep media files in the suite file's folder (a symlink must point inside it too)",
        )
    if not target.is_file():
        raise RequestError(field, f"{path!r}: no such file in {root}", "give a path relative to the suite file")
    return target


def _part_bytes(field: str, part: dict[str, Any], limits: Limits, base: Path | None) -> tuple[bytes, str, str | None]:
    """(bytes, the field they came from, the format the data URI declares or None for a file)."""
    if "path" in part:
        source = f"{field}.path"
        if base is None:
            raise RequestError(
                source, "a path is read only from a suite file; requests never name local files",
                'send the bytes as "data": "data:<mime>;base64,..."',
            )
        target = resolve_media_path(base, part["path"], source)
        size = target.stat().st_size
        if size > limits.max_media_bytes:
            raise media_too_large(source, size, limits)
        return target.read_bytes(), source, None
    source = f"{field}.data"
    declared, payload = data_uri_format(source, part["type"], part["data"])
    return _b64(source, payload, limits), source, declared


def _b64(field: str, payload: str, limits: Limits) -> bytes:
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(field, "its base64 payload does not decode", "encode the bytes as standard base64") from None
    if len(raw) > limits.max_media_bytes:
        raise media_too_large(field, len(raw), limits)
    return raw


def _over(field: str, problem: str, name: str, limits: Limits, fix: str) -> LimitError:
    limit = getattr(limits, name)
    return LimitError(
        field, f"{problem}, over the limit of {limit} ({flag(name)})", f"{fix}, or raise {flag(name)}",
        limit=limit, flag=flag(name), status=413,
    )


def _not_decodable(field: str, kind: str, err: BaseException) -> RequestError:
    text = re.sub(r" ?<[^>]*>", "", str(err)).strip()  # drop reprs such as <_io.BytesIO object at 0x...>
    detail = text.splitlines()[0][:120] if text else type(err).__name__
    return RequestError(field, f"the bytes are not {MEDIA_NOUNS[kind]} quantbench decodes ({detail})",
                        "send " + ", ".join(MEDIA_MIMES[kind]))


def _wrong_format(field: str, kind: str, found: str, declared: str | None, allowed: frozenset[str]) -> RequestError:
    if declared is not None and found in allowed:
        return RequestError(field, f"the data URI says {declared} but the bytes are {found}",
                            "give the mime type of the bytes you send")
    return RequestError(field, f"the bytes are {found}, not {MEDIA_NOUNS[kind]} format quantbench reads",
                        "send " + ", ".join(MEDIA_MIMES[kind]))


def _image(field: str, raw: bytes, declared: str | None, limits: Limits) -> Image:
    from PIL import Image, UnidentifiedImageError  # lazy: Pillow only when an image arrives

    try:
        image = Image.open(io.BytesIO(raw))  # reads the header only
    except Image.DecompressionBombError as e:  # Pillow's own guard, past 2 x 89,478,485 pixels
        raise LimitError(
            field, f"the image is over the limit of {limits.max_image_pixels} pixels ({flag('max_image_pixels')}): {e}",
            "send a smaller image", limit=limits.max_image_pixels, flag=flag("max_image_pixels"), status=413,
        ) from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise _not_decodable(field, "image", e) from None
    found = image.format or "unknown"
    if found not in IMAGE_FORMATS or (declared is not None and found != declared):
        raise _wrong_format(field, "image", found, declared, IMAGE_FORMATS)
    width, height = image.size
    if width * height > limits.max_image_pixels:
        raise _over(field, f"the image is {width} x {height} = {width * height} pixels", "max_image_pixels", limits,
                    "send a smaller image")
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, ValueError, SyntaxError) as e:  # truncated or corrupt pixel data
        raise _not_decodable(field, "image", e) from None


def _audio(field: str, raw: bytes, declared: str | None, limits: Limits) -> tuple[np.ndarray, float]:
    import soundfile  # lazy: libsndfile only when audio arrives

    try:
        info = soundfile.info(io.BytesIO(raw))  # the header: format, rate, frames
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise _not_decodable(field, "audio", e) from None
    found = info.format
    if found not in AUDIO_FORMATS or (declared is not None and found != declared):
        raise _wrong_format(field, "audio", found, declared, AUDIO_FORMATS)
    seconds = info.frames / info.samplerate
    if seconds > limits.max_audio_seconds:
        raise _over(field, f"the audio lasts {seconds:.1f} seconds", "max_audio_seconds", limits,
                    "send a shorter clip")
    try:
        samples, rate = soundfile.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise _not_decodable(field, "audio", e) from None
    mono = samples.mean(axis=1, dtype=np.float32)
    if rate != AUDIO_SAMPLING_RATE:
        from scipy.signal import resample_poly  # lazy: scipy only for audio not already at 16 kHz

        g = math.gcd(rate, AUDIO_SAMPLING_RATE)
        mono = resample_poly(mono, AUDIO_SAMPLING_RATE // g, rate // g).astype(np.float32)
    return mono, len(samples) / rate


def _mp4(field: str, raw: bytes, limits: Limits) -> tuple[list[np.ndarray], float]:
    import av  # lazy: PyAV (its own FFmpeg, about 100 MB) only when an mp4 arrives

    try:
        container = av.open(io.BytesIO(raw), mode="r")
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise _not_decodable(field, "video", e) from None
    with container:
        if "mp4" not in container.format.name.split(","):
            raise _wrong_format(field, "video", container.format.name, "MP4", frozenset({"MP4"}))
        if not container.streams.video:
            raise RequestError(field, "the mp4 has no video stream", "send an mp4 with a video track")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > limits.max_image_pixels:
            raise _over(field, f"each frame is {width} x {height} = {width * height} pixels", "max_image_pixels", limits,
                        "send a smaller video")
        if stream.frames > limits.max_video_frames:
            raise _over(field, f"the video has {stream.frames} frames", "max_video_frames", limits,
                        "send fewer frames (a shorter clip, or a lower frame rate)")
        seconds = (
            float(stream.duration * stream.time_base) if stream.duration and stream.time_base
            else (container.duration or 0) / av.time_base
        )
        if seconds > limits.max_video_seconds:
            raise _over(field, f"the video lasts {seconds:.1f} seconds", "max_video_seconds", limits,
                        "send a shorter clip")
        frames: list[np.ndarray] = []
        try:
            for frame in container.decode(stream):
                if len(frames) == limits.max_video_frames:  # the header gave no count, or a wrong one
                    raise _over(field, f"the video has more than {len(frames)} frames", "max_video_frames", limits,
                                "send fewer frames (a shorter clip, or a lower frame rate)")
                frames.append(frame.to_ndarray(format="rgb24"))
        except av.error.FFmpegError as e:
            raise _not_decodable(field, "video", e) from None
        if not frames:
            raise RequestError(field, "the mp4 has no decodable frames", "send an mp4 with at least one frame")
        rate = float(stream.average_rate) if stream.average_rate else len(frames) / seconds if seconds else 0.0
        if not rate > 0:
            raise RequestError(field, "the mp4 does not say its frame rate", "re-encode it with a constant rate")
    return frames, rate


def _frames_video(field: str, frames: list[str], fps: float, limits: Limits) -> DecodedVideo:
    arrays: list[np.ndarray] = []
    for i, uri in enumerate(frames):  # their count is checked before any is decoded (check_media_part)
        source = f"{field}.frames[{i}]"
        declared, payload = data_uri_format(source, "image", uri)
        array = np.asarray(_image(source, _b64(source, payload, limits), declared, limits))
        if arrays and array.shape != arrays[0].shape:
            raise RequestError(source, f"the frame is {array.shape[1]} x {array.shape[0]}, the first frame "
                               f"{arrays[0].shape[1]} x {arrays[0].shape[0]}", "send frames of one size")
        arrays.append(array)
    return DecodedVideo(field, arrays, fps)


def inline_media_paths(request: DecisionRequest, limits: Limits, *, base: Path | None) -> DecisionRequest:
    """`request` with each `path` part of its state replaced by a `data` part holding the file's bytes as a data
    URI, for what reads no local file (a server, a checkpoint's own scorer). Each file is checked as a local run
    checks it first (decode_part: inside `base`, the limits, decodable), and its mime type is the format sniffed
    from its bytes, not its name. A request without path parts is returned as it is."""
    paths = [(field, part) for field, part in request.media_parts() if "path" in part]
    if not paths:
        return request
    inlined: dict[int, dict[str, Any]] = {}
    for field, part in paths:
        decode_part(field, part, limits, base=base)  # RequestError / LimitError naming `{field}.path`
        raw = resolve_media_path(base, part["path"], f"{field}.path").read_bytes()  # base is set: decode_part read it
        fmt = _sniffed_format(part["type"], raw)
        mime = next(m for m, f in MEDIA_MIMES[part["type"]].items() if f == fmt)
        inlined[id(part)] = {"type": part["type"], "data": f"data:{mime};base64,{base64.b64encode(raw).decode()}"}

    def swap(value: Any) -> Any:
        if isinstance(value, list):
            return [inlined.get(id(item), item) for item in value]
        return inlined.get(id(value), value)

    state = {key: swap(value) for key, value in request.state.items()}
    return request.model_copy(update={"state": state})


def _sniffed_format(kind: str, raw: bytes) -> str:
    """The format of bytes that decode_part has accepted as `kind` (one of MEDIA_MIMES[kind]'s formats)."""
    if kind == "image":
        from PIL import Image

        with Image.open(io.BytesIO(raw)) as image:
            return image.format
    if kind == "audio":
        import soundfile

        return soundfile.info(io.BytesIO(raw)).format
    return "MP4"  # the only video container decode_part accepts
