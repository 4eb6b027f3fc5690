"""Media in /v1/systemone (issue #24 part 5): a text-only model refuses media naming the field; the server never
reads a local path or fetches a URL named in a request; bad media is a 422 and media over a limit a 413 naming
the field and the flag; the server keeps serving after each. In process through `TestClient`, with the tiny text
model and, for the decoding checks, the same engine declaring that it reads media (`engine.modalities`)."""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from quantbench.engine.scoring import TransformersEngine
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.server import create_app
from tests.tiny import tiny_model, tiny_tokenizer

LOCAL = "http://127.0.0.1"  # the server answers its loopback names only (guard.py); TestClient's default is testserver

JSON_HEADERS = {"Content-Type": "application/json"}
QUESTIONS = {"q": {"type": "boolean"}}
CARD = {"state": {"observation": "The player is facing a wall."}, "questions": QUESTIONS}
WAIT_S = 60.0


def png(size: tuple[int, int] = (8, 8)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class ReadsMedia:
    """The tiny engine, declaring the media types it reads (what an omni engine declares)."""

    modalities = frozenset({"image", "audio", "video"})

    def __init__(self, inner: TransformersEngine):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def tiny() -> LoadedVariant:
    model = tiny_model()
    info = VariantInfo(
        variant="bf16", weight_format="float32", kernel_path="transformers experts=grouped_mm",
        compute_dtype="float32", model_id="tiny-test", weights="synthetic",
    )
    return LoadedVariant(TransformersEngine(model, tiny_tokenizer()), info, model)


def client_for(loaded: LoadedVariant, **kw) -> TestClient:
    client = TestClient(create_app(lambda: loaded, **kw), base_url=LOCAL)
    client.__enter__()
    deadline = time.monotonic() + WAIT_S
    while client.get("/healthz").status_code != 200:
        assert time.monotonic() < deadline, "the model never loaded"
        time.sleep(0.02)
    return client


@pytest.fixture(scope="module")
def text_server(tiny):
    client = client_for(tiny)
    yield client
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def media_server(tiny):
    reading = LoadedVariant(ReadsMedia(tiny.engine), tiny.info, tiny.model)
    client = client_for(reading, media_limits={"max_image_pixels": 10_000, "max_video_frames": 8})
    yield client
    client.__exit__(None, None, None)


def post(client: TestClient, state: dict) -> tuple[int, dict]:
    r = client.post("/v1/systemone", content=json.dumps({"state": state, "questions": QUESTIONS}),
                    headers=JSON_HEADERS)
    return r.status_code, r.json()


def test_text_model_given_media_names_the_field(text_server):
    status, err = post(text_server, {"observation": "a door", "views": ["left:", {"type": "image", "data": png()}]})
    assert status == 422 and err["field"] == "state.views[1]"
    assert err["detail"] == "state.views[1]: the served model reads text only; it has no image input"
    assert post(text_server, CARD["state"])[0] == 200  # and the next request is served


def test_server_never_reads_a_path(text_server, media_server):
    for client in (text_server, media_server):
        status, err = post(client, {"camera": {"type": "image", "path": "/etc/passwd"}})
        assert status == 422 and err["field"] == "state.camera.path", err
        assert "never reads local files" in err["detail"] and '"data"' in err["fix"]


def test_server_never_fetches_a_url(media_server):
    status, err = post(media_server, {"camera": {"type": "image", "data": "http://169.254.169.254/latest"}})
    assert status == 422 and err["field"] == "state.camera.data" and "never fetches URLs" in err["fix"]


@pytest.mark.parametrize(
    ("part", "status", "field", "words"),
    [
        ({"type": "image", "data": "data:image/png;base64," + base64.b64encode(b"junk" * 8).decode()}, 422,
         "state.cam.data", "not an image quantbench decodes"),
        ({"type": "image", "data": png((200, 200))}, 413, "state.cam.data", "over the limit of 10000 (--max-image-pixels)"),
        ({"type": "video", "frames": [png()] * 9, "fps": 2}, 413, "state.cam.frames", "--max-video-frames"),
        ({"type": "hologram", "data": png()}, 422, "state.cam.type", "unknown media type 'hologram'"),
        ({"type": "audio", "data": png()}, 422, "state.cam.data", "mime type image/png is not an audio format"),
    ],
)
def test_bad_media_gets_4xx_naming_the_field_and_flag(media_server, part, status, field, words):
    got, err = post(media_server, {"cam": part})
    assert (got, err["field"]) == (status, field), err
    assert words in err["detail"]
    if status == 413:
        assert err["limit"] in (10_000, 8)


def test_healthz_shows_the_media_limits(media_server):
    limits = media_server.get("/healthz").json()["limits"]
    assert limits["max_image_pixels"] == 10_000 and limits["max_video_frames"] == 8
    assert limits["max_media_bytes"] == 16 << 20 and limits["max_audio_seconds"] == 600


def test_serve_takes_the_media_limits_as_flags_and_refuses_a_bad_one():
    """`quantbench serve --max-…` reaches the limits: a bad value is refused before anything loads, naming the flag."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    for flag in ("--max-media-parts", "--max-media-bytes", "--max-image-pixels", "--max-audio-seconds",
                 "--max-video-frames", "--max-video-seconds", "--max-part-decoded-bytes",
                 "--max-request-decoded-bytes"):
        for command in ("serve", "run"):
            out = CliRunner().invoke(app, [command, flag, "0"])
            assert out.exit_code == 2 and f"{flag} 0: give 1 or more" in out.output, (command, flag, out.output)
