"""Media parts in the decision state (issue #24 parts 4 and 5), without a model: found by shape under any key,
decoded (PNG / JPEG / WebP, WAV / FLAC, mp4, a frames list), and every bad case refused naming the field, with
each limit checked before the part is decoded in full. Media are made here (Pillow, soundfile, PyAV): no blobs."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from quantbench.errors import ConfigError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import LimitError, parse_request
from quantbench.protocol.media import DecodedAudio, DecodedImage, DecodedVideo, decode_media, decode_part
from quantbench.protocol.suite import load_suite

QUESTIONS = {"q": {"type": "boolean"}}


def uri(mime: str, raw: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def image_bytes(fmt: str, size: tuple[int, int] = (8, 6), color: tuple[int, int, int] = (200, 30, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    return buf.getvalue()


def audio_bytes(fmt: str, seconds: float = 0.5, rate: int = 16_000, channels: int = 1) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    wave = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, np.stack([wave] * channels, axis=1), rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def mp4_bytes(n_frames: int, fps: int, size: int = 16, bars: bool = False) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for i in range(n_frames):
            frame = np.zeros((size, size, 3), np.uint8)
            if bars:
                frame[:, (i % 4) * size // 4 : (i % 4 + 1) * size // 4] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def png_30000_squared() -> bytes:
    """A valid 30,000 x 30,000 grayscale PNG of zeros (878 KB, 900 MB of pixels), built in 0.1 s: after a full
    flush deflate compresses each block of 100 zero rows to the same bytes, so one block is compressed and
    repeated; the zlib stream ends with an empty final block and the Adler-32 of n zero bytes, (n mod 65521) << 16
    | 1. (zlib.decompress of it gives the 900 MB back; checked once when this was written, too slow for a test.)"""
    width = height = 30_000
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(b"\0" * ((width + 1) * 100)) + comp.flush(zlib.Z_FULL_FLUSH)
    n = (width + 1) * height
    idat = b"\x78\xda" + block * (height // 100) + b"\x03\x00" + struct.pack(">I", ((n % 65521) << 16) | 1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def refused(part: dict, limits: Limits | None = None, **kw) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode_part("state.camera", part, limits or Limits(), **kw)
    return info.value


# -- found by shape -------------------------------------------------------------------------------------------


def test_parts_are_known_by_shape_under_any_key_and_in_lists():
    png = uri("image/png", image_bytes("PNG"))
    request = parse_request({
        "state": {
            "observation": "a wall",
            "left_eye": {"type": "image", "data": png},
            "views": ["front:", {"type": "image", "data": png}, {"kind": "audio", "note": "not a part: no type"}],
            "image": "a plain string under a media-sounding key is text",
            "weapon": {"type": "sword", "damage": 3},  # no source: an ordinary value
        },
        "questions": QUESTIONS,
    })
    assert request.media_fields() == ["state.left_eye", "state.views[1]"]


def test_text_only_request_has_no_parts():
    request = parse_request({"state": {"observation": "The player is facing a wall."}, "questions": QUESTIONS})
    assert request.media_parts() == []


# -- each format decodes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_images_decode_to_rgb(fmt: str, mime: str):
    decoded = decode_part("state.camera", {"type": "image", "data": uri(mime, image_bytes(fmt))}, Limits())
    assert isinstance(decoded, DecodedImage) and decoded.field == "state.camera"
    assert decoded.image.mode == "RGB" and decoded.image.size == (8, 6)
    pixel = decoded.image.getpixel((3, 3))
    assert all(abs(a - b) <= 3 for a, b in zip(pixel, (200, 30, 10), strict=True))  # JPEG is lossy


@pytest.mark.parametrize(("fmt", "mime"), [("WAV", "audio/wav"), ("FLAC", "audio/flac")])
def test_audio_decodes_to_16khz_mono(fmt: str, mime: str):
    raw = audio_bytes(fmt, seconds=0.5, rate=16_000)
    decoded = decode_part("state.mic", {"type": "audio", "data": uri(mime, raw)}, Limits())
    assert isinstance(decoded, DecodedAudio) and decoded.samples.dtype == np.float32
    assert decoded.seconds == 0.5 and decoded.samples.shape == (8000,) and decoded.sampling_rate == 16_000
    t = np.arange(8000) / 16_000
    assert np.abs(decoded.samples - 0.5 * np.sin(2 * np.pi * 440 * t)).max() < 1e-4


def test_stereo_44k_audio_is_resampled_to_16khz_mono():
    decoded = decode_part("state.mic", {"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 1.0, 44_100, 2))},
                          Limits())
    assert decoded.seconds == 1.0 and decoded.samples.shape == (16_000,)
    t = np.arange(16_000) / 16_000
    middle = slice(1000, 15_000)  # the resampler's filter rings at the ends
    assert np.abs(decoded.samples[middle] - 0.5 * np.sin(2 * np.pi * 440 * t[middle])).max() < 1e-2


def test_mp4_decodes_to_frames_and_rate():
    decoded = decode_part("state.clip", {"type": "video", "data": uri("video/mp4", mp4_bytes(4, 2, 64, bars=True))},
                          Limits())
    assert isinstance(decoded, DecodedVideo) and decoded.fps == 2.0 and decoded.seconds == 2.0
    assert len(decoded.frames) == 4 and decoded.frames[0].shape == (64, 64, 3)
    assert decoded.frames[2][32, 40].min() > 230 and decoded.frames[2][32, 5].max() < 25  # frame 2: bar at x 32-47


def test_frames_list_decodes_with_its_fps():
    frames = [uri("image/png", image_bytes("PNG", (16, 8), (i * 50, 0, 0))) for i in range(3)]
    decoded = decode_part("state.clip", {"type": "video", "frames": frames, "fps": 2}, Limits())
    assert decoded.fps == 2.0 and [int(f[0, 0, 0]) for f in decoded.frames] == [0, 50, 100]
    assert decoded.frames[0].shape == (8, 16, 3)


def test_decode_media_walks_the_state_in_order():
    png = uri("image/png", image_bytes("PNG"))
    state = {"a": "text", "views": [{"type": "image", "data": png}, "x", {"type": "image", "data": png}],
             "mic": {"type": "audio", "data": uri("audio/flac", audio_bytes("FLAC"))}}
    assert [d.field for d in decode_media(state, Limits())] == ["state.views[0]", "state.views[2]", "state.mic"]


# -- bad media, named -----------------------------------------------------------------------------------------


def test_undecodable_bytes_name_the_field():
    err = refused({"type": "image", "data": uri("image/png", b"garbage" * 10)})
    assert err.field == "state.camera.data" and "BytesIO" not in err.problem
    assert err.problem == ("the bytes are not an image quantbench decodes (they do not start with the signature of "
                           "JPEG or PNG or WEBP)")
    err = refused({"type": "image", "data": uri("image/png", b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)})
    assert err.problem == "the bytes are not an image quantbench decodes (Truncated File Read)"
    err = refused({"type": "audio", "data": uri("audio/wav", b"garbage" * 10)})
    assert err.field == "state.camera.data" and err.problem.startswith("the bytes are not an audio quantbench decodes")
    err = refused({"type": "video", "data": uri("video/mp4", b"garbage" * 10)})
    assert err.field == "state.camera.data" and err.problem.startswith("the bytes are not a video quantbench decodes")


def test_bad_base64_is_named():
    err = refused({"type": "image", "data": "data:image/png;base64,@@@notbase64"})
    assert (err.field, err.problem) == ("state.camera.data", "its base64 payload does not decode")


def test_unknown_type_is_refused_naming_type():
    with pytest.raises(RequestError) as info:
        parse_request({"state": {"doc": {"type": "pdf", "data": "data:application/pdf;base64,AAAA"}},
                       "questions": QUESTIONS})
    assert info.value.field == "state.doc.type" and "unknown media type 'pdf'" in str(info.value)
    assert "image, audio or video" in str(info.value)


def test_a_url_or_a_path_in_data_is_never_fetched():
    err = refused({"type": "image", "data": "https://example.com/cat.png"})
    assert err.field == "state.camera.data" and "never fetches URLs" in err.fix


def test_mime_that_lies_about_the_bytes_is_refused():
    err = refused({"type": "image", "data": uri("image/jpeg", image_bytes("PNG"))})
    assert err.field == "state.camera.data" and "says JPEG but the bytes are PNG" in err.problem
    err = refused({"type": "audio", "data": uri("audio/flac", audio_bytes("WAV"))})
    assert "says FLAC but the bytes are WAV" in err.problem
    err = refused({"type": "image", "data": uri("audio/wav", audio_bytes("WAV"))})
    assert err.problem == "mime type audio/wav is not an image format quantbench reads"
    err = refused({"type": "image", "data": uri("image/png", image_bytes("GIF"))})
    assert "the bytes are GIF" in err.problem


def test_decompression_bomb_png_is_refused_from_its_header_fast():
    raw = png_30000_squared()
    assert len(raw) < 1_000_000  # small enough for the 4 MiB body limit: the pixel check must catch it
    t0 = time.perf_counter()
    err = refused({"type": "image", "data": uri("image/png", raw)})
    assert time.perf_counter() - t0 < 2.0
    assert isinstance(err, LimitError) and err.status == 413 and err.flag == "--max-image-pixels"
    assert err.field == "state.camera.data"


def test_pixels_over_the_limit_are_refused_before_decoding():
    err = refused({"type": "image", "data": uri("image/png", image_bytes("PNG", (100, 100)))},
                  Limits(max_image_pixels=9_999))
    assert isinstance(err, LimitError) and err.limit == 9_999
    assert "100 x 100 = 10000 pixels, over the limit of 9999 (--max-image-pixels)" in err.problem


def test_two_hours_of_audio_are_refused_from_the_header():
    import soundfile

    buf = io.BytesIO()
    with soundfile.SoundFile(buf, "w", samplerate=8000, channels=1, format="FLAC", subtype="PCM_16") as f:
        minute = np.zeros(8000 * 60, np.int16)
        for _ in range(120):
            f.write(minute)
    err = refused({"type": "audio", "data": uri("audio/flac", buf.getvalue())})
    assert isinstance(err, LimitError) and err.flag == "--max-audio-seconds" and err.status == 413
    assert "lasts 7200.0 seconds, over the limit of 600" in err.problem


def test_ten_thousand_frame_mp4_is_refused_from_the_stream_header():
    err = refused({"type": "video", "data": uri("video/mp4", mp4_bytes(10_000, 100))}, Limits(max_video_seconds=10**6))
    assert isinstance(err, LimitError) and err.flag == "--max-video-frames"
    assert "has 10000 frames, over the limit of 256" in err.problem


def test_long_mp4_is_refused_by_seconds():
    err = refused({"type": "video", "data": uri("video/mp4", mp4_bytes(8, 2))}, Limits(max_video_seconds=3))
    assert err.flag == "--max-video-seconds" and "lasts 4.0 seconds" in err.problem


def test_frames_list_of_10001_is_refused_before_any_frame_is_decoded():
    frame = uri("image/png", b"never decoded")  # garbage: decoding any would give another error
    data = {"state": {"clip": {"type": "video", "frames": [frame] * 10_001, "fps": 2}}, "questions": QUESTIONS}
    with pytest.raises(LimitError) as info:
        parse_request(data)
    assert info.value.field == "state.clip.frames" and info.value.flag == "--max-video-frames"
    assert "10001 frames" in info.value.problem


def test_frames_of_different_sizes_name_the_frame():
    frames = [uri("image/png", image_bytes("PNG", (16, 8))), uri("image/png", image_bytes("PNG", (8, 8)))]
    with pytest.raises(RequestError) as info:
        decode_part("state.clip", {"type": "video", "frames": frames, "fps": 2}, Limits())
    assert info.value.field == "state.clip.frames[1]" and "frames of one size" in info.value.fix


def test_bytes_over_the_limit_are_refused_before_base64_is_decoded():
    data = {"state": {"cam": [{"type": "image", "data": uri("image/png", b"\0" * 3000)}]}, "questions": QUESTIONS}
    with pytest.raises(LimitError) as info:
        parse_request(data, limits=Limits(max_media_bytes=2048))
    assert info.value.field == "state.cam[0].data" and info.value.flag == "--max-media-bytes"


def test_too_many_parts_are_refused():
    png = {"type": "image", "data": uri("image/png", image_bytes("PNG"))}
    with pytest.raises(LimitError) as info:
        parse_request({"state": {"views": [png] * 3}, "questions": QUESTIONS}, limits=Limits(max_media_parts=2))
    assert info.value.field == "state" and info.value.flag == "--max-media-parts" and info.value.status == 413


@pytest.mark.parametrize(
    ("part", "field", "words"),
    [
        ({"type": "image", "data": "data:image/png;base64,AA", "path": "a.png"}, "state.x", "has both data and path"),
        ({"type": "image", "frames": ["x"], "fps": 2}, "state.x.frames", "an image part has no frames"),
        ({"type": "video", "frames": ["data:image/png;base64,AA"]}, "state.x.fps", "is required with frames"),
        ({"type": "video", "data": "data:video/mp4;base64,AA", "fps": 2}, "state.x.fps", "goes with frames only"),
        ({"type": "video", "frames": ["data:image/png;base64,AA"], "fps": 0}, "state.x.fps", "above 0"),
        ({"type": "video", "frames": ["data:image/png;base64,AA"], "fps": float("inf")}, "state.x.fps", "above 0"),
        ({"type": ["image"], "data": "data:image/png;base64,AA"}, "state.x.type", "unknown media type ['image']"),
        ({"type": "video", "frames": [], "fps": 2}, "state.x.frames", "non-empty list"),
        ({"type": "video", "frames": ["https://x/1.png"], "fps": 2}, "state.x.frames[0]", "must be a data URI"),
        ({"type": "image", "data": "data:image/png,rawbytes"}, "state.x.data", "not a base64 data URI"),
    ],
)
def test_malformed_parts_name_the_field(part: dict, field: str, words: str):
    with pytest.raises(RequestError) as info:
        parse_request({"state": {"x": part}, "questions": QUESTIONS})
    assert info.value.field == field and words in str(info.value)


@pytest.mark.parametrize(("state", "field"), [({"image": "data:image/png;base64,iVBORw0KGgo="}, "state.image"),
                                             ({"clips": ["a", "DATA:video/mp4;base64,AAAA"]}, "state.clips[1]")])
def test_a_media_data_uri_written_as_text_is_refused(state: dict, field: str):
    with pytest.raises(RequestError) as info:
        parse_request({"state": state, "questions": QUESTIONS})
    assert info.value.field == field and "send it as a media part" in info.value.fix


def test_a_request_never_reads_a_path():
    err = refused({"type": "image", "path": "cat.png"})  # no base: a request from the network
    assert err.field == "state.camera.path" and "requests never name local files" in err.problem


# -- suites: path stands for data, inside the suite's folder -------------------------------------------------


def write_suite(folder: Path, part: dict, name: str = "suite.jsonl") -> Path:
    record = {"id": "r1", "benchmark": "media", "request": {"state": {"camera": part}, "questions": QUESTIONS}}
    path = folder / name
    path.write_text(json.dumps(record) + "\n")
    return path


def test_suite_path_reads_the_file_beside_the_suite(tmp_path: Path):
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "frame.png").write_bytes(image_bytes("PNG", (5, 4)))
    suite = load_suite(write_suite(tmp_path, {"type": "image", "path": "media/frame.png"}))
    [decoded] = decode_media(suite.records[0].request.state, Limits(), base=suite.path.parent)
    assert decoded.field == "state.camera" and decoded.image.size == (5, 4)


def test_suite_hash_covers_its_media_files(tmp_path: Path):
    (tmp_path / "f.png").write_bytes(image_bytes("PNG", color=(1, 2, 3)))
    path = write_suite(tmp_path, {"type": "image", "path": "f.png"})
    before = load_suite(path).hash
    (tmp_path / "f.png").write_bytes(image_bytes("PNG", color=(9, 9, 9)))
    assert load_suite(path).hash != before


def test_text_suite_hash_is_the_sha256_of_its_bytes(tmp_path: Path):
    import hashlib

    path = write_suite(tmp_path, "just text")
    assert load_suite(path).hash == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("where", ["../outside.png", "/etc/passwd", "media/../../outside.png"])
def test_suite_path_outside_its_folder_is_refused(tmp_path: Path, where: str):
    inner = tmp_path / "suite"
    inner.mkdir()
    (tmp_path / "outside.png").write_bytes(image_bytes("PNG"))
    with pytest.raises(ConfigError, match=r"suite\.jsonl:1: state\.camera\.path: .*outside the suite's folder"):
        load_suite(write_suite(inner, {"type": "image", "path": where}))


def test_suite_symlink_out_of_its_folder_is_refused(tmp_path: Path):
    inner = tmp_path / "suite"
    inner.mkdir()
    (tmp_path / "secret.png").write_bytes(image_bytes("PNG"))
    os.symlink(tmp_path / "secret.png", inner / "cat.png")
    with pytest.raises(ConfigError, match=r"state\.camera\.path: 'cat\.png' is outside the suite's folder"):
        load_suite(write_suite(inner, {"type": "image", "path": "cat.png"}))


def test_suite_path_to_a_missing_file_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"suite\.jsonl:1: state\.camera\.path: 'nope\.png': no such file"):
        load_suite(write_suite(tmp_path, {"type": "image", "path": "nope.png"}))


def test_suite_media_limits_are_checked_at_load(tmp_path: Path):
    frames = [uri("image/png", b"x")] * 5
    path = write_suite(tmp_path, {"type": "video", "frames": frames, "fps": 2})
    with pytest.raises(ConfigError, match=r"suite\.jsonl:1: state\.camera\.frames: .*--max-video-frames"):
        load_suite(path, limits=Limits(max_video_frames=4))


# -- a run: a text-only model given a suite with media ---------------------------------------------------------


def test_a_text_model_run_on_a_media_suite_fails_naming_the_record_and_field(tmp_path: Path, monkeypatch):
    from quantbench.run.runner import execute
    from quantbench.run.spec import RunSpec

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    (tmp_path / "frame.png").write_bytes(image_bytes("PNG"))
    text = {"id": "t1", "benchmark": "m", "request": {"state": {"observation": "wall"}, "questions": QUESTIONS}}
    media = {"id": "m1", "benchmark": "m",
             "request": {"state": {"views": ["left:", {"type": "image", "path": "frame.png"}]}, "questions": QUESTIONS}}
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps(text) + "\n" + json.dumps(media) + "\n")
    result = execute(RunSpec(backend="tests.tiny:TinyBackend", suite=str(suite), gpu="cpu", warmup=1), echo=False)
    assert (result.run.status, result.run.failure) == ("failed", "config_error")
    assert "record m1: state.views[1]: the model reads text only; it has no image input" in result.run.error
    assert result.answers == []
