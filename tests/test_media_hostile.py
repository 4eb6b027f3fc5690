"""Issue #33, items 1, 2, 8 and 9 on the decoders themselves (no model): the bytes never steer the decoder (an SDP
description and an ffconcat list labelled video/mp4 bind no socket and open no file), the decode bombs are refused
from their headers with the process's peak memory bounded, media are held once, parts that say they are media are
media or refused naming the field, and malformed media are a RequestError naming the field, never a crash."""

from __future__ import annotations

import fractions
import io
import socket
import time

import numpy as np
import pytest

from quantbench.errors import RequestError
from quantbench.limits import Limits
from quantbench.protocol import LimitError, parse_request
from quantbench.protocol.media import DecodedVideo, decode_part, probe_media, sniff
from tests.hostile_media import (
    ffconcat,
    fifo_marker,
    flac_of_silence,
    mp4_repeating,
    peak_rss,
    peak_rss_reset,
    sdp,
    watching_udp,
)
from tests.test_media import audio_bytes, image_bytes, mp4_bytes, uri

QUESTIONS = {"q": {"type": "boolean"}}
MiB = 1 << 20


def refused(part: dict, limits: Limits | None = None) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode_part("state.clip", part, limits or Limits())
    return info.value


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


# -- item 1: the bytes never steer the decoder ----------------------------------------------------------------
def test_an_sdp_payload_labelled_mp4_binds_no_socket_and_is_refused_at_once():
    port = free_udp_port()
    with watching_udp({port, port + 1}) as bound:  # RTP on the port, RTCP on the next
        t0 = time.perf_counter()
        err = refused({"type": "video", "data": uri("video/mp4", sdp(port))})
        seconds = time.perf_counter() - t0
    assert bound == set(), f"a decoder bound UDP port(s) {bound} named by the request"
    assert seconds < 1.0  # FFmpeg's probing waited 10 s for RTP packets
    assert err.field == "state.clip.data" and "do not start with the signature of MP4" in err.problem
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", port))  # still free


def test_an_ffconcat_payload_opens_no_file_and_says_the_same_whether_the_file_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the list names a file relative to the working folder, as the server's was
    with fifo_marker(tmp_path / "marker") as opened:
        present = refused({"type": "video", "data": uri("video/mp4", ffconcat("marker"))})
        time.sleep(0.05)
        assert not opened.is_set(), "a decoder opened the file an ffconcat list in the request named"
    absent = refused({"type": "video", "data": uri("video/mp4", ffconcat("no-such-file"))})
    assert present.field == absent.field == "state.clip.data"
    assert present.problem == absent.problem  # no oracle for the server's files


def test_each_format_is_read_only_by_its_own_decoder():
    assert [sniff(b) for b in (image_bytes("PNG"), image_bytes("JPEG"), image_bytes("WEBP"), audio_bytes("WAV"),
                               audio_bytes("FLAC"), mp4_bytes(2, 2))] == ["PNG", "JPEG", "WEBP", "WAV", "FLAC", "MP4"]
    assert sniff(sdp(5004)) is None and sniff(ffconcat("x")) is None and sniff(b"%!PS-Adobe-3.0 EPSF") is None
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"  # Pillow would hand this to Ghostscript
    with pytest.raises(RequestError, match="do not start with the signature of JPEG or PNG or WEBP"):
        decode_part("state.cam", {"type": "image", "data": uri("image/png", eps)}, Limits())


def test_an_mp4_that_names_an_unread_codec_is_refused_naming_it():
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg2video", rate=2)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")):
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    err = refused({"type": "video", "data": uri("video/mp4", buf.getvalue())})
    assert "mpeg2video, not a codec quantbench decodes" in err.problem and err.field == "state.clip.data"


# -- item 2: the decode bombs, refused from their headers, memory bounded --------------------------------------
def test_the_mp4_bomb_is_refused_from_its_header_with_memory_bounded():
    raw = mp4_repeating(256, 4096)  # 256 black 4096^2 frames: inside every per-dimension limit
    assert len(raw) < 100_000
    peak_rss_reset()
    before = peak_rss()
    t0 = time.perf_counter()
    err = refused({"type": "video", "data": uri("video/mp4", raw)})
    seconds, grew = time.perf_counter() - t0, peak_rss() - before
    assert isinstance(err, LimitError) and err.status == 413 and err.flag == "--max-part-decoded-bytes"
    assert err.field == "state.clip.data" and "256 frames of 4096 x 4096 pixels" in err.problem
    assert seconds < 2.0 and grew < 64 * MiB, (seconds, grew)  # 12.9 GB if decoded: the old decoder took 8 GB+


def test_the_flac_bomb_is_refused_from_its_header_with_memory_bounded():
    raw = flac_of_silence()  # 8 channels at 655,350 Hz for 480 s
    assert len(raw) < 200_000
    peak_rss_reset()
    before = peak_rss()
    t0 = time.perf_counter()
    err = refused({"type": "audio", "data": uri("audio/flac", raw)})
    seconds, grew = time.perf_counter() - t0, peak_rss() - before
    assert isinstance(err, LimitError) and err.flag == "--max-part-decoded-bytes" and err.status == 413
    assert "314568000 samples x 8 channels x 4 bytes" in err.problem
    assert seconds < 2.0 and grew < 64 * MiB, (seconds, grew)  # the old decoder reached 9.6 GB


def test_the_request_budget_adds_the_parts_before_any_is_decoded():
    clip = {"type": "video", "data": uri("video/mp4", mp4_repeating(8, 256))}  # 1.5 MiB decoded each
    state = {"a": clip, "b": clip, "c": clip}
    with pytest.raises(LimitError) as info:
        probe_media(state, Limits(max_request_decoded_bytes=4 * MiB))
    assert info.value.field == "state" and info.value.flag == "--max-request-decoded-bytes"
    assert "state.a 1.5 MiB, state.b 1.5 MiB, state.c 1.5 MiB" in info.value.problem
    assert len(probe_media(state, Limits(max_request_decoded_bytes=5 * MiB))) == 3


def test_a_header_that_lies_is_caught_while_decoding():
    """A stream whose frames are bigger than its header says: the budget was computed from the header, so the
    decoder refuses the first frame of another size rather than writing it."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mjpeg", rate=2)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuvj420p"
        for i, size in enumerate((16, 64)):  # mjpeg keeps each frame's own size in its bytes
            enc = av.CodecContext.create("mjpeg", "w")
            enc.width = enc.height = size
            enc.pix_fmt, enc.time_base = "yuvj420p", fractions.Fraction(1, 2)
            frame = av.VideoFrame.from_ndarray(np.zeros((size, size, 3), np.uint8), format="rgb24").reformat(
                format="yuvj420p")
            frame.pts = i
            for packet in [*enc.encode(frame), *enc.encode(None)]:
                packet.stream, packet.time_base, packet.pts, packet.dts = stream, fractions.Fraction(1, 2), i, i
                out.mux(packet)
    err = refused({"type": "video", "data": uri("video/mp4", buf.getvalue())})
    assert err.field == "state.clip.data" and "frame 1 is 64 x 64, the header says 16 x 16" in err.problem


def test_a_decoded_video_is_one_array_held_once():
    from quantbench.models.families.qwen3_omni.media_batch import video_array

    video = decode_part("state.clip", {"type": "video", "data": uri("video/mp4", mp4_bytes(6, 2, 32))}, Limits())
    assert isinstance(video, DecodedVideo) and isinstance(video.frames, np.ndarray)
    assert video.frames.shape == (6, 32, 32, 3) and video.frames.dtype == np.uint8
    assert video_array(video) is video.frames  # the engine takes it as it is: no stacked copy
    frames = [uri("image/png", image_bytes("PNG", (8, 4), (i, 0, 0))) for i in range(3)]
    listed = decode_part("state.clip", {"type": "video", "frames": frames, "fps": 2}, Limits())
    assert isinstance(listed.frames, np.ndarray) and listed.frames[:, 0, 0, 0].tolist() == [0, 1, 2]


# -- item 8: a part that says it is media is media, or refused naming the field -------------------------------
@pytest.mark.parametrize(("state", "field", "words"), [
    ({"cam": {"type": "image", "url": "http://169.254.169.254/latest"}}, "state.cam.url", "not a field of a media"),
    ({"cam": {"type": "image", "data": "data:image/png;base64,AAAA", "alt": "a cat"}}, "state.cam.alt",
     "not a field of a media"),
    ({"cam": {"type": "audio"}}, "state.cam", "has no bytes"),
    ({"views": ["left", {"type": "video", "href": "file:///etc/passwd"}]}, "state.views[1].href", "not a field"),
    ({"scene": {"camera": {"type": "image", "data": "data:image/png;base64,AAAA"}}}, "state.scene.camera",
     "nested inside another value"),
    ({"views": [[{"type": "image", "data": "data:image/png;base64,AAAA"}]]}, "state.views[0][0]", "nested inside"),
    ({"cam": {"type": " Image ", "url": "x"}}, "state.cam.url", "not a field of a media"),
])
def test_a_part_that_says_it_is_media_is_media_or_refused_naming_the_field(state, field, words):
    with pytest.raises(RequestError) as info:
        parse_request({"state": state, "questions": QUESTIONS})
    assert info.value.field == field and words in info.value.problem, str(info.value)


def test_objects_of_other_types_stay_ordinary_values():
    request = parse_request({"state": {"weapon": {"type": "sword", "url": "x"}, "deep": {"a": [{"type": "text"}]}},
                             "questions": QUESTIONS})
    assert request.media_parts() == []


# -- item 9: malformed media are a RequestError naming the field --------------------------------------------
def test_a_wav_with_no_samples_is_refused_naming_the_field():
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros((0, 1), np.float32), 16_000, format="WAV", subtype="PCM_16")
    err = refused({"type": "audio", "data": uri("audio/wav", buf.getvalue())})
    assert err.field == "state.clip.data" and "the audio has no samples" in err.problem


@pytest.mark.parametrize(("fps", "words"), [(1e-300, "last 2e+300 seconds, over the limit of 600"),
                                             (1e308, "at most 1000"), (0, "above 0"), (float("nan"), "above 0")])
def test_a_frame_rate_out_of_bounds_is_refused_naming_fps(fps, words):
    frame = uri("image/png", image_bytes("PNG"))
    with pytest.raises(RequestError) as info:
        parse_request({"state": {"clip": {"type": "video", "frames": [frame, frame], "fps": fps}},
                       "questions": QUESTIONS})
    assert info.value.field == "state.clip.fps" and words in info.value.problem, str(info.value)


def test_whatever_else_a_decoder_raises_on_its_bytes_is_a_request_error_naming_them(monkeypatch):
    """Pillow's plugins raise EOFError or IndexError on some corrupt files, outside the errors each decoder call
    names: the part's bytes do not decode (a 4xx naming them), never an exception out of the request."""
    from PIL import ImageFile

    def broken(self):
        raise EOFError("a plugin read past the end")

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken)
    err = refused({"type": "image", "data": uri("image/png", image_bytes("PNG"))})
    assert err.field == "state.clip.data" and "(a plugin read past the end)" in err.problem
