"""Media parts of a decision state decoded: image -> RGB PIL image, audio -> float32 mono samples at 16 kHz,
video -> RGB frames (one uint8 array [frames, height, width, 3]) and their rate. The JSON of a part is defined
(and checked) in quantbench.protocol.

The bytes never steer the decoder. A container is recognised by its own magic bytes before any decoder sees it
(PNG, JPEG, WebP; RIFF/WAVE, fLaC; an ISO-BMFF `ftyp` box), and each decoder is then opened for that one format
only: Pillow with `formats=[...]`, libsndfile checked to have read the format sniffed, FFmpeg (PyAV) with the mp4
demuxer named (`format="mp4"`, so no probing: an SDP description or an ffconcat list named `video/mp4` is refused
at the magic check, never opened), no nested protocols (`protocol_whitelist` empty, an `io_open` that refuses every
nested open, external data references off) and a time bound. No decoder opens a file or a socket.

Each limit of quantbench.limits.Limits is checked before the part is decoded, from what its header says: encoded
bytes before base64 is decoded or a file is read, pixels from the image header (a 30,000 x 30,000 PNG is 874 KB,
2.7 GB decoded), seconds from the audio header, frames and seconds from the mp4 stream header, and the length of a
`frames` list before any frame; then the decoded size those imply (pixels x frames x 3, samples x channels x 4) against
--max-part-decoded-bytes, and a request's parts together against --max-request-decoded-bytes (`probe_media`), so a
59 KB mp4 of 256 4096^2 frames (12.9 GB decoded) or a 173 KB FLAC of 8 channels at 655,350 Hz for 480 s (10 GB) is
refused in milliseconds. While decoding, the same bounds are enforced against what the header said (a frame of
another size, more frames or samples than declared), the decoded values are written once into their final array
(frames into one preallocated [frames, h, w, 3] array, audio a block at a time into its mono array), and
`check_cancelled()` lets a request that timed out or lost its client stop its decoding between frames or blocks
(quantbench.protocol.cancel). Every problem is a RequestError naming the field (`state.camera.data`,
`state.clip.frames[7]`); every broken limit a LimitError naming its flag.

The decoders are imported when a part of their type arrives, so a text-only run never loads them: Pillow,
soundfile (libsndfile: WAV, FLAC), PyAV (FFmpeg: mp4; PyPI's torchvision does not import beside torch 2.13 CPU).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quantbench.errors import RequestError
from quantbench.limits import Limits, flag
from quantbench.protocol import (
    MAX_FPS,
    MEDIA_MIMES,
    MEDIA_NOUNS,
    DecisionRequest,
    LimitError,
    check_media_part,
    data_uri_format,
    media_parts,
    media_too_large,
)
from quantbench.protocol.cancel import Cancelled, check_cancelled

if TYPE_CHECKING:
    from PIL.Image import Image

AUDIO_SAMPLING_RATE = 16_000  # what Qwen3-Omni's (Whisper) feature extractor takes
IMAGE_FORMATS = frozenset(MEDIA_MIMES["image"].values())
AUDIO_FORMATS = frozenset(MEDIA_MIMES["audio"].values())
RGB_BYTES = 3  # a decoded pixel
AUDIO_SAMPLE_BYTES = 4  # a decoded sample (float32)
AUDIO_BLOCK = 1 << 16  # samples per channel read at a time (8 channels: 2 MiB a block)
SF_COUNT_MAX = 2**63 - 1  # libsndfile's frame count of a stream whose length its header does not hold
# FFmpeg's open and each read give up after this many seconds: the demuxer reads memory, so only a decoder
# steered into waiting (what probing an SDP file does for 10 s) would come near it.
FFMPEG_TIMEOUT_S = 5.0
# The video codecs an mp4 may carry: what cameras, phones, browsers and ffmpeg write. Every other FFmpeg decoder
# (there are hundreds in PyAV's build) stays out of reach of a request's bytes.
VIDEO_CODECS = frozenset({"h264", "hevc", "mpeg4", "vp9", "av1", "libdav1d", "mjpeg"})


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
    frames: np.ndarray  # uint8 [frames, height, width, 3] RGB: one array (its frames index like a list)
    fps: float

    @property
    def seconds(self) -> float:
        return len(self.frames) / self.fps


Decoded = DecodedImage | DecodedAudio | DecodedVideo


@dataclass(frozen=True)
class MediaHeader:
    """What a part's container says about it before anything is decoded, and the bytes decoding it would hold."""

    field: str  # the part's field, `state.camera`
    kind: str  # image | audio | video
    source: str  # the field of its bytes: `state.camera.data`, `.path`, `.frames`
    format: str  # PNG, JPEG, WEBP, WAV, FLAC, MP4, or the frames' format
    width: int = 0
    height: int = 0
    frames: int = 0  # a video's frames (1 for an image)
    fps: float = 0.0
    seconds: float = 0.0  # audio and video
    channels: int = 0  # audio
    rate: int = 0  # audio: samples a second, per channel
    samples: int = 0  # audio: samples per channel
    decoded_bytes: int = 0


# -- the magic bytes ---------------------------------------------------------------------------------------------
def sniff(raw: bytes) -> str | None:
    """The container format of `raw` from its own first bytes (one of the formats of MEDIA_MIMES), or None."""
    head = raw[:12]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "WAV"
    if head.startswith(b"fLaC"):
        return "FLAC"
    if head[4:8] == b"ftyp":
        return "MP4"
    return None


# Formats quantbench does not read, recognised only to say what was sent instead.
OTHER_FORMATS = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\0", "TIFF"), (b"MM\0*", "TIFF"),
                 (b"OggS", "Ogg"), (b"ID3", "MP3"), (b"\xff\xfb", "MP3"), (b"\xff\xf3", "MP3"), (b"\xff\xf2", "MP3"),
                 (b"RF64", "RF64 (64-bit WAV)"), (b"FORM", "AIFF"), (b"\x1aE\xdf\xa3", "Matroska/WebM"),
                 (b"%PDF", "PDF"))


def _described(raw: bytes) -> str | None:
    """The format the bytes start with, for an error: one quantbench reads or a well-known other; None."""
    return sniff(raw) or next((name for magic, name in OTHER_FORMATS if raw.startswith(magic)), None)


# -- parts and requests ------------------------------------------------------------------------------------------
def decode_media(state: dict[str, Any], limits: Limits, *, base: Path | None = None) -> list[Decoded]:
    """Every media part of `state`, checked and decoded, in order. `base`: the folder `path` sources are read
    from (a suite file's); None refuses them (a request from the network). Every part's header is read and the
    request's decoded size checked before the first part is decoded."""
    probe_media(state, limits, base=base)
    return [decode_part(field, part, limits, base=base) for field, part in media_parts(state)]


def probe_media(state: dict[str, Any], limits: Limits, *, base: Path | None = None) -> list[MediaHeader]:
    """The header of every media part of `state`, each checked against the per-part limits, and their decoded
    bytes together against --max-request-decoded-bytes: LimitError before anything is decoded."""
    headers = [probe_part(field, part, limits, base=base) for field, part in media_parts(state)]
    total = sum(h.decoded_bytes for h in headers)
    if total > limits.max_request_decoded_bytes:
        sizes = ", ".join(f"{h.field} {h.decoded_bytes / 2**20:.1f} MiB" for h in headers)
        raise LimitError(
            "state", f"its media parts decode to {total} bytes ({sizes}), over the limit of "
            f"{limits.max_request_decoded_bytes} ({flag('max_request_decoded_bytes')})",
            f"send smaller or fewer media parts per request, or raise {flag('max_request_decoded_bytes')}",
            limit=limits.max_request_decoded_bytes, flag=flag("max_request_decoded_bytes"), status=413,
        )
    return headers


def probe_part(field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> MediaHeader:
    """One part's header, checked against every per-part limit (its decoded size included); nothing decoded."""
    check_media_part(field, part, limits)
    with _decoder_errors_named(field, part):
        if "frames" in part:
            return _frames_header(field, part["frames"], float(part["fps"]), limits)[0]
        raw, source, declared = _part_bytes(field, part, limits, base)
        return _header(field, part["type"], source, raw, declared, limits)[0]


def decode_part(field: str, part: dict[str, Any], limits: Limits, *, base: Path | None = None) -> Decoded:
    """One part (its JSON and header checked again here, so this is safe on a part that never went through
    parse_request or probe_part)."""
    check_media_part(field, part, limits)
    with _decoder_errors_named(field, part):
        if "frames" in part:
            header, uris = _frames_header(field, part["frames"], float(part["fps"]), limits)
            return DecodedVideo(field, _decode_frames(header, uris), header.fps)
        raw, source, declared = _part_bytes(field, part, limits, base)
        header, opened = _header(field, part["type"], source, raw, declared, limits)
        check_cancelled()
        if header.kind == "image":
            return DecodedImage(field, _decode_image(source, opened))
        if header.kind == "audio":
            return DecodedAudio(field, _decode_audio(header, raw), header.seconds)
        return DecodedVideo(field, _decode_mp4(header, raw), header.fps)


@contextmanager
def _decoder_errors_named(field: str, part: dict[str, Any]) -> Iterator[None]:
    """Whatever else a third-party decoder raises on hostile bytes (an EOFError from a Pillow plugin, a
    PermissionError from a nested open refused mid-stream, an IndexError in a corrupt header) is the part's bytes
    not decoding: a RequestError naming the part's bytes, never a crash of the request. Each decoder's known
    errors are named where they are raised; this is the boundary behind them."""
    try:
        yield
    except (RequestError, Cancelled):
        raise
    except Exception as e:  # noqa: BLE001 - see the docstring: the decoders' unknown failures on hostile bytes
        source = f"{field}.{next((k for k in ('data', 'path', 'frames') if k in part), 'data')}"
        raise _not_decodable(source, part["type"], e) from None


def _header(field: str, kind: str, source: str, raw: bytes, declared: str | None,
            limits: Limits) -> tuple[MediaHeader, Any]:
    """(the header, the opened image for an image part: decoding goes on from it)."""
    found = sniff(raw)
    allowed = frozenset(MEDIA_MIMES[kind].values())
    if found not in allowed or (declared is not None and found != declared):
        raise _wrong_format(source, kind, _described(raw), declared, allowed)
    if kind == "image":
        image = _open_image(source, raw, found)
        return _image_header(field, kind, source, image, limits), image
    if kind == "audio":
        return _audio_header(field, source, raw, found, limits), None
    return _mp4_header(field, source, raw, limits), None


def _within_budget(header: MediaHeader, limits: Limits) -> MediaHeader:
    if header.decoded_bytes > limits.max_part_decoded_bytes:
        raise _over(header.source, f"it decodes to {header.decoded_bytes} bytes ({_shape(header)})",
                    "max_part_decoded_bytes", limits, f"send a smaller {header.kind}")
    return header


def _shape(h: MediaHeader) -> str:
    if h.kind == "audio":
        return f"{h.samples} samples x {h.channels} channels x {AUDIO_SAMPLE_BYTES} bytes"
    frames = f"{h.frames} frames of " if h.kind == "video" else ""
    return f"{frames}{h.width} x {h.height} pixels x {RGB_BYTES} bytes"


def resolve_media_path(base: Path, path: str, field: str) -> Path:
    """`path` inside the folder `base`, or RequestError: `..`, absolute paths and symlinks out are refused."""
    root = base.resolve()
    try:
        target = (root / path).resolve()
        is_file = target.is_file()
    except (OSError, ValueError, RuntimeError) as e:  # a NUL, a name too long, a symlink loop: was a traceback
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).split(" from ")[0]
        raise RequestError(field, f"{path[:200]!r} cannot be read as a path ({why})",
                           "give a path relative to the suite file, of a file inside its folder") from None
    if not target.is_relative_to(root):
        raise RequestError(
            field, f"{path!r} is outside the suite's folder {root}",
            "keep media files in the suite file's folder (a symlink must point inside it too)",
        )
    if not is_file:
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


def _not_decodable(field: str, kind: str, err: BaseException | str) -> RequestError:
    text = re.sub(r" ?<[^>]*>", "", str(err)).strip()  # drop reprs such as <_io.BytesIO object at 0x...>
    detail = text.splitlines()[0][:120] if text else type(err).__name__
    return RequestError(field, f"the bytes are not {MEDIA_NOUNS[kind]} quantbench decodes ({detail})",
                        "send " + ", ".join(MEDIA_MIMES[kind]))


def _wrong_format(field: str, kind: str, found: str | None, declared: str | None,
                  allowed: frozenset[str]) -> RequestError:
    if declared is not None and found in allowed:
        return RequestError(field, f"the data URI says {declared} but the bytes are {found}",
                            "give the mime type of the bytes you send")
    if found is None:  # nothing known: the bytes are never handed to a decoder to guess
        return RequestError(field, f"the bytes are not {MEDIA_NOUNS[kind]} quantbench decodes (they do not start "
                            f"with the signature of {' or '.join(sorted(allowed))})", "send " + ", ".join(MEDIA_MIMES[kind]))
    return RequestError(field, f"the bytes are {found}, not {MEDIA_NOUNS[kind]} format quantbench reads",
                        "send " + ", ".join(MEDIA_MIMES[kind]))


# -- images ------------------------------------------------------------------------------------------------------
def _open_image(field: str, raw: bytes, fmt: str) -> Image:
    """The image's header, read by Pillow's plugin for `fmt` alone (Pillow would otherwise try each of its
    formats in turn, EPS through Ghostscript among them)."""
    from PIL import Image, UnidentifiedImageError  # lazy: Pillow only when an image arrives

    try:
        return Image.open(io.BytesIO(raw), formats=[fmt])  # reads the header only
    except Image.DecompressionBombError as e:  # Pillow's own guard, past 2 x 89,478,485 pixels
        raise LimitError(
            field, f"the image is over Pillow's decompression-bomb guard ({e})", "send a smaller image",
            limit=Image.MAX_IMAGE_PIXELS or 0, flag=flag("max_image_pixels"), status=413,
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise _not_decodable(field, "image", e) from None


# EXIF orientations that turn the stored picture a quarter turn: its width and height trade places when shown.
QUARTER_TURNS = frozenset({5, 6, 7, 8})
EXIF_ORIENTATION = 0x0112


def _orientation(image: Image) -> int:
    """The EXIF orientation the header holds (1: as stored), read without decoding: Pillow's PNG getexif decodes
    the pixels when no eXIf chunk came before them, so such a PNG counts as upright here (its picture is turned
    when decoded, as transformers turns it; a quarter turn changes neither its pixels nor its token count)."""
    if image.format == "PNG" and "exif" not in image.info:
        return 1
    return image.getexif().get(EXIF_ORIENTATION, 1)


def _image_header(field: str, kind: str, source: str, image: Image, limits: Limits) -> MediaHeader:
    width, height = image.size
    if _orientation(image) in QUARTER_TURNS:  # a phone's portrait photo is stored landscape: the shown size
        width, height = height, width
    if width * height > limits.max_image_pixels:
        raise _over(source, f"the image is {width} x {height} = {width * height} pixels", "max_image_pixels", limits,
                    "send a smaller image")
    if width < 1 or height < 1:
        raise RequestError(source, f"the image is {width} x {height} pixels", "send an image with pixels")
    return _within_budget(MediaHeader(field, kind, source, image.format or "", width, height, 1,
                                      decoded_bytes=width * height * RGB_BYTES), limits)


def _decode_image(field: str, image: Image) -> Image:
    from PIL import ImageOps

    try:
        image.load()
        # The picture as shown, as transformers' load_image gives it to the Qwen3-Omni processor (exif_transpose,
        # then RGB): a phone photo's EXIF orientation was ignored and the model saw it on its side.
        ImageOps.exif_transpose(image, in_place=True)
        return image.convert("RGB")  # a new image: the encoded bytes the opened one holds are let go
    except (OSError, ValueError, SyntaxError) as e:  # truncated or corrupt pixel data
        raise _not_decodable(field, "image", e) from None


# -- audio -------------------------------------------------------------------------------------------------------
def _audio_header(field: str, source: str, raw: bytes, fmt: str, limits: Limits) -> MediaHeader:
    import soundfile  # lazy: libsndfile only when audio arrives

    try:
        info = soundfile.info(io.BytesIO(raw))  # the header: format, rate, channels, frames
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise _not_decodable(source, "audio", e) from None
    if info.format != fmt:  # libsndfile read another format than the magic bytes say: not what was checked
        raise _not_decodable(source, "audio", f"libsndfile reads it as {info.format}, its first bytes say {fmt}")
    if info.frames == SF_COUNT_MAX:  # FLAC's "total samples: unknown", read as 2^63 - 1 frames (5.8e14 s)
        raise RequestError(source, f"the {fmt} header does not say how long the audio is (a stream written to a "
                           "pipe leaves it unset)", "write it to a file, so that its header holds its length "
                           "(ffmpeg -i in.flac out.flac)")
    if info.frames <= 0 or info.samplerate <= 0 or info.channels <= 0:
        raise RequestError(source, f"the audio has no samples ({info.frames} frames of {info.channels} channels "
                           f"at {info.samplerate} Hz)", "send a clip with sound in it")
    seconds = info.frames / info.samplerate
    if seconds > limits.max_audio_seconds:
        raise _over(source, f"the audio lasts {seconds:.1f} seconds", "max_audio_seconds", limits, "send a shorter clip")
    return _within_budget(MediaHeader(
        field, "audio", source, fmt, seconds=seconds, channels=info.channels, rate=info.samplerate,
        samples=info.frames, decoded_bytes=info.frames * info.channels * AUDIO_SAMPLE_BYTES), limits)


def _decode_audio(header: MediaHeader, raw: bytes) -> np.ndarray:
    """Mono float32 at 16 kHz: read a block at a time (never more samples than the header declared), each block
    averaged over its channels into one mono array, then resampled."""
    import soundfile

    mono = np.empty(header.samples, np.float32)
    done = 0
    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as f:
            while done < header.samples:
                check_cancelled()
                block = f.read(min(AUDIO_BLOCK, header.samples - done), dtype="float32", always_2d=True)
                if not len(block):
                    break
                np.mean(block, axis=1, dtype=np.float32, out=mono[done:done + len(block)])
                done += len(block)
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise _not_decodable(header.source, "audio", e) from None
    if not done:
        raise RequestError(header.source, "the audio has no decodable samples", "send a clip with sound in it")
    mono = mono[:done]
    rate = header.rate
    if rate != AUDIO_SAMPLING_RATE:
        from scipy.signal import resample_poly  # lazy: scipy only for audio not already at 16 kHz

        check_cancelled()
        g = math.gcd(rate, AUDIO_SAMPLING_RATE)
        mono = resample_poly(mono, AUDIO_SAMPLING_RATE // g, rate // g).astype(np.float32)
    return mono


# -- mp4 ---------------------------------------------------------------------------------------------------------
def _refuse_nested_open(url: str, flags: int, options: dict) -> Any:
    """PyAV's `io_open`: every file or URL a demuxer asks to open besides the bytes it was given is refused."""
    raise PermissionError(f"quantbench opens nothing an mp4 names ({url!r})")


def _open_mp4(field: str, raw: bytes) -> Any:
    import av  # lazy: PyAV (its own FFmpeg, about 100 MB) only when an mp4 arrives

    try:
        return av.open(
            io.BytesIO(raw), mode="r", format="mp4",  # the mp4 demuxer named: no probing by content
            container_options={"protocol_whitelist": "", "enable_drefs": "0", "use_absolute_path": "0"},
            io_open=_refuse_nested_open, timeout=(FFMPEG_TIMEOUT_S, FFMPEG_TIMEOUT_S),
        )
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise _not_decodable(field, "video", e) from None


def _mp4_header(field: str, source: str, raw: bytes, limits: Limits) -> MediaHeader:
    import av

    with _open_mp4(source, raw) as container:
        if not container.streams.video:
            raise RequestError(source, "the mp4 has no video stream", "send an mp4 with a video track")
        stream = container.streams.video[0]
        codec = stream.codec_context.name
        if codec not in VIDEO_CODECS:
            raise RequestError(source, f"the mp4's video is {codec}, not a codec quantbench decodes",
                               "encode it as H.264, HEVC, MPEG-4, VP9 or AV1")
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > limits.max_image_pixels:
            raise _over(source, f"each frame is {width} x {height} = {width * height} pixels", "max_image_pixels",
                        limits, "send a smaller video")
        if width < 1 or height < 1:
            raise RequestError(source, f"the mp4's frames are {width} x {height} pixels", "send a video with pixels")
        # A fragmented mp4 (what browsers' MediaRecorder and `-movflags frag_keyframe` write) has no frame count
        # in its header: its frames are counted from its packets, read without decoding. It was budgeted at the
        # most frames it could hold, and its tokens counted for those: 20 frames refused as over the context.
        count = stream.frames or _count_packets(container, stream, limits.max_video_frames)
        if count > limits.max_video_frames:
            raise _over(source, f"the video has {count} frames", "max_video_frames", limits,
                        "send fewer frames (a shorter clip, or a lower frame rate)")
        seconds = (
            float(stream.duration * stream.time_base) if stream.duration and stream.time_base
            else (container.duration or 0) / av.time_base
        )
        if seconds > limits.max_video_seconds:
            raise _over(source, f"the video lasts {seconds:.1f} seconds", "max_video_seconds", limits,
                        "send a shorter clip")
        rate = float(stream.average_rate) if stream.average_rate else count / seconds if seconds else 0.0
        if not 0 < rate <= MAX_FPS:
            raise RequestError(source, f"the mp4 says its frame rate is {rate:g} per second (from above 0 to "
                               f"{MAX_FPS:g})", "re-encode it with a constant rate")
        frame_bytes = width * height * RGB_BYTES
        frames = max(count, 1)  # none counted: decoding says the mp4 has no decodable frames
        return _within_budget(MediaHeader(field, "video", source, "MP4", width, height, frames, rate, seconds,
                                          decoded_bytes=frames * frame_bytes), limits)


def _count_packets(container: Any, stream: Any, most: int) -> int:
    """The video stream's packets (one a frame), counted by the demuxer alone up to one past `most`."""
    count = 0
    for packet in container.demux(stream):
        count += packet.size > 0  # the demuxer ends with an empty packet
        if count > most:
            break
    return count


def _decode_mp4(header: MediaHeader, raw: bytes) -> np.ndarray:
    """The frames, each written into its place in one [frames, h, w, 3] array sized from the header (np.empty:
    pages never written take no memory). A frame of another size than the header's, or more frames than it
    declared, is refused: the budget was computed from them."""
    import av

    out = np.empty((header.frames, header.height, header.width, RGB_BYTES), np.uint8)
    done = 0
    with _open_mp4(header.source, raw) as container:
        try:
            for frame in container.decode(container.streams.video[0]):
                check_cancelled()
                if done == header.frames:
                    raise RequestError(header.source, f"the mp4 holds more frames than the {header.frames} its "
                                       "header declares", "re-encode it (its header is wrong)")
                if (frame.width, frame.height) != (header.width, header.height):
                    raise RequestError(header.source, f"frame {done} is {frame.width} x {frame.height}, the header "
                                       f"says {header.width} x {header.height}", "send frames of one size")
                out[done] = frame.to_ndarray(format="rgb24")
                done += 1
        except av.error.FFmpegError as e:
            raise _not_decodable(header.source, "video", e) from None
    if not done:
        raise RequestError(header.source, "the mp4 has no decodable frames", "send an mp4 with at least one frame")
    return out[:done]


# -- a list of frames --------------------------------------------------------------------------------------------
def _frames_header(field: str, frames: list[str], fps: float, limits: Limits) -> tuple[MediaHeader, list[tuple]]:
    """The video's header from every frame's image header (all one size); each frame's (field, opened image)."""
    opened: list[tuple] = []
    size = None
    for i, uri in enumerate(frames):  # their count and rate are checked before any is read (check_media_part)
        source = f"{field}.frames[{i}]"
        declared, payload = data_uri_format(source, "image", uri)
        raw = _b64(source, payload, limits)
        header, image = _header(field, "image", source, raw, declared, limits)
        if size is not None and (header.width, header.height) != size:
            raise RequestError(source, f"the frame is {header.width} x {header.height}, the first frame "
                               f"{size[0]} x {size[1]}", "send frames of one size")
        size = (header.width, header.height)
        opened.append((source, image))
    width, height = size or (0, 0)
    header = MediaHeader(field, "video", f"{field}.frames", "frames", width, height, len(frames), fps,
                         len(frames) / fps, decoded_bytes=len(frames) * width * height * RGB_BYTES)
    return _within_budget(header, limits), opened


def _decode_frames(header: MediaHeader, opened: list[tuple]) -> np.ndarray:
    out = np.empty((header.frames, header.height, header.width, RGB_BYTES), np.uint8)
    for i, (source, image) in enumerate(opened):
        check_cancelled()
        out[i] = np.asarray(_decode_image(source, image))
    return out


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
    found = sniff(raw)
    assert found in MEDIA_MIMES[kind].values(), found  # decode_part refused anything else
    return found
