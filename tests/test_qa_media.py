"""Media QA: the files real users bring (phone photos, fragmented mp4s, FLACs written to a pipe, suites whose media
fail or whose paths are odd), decoded as transformers' own Qwen3-Omni loaders decode them or refused naming the
place and the fix, never a traceback, a wrong picture or a run that fails after its model loaded. No model here;
every file is made in the test (Pillow, soundfile, PyAV)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from quantbench.errors import ConfigError, RequestError
from quantbench.limits import Limits
from quantbench.protocol.media import decode_part, probe_part
from quantbench.protocol.suite import load_suite
from tests.test_media import audio_bytes, image_bytes, uri

QUESTIONS = {"q": {"type": "boolean"}}
ORIENTATION = 0x0112


def write_suite(folder: Path, *parts: dict) -> Path:
    path = folder / "suite.jsonl"
    lines = [json.dumps({"id": f"r{i}", "benchmark": "m", "request": {"state": {"camera": part}, "questions": QUESTIONS}})
             for i, part in enumerate(parts)]
    path.write_text("\n".join(lines) + "\n")
    return path


def phone_photo(fmt: str, orientation: int) -> bytes:
    """A 6 x 4 picture stored landscape, left half red and right half blue, with an EXIF orientation tag."""
    pixels = np.zeros((4, 6, 3), np.uint8)
    pixels[:, :3] = (255, 0, 0)
    pixels[:, 3:] = (0, 0, 255)
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, exif=exif.tobytes(), **({"quality": 100} if fmt == "JPEG" else {}))
    return buf.getvalue()


# -- images: EXIF orientation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "mime"), [("JPEG", "image/jpeg"), ("PNG", "image/png"), ("WEBP", "image/webp")])
@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_an_exif_rotated_photo_is_decoded_as_transformers_load_image_turns_it(fmt, mime, orientation):
    """The reference is transformers' `load_image` (what Qwen3-Omni's processor loads a data URI or a file with):
    `ImageOps.exif_transpose`, then RGB. quantbench ignored the tag: a portrait phone photo reached the model on
    its side (and its header said the stored size)."""
    from transformers.image_utils import load_image

    raw = phone_photo(fmt, orientation)
    part = {"type": "image", "data": uri(mime, raw)}
    decoded = decode_part("state.camera", part, Limits()).image
    reference = load_image(Image.open(io.BytesIO(raw)))
    assert decoded.size == reference.size == ((4, 6) if orientation in (6, 8) else (6, 4))
    assert np.array_equal(np.asarray(decoded), np.asarray(reference))
    header = probe_part("state.camera", part, Limits())
    assert (header.width, header.height) == decoded.size


def test_frames_of_a_video_list_are_turned_as_shown_too():
    frame = uri("image/jpeg", phone_photo("JPEG", 6))
    part = {"type": "video", "frames": [frame, frame], "fps": 2}
    video = decode_part("state.camera", part, Limits())
    assert video.frames.shape == (2, 6, 4, 3)


# -- video: a fragmented mp4 has no frame count in its header --------------------------------------------------
def fragmented_mp4(n_frames: int, size: int = 32) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", options={"movflags": "frag_keyframe+empty_moov"}) as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(n_frames):
            frame = np.full((size, size, 3), 20 * i % 256, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_a_fragmented_mp4_is_counted_at_its_own_frames_not_the_most_it_could_hold():
    """What browsers' MediaRecorder and `ffmpeg -movflags frag_keyframe` write: no frame count in the stream
    header. It was budgeted (and its tokens counted) at 256 frames: 20 frames of 160 x 128 were refused by the omni
    model as a 1,546-token prompt over its 1,024, while the same video in a plain mp4 ran."""
    part = {"type": "video", "data": uri("video/mp4", fragmented_mp4(20))}
    header = probe_part("state.clip", part, Limits())
    assert header.frames == 20 and header.decoded_bytes == 20 * 32 * 32 * 3
    assert decode_part("state.clip", part, Limits()).frames.shape == (20, 32, 32, 3)
    with pytest.raises(RequestError, match=r"the video has 21 frames.*--max-video-frames"):  # counted up to one over
        probe_part("state.clip", {"type": "video", "data": uri("video/mp4", fragmented_mp4(40))},
                   Limits(max_video_frames=20))


# -- audio: a FLAC written to a pipe has no length in its header ------------------------------------------------
def test_a_flac_of_unknown_length_is_refused_saying_so_not_as_lasting_18_million_years():
    raw = bytearray(audio_bytes("FLAC", seconds=0.5))
    raw[21] &= 0xF0  # STREAMINFO's 36-bit total samples: 0, "unknown" (ffmpeg writing to a pipe leaves it so)
    raw[22:26] = bytes(4)
    with pytest.raises(RequestError) as info:
        probe_part("state.mic", {"type": "audio", "data": uri("audio/flac", bytes(raw))}, Limits())
    assert info.value.field == "state.mic.data"
    assert "does not say how long" in info.value.problem and "--max-audio-seconds" not in str(info.value)


@pytest.mark.parametrize(("fmt", "named"), [("RF64", "RF64"), ("AIFF", "AIFF")])
def test_audio_containers_quantbench_does_not_read_are_named(fmt, named):
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(1600, np.float32), 16_000, format=fmt)
    with pytest.raises(RequestError, match=rf"the bytes are {named}"):
        decode_part("state.mic", {"type": "audio", "data": uri("audio/wav", buf.getvalue())}, Limits())


# -- suites: paths, hashes, and media checked before any model loads -------------------------------------------
@pytest.mark.parametrize("kind", ["nul", "loop", "long"])
def test_a_path_that_cannot_be_resolved_is_refused_naming_the_line_not_a_traceback(tmp_path: Path, kind: str):
    """A NUL in a path was a ValueError traceback from `quantbench run`, a symlink loop a RuntimeError, a name
    over the file system's 255 bytes an OSError."""
    if kind == "loop":
        os.symlink("loop", tmp_path / "loop")
    path = {"nul": "a.png\0", "loop": "loop/a.png", "long": "x" * 300 + ".png"}[kind]
    with pytest.raises(ConfigError, match=r"suite\.jsonl:1: state\.camera\.path: .* cannot be read as a path"):
        load_suite(write_suite(tmp_path, {"type": "image", "path": path}))


def test_one_file_named_by_many_records_is_read_once_and_hashed_as_before(tmp_path: Path, monkeypatch):
    (tmp_path / "f.png").write_bytes(image_bytes("PNG"))
    path = write_suite(tmp_path, *[{"type": "image", "path": "f.png"}] * 5)
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or real(self))
    suite = load_suite(path)
    assert reads.count("f.png") == 1
    file_digest = hashlib.sha256((tmp_path / "f.png").read_bytes()).digest()
    assert suite.hash == hashlib.sha256(path.read_bytes() + file_digest * 5).hexdigest()


def test_a_suite_whose_media_do_not_decode_is_refused_before_any_model_loads(tmp_path: Path):
    """README: every bad part of a suite is refused "before any model loads (`suite.jsonl:7: state.camera.path:
    ...`)". load_suite checked the JSON and that the files exist; a GIF renamed .png, an mp4 with no video track
    failed the run when its record came up, after the model loaded and the records before it ran."""
    from quantbench.run.runner import preflight
    from quantbench.run.spec import RunSpec

    gif = io.BytesIO()
    Image.new("RGB", (4, 4)).save(gif, "GIF")
    (tmp_path / "ok.png").write_bytes(image_bytes("PNG"))
    (tmp_path / "photo.png").write_bytes(gif.getvalue())
    suite = write_suite(tmp_path, {"type": "image", "path": "ok.png"}, {"type": "image", "path": "photo.png"})
    spec = RunSpec(backend="tests.tiny:TinyBackend", suite=str(suite), gpu="cpu")
    with pytest.raises(ConfigError, match=r"suite\.jsonl:2: state\.camera\.path: the bytes are GIF"):
        preflight(spec)
    preflight(spec.model_copy(update={"limit": 1}))  # --limit 1 runs the first record only: nothing to refuse
    over = spec.model_copy(update={"media_limits": {"max_image_pixels": 10}})
    (tmp_path / "photo.png").write_bytes(image_bytes("PNG"))
    with pytest.raises(ConfigError, match=r"suite\.jsonl:1: state\.camera\.path: the image is 8 x 6 .*--max-image-pixels"):
        preflight(over)
