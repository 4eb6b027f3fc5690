"""`--backend http` against real `quantbench serve` processes: the same answers as the in-process backend, the
server's identity as provenance, concurrent POSTs, 503 retries, errors that name the fix, a whole run
through the runner into the store, and a suite's `path` media sent inline as data URIs (checked here first; a
text-only server's refusal fails the run naming the record and the field)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn

import backends.http as http_backend
from backends.bf16 import Bf16Backend
from backends.http import HttpBackend, HttpEngine, RemoteError, check_answers
from quantbench.engine.base import EngineBase, Prepared
from quantbench.engine.scoring import TransformersEngine
from quantbench.errors import ConfigError, LoadError, RequestError
from quantbench.limits import Limits
from quantbench.make.fixture import default_model_dir
from quantbench.protocol import LimitError, QuestionAnswer, parse_request
from quantbench.protocol.suite import load_suite
from quantbench.run.backend import LoadedVariant, get_backend
from quantbench.run.machine import detect
from quantbench.run.record import VariantInfo
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.server import create_app
from quantbench.store import Store
from tests.test_media import audio_bytes, image_bytes, uri
from tests.test_server import CARD_BODY, ServerProcess, free_port, request_for
from tests.tiny import tiny_model, tiny_tokenizer

KEY = "k3y"
SUITE_RECORDS = 120  # of the built-in suite's 364: ~1 s in process on 2 cores, a few over loopback


@pytest.fixture(scope="module")
def fixture_dir(request) -> Path:
    try:  # the session-wide trained fixture, when tests/conftest.py provides it
        return Path(request.getfixturevalue("fixture_model_dir"))
    except pytest.FixtureLookupError:
        return default_model_dir(progress=False)


@pytest.fixture(scope="module")
def served(fixture_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """`quantbench serve` of the trained fixture (bf16 backend, float32 for exact comparison), with an API key."""
    server = ServerProcess(fixture_dir, tmp_path_factory.mktemp("served") / "log", key=KEY)
    yield server.wait_ready()
    server.stop()


class ThreadServer:
    """uvicorn serving `app` on a free loopback port from a thread of this process (no second torch import);
    ready once its port is open and, for quantbench's app, its model has loaded (tests/test_load.py serves others)."""

    def __init__(self, app):
        self.port, self.key = free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.quantbench = hasattr(app.state, "qb")

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started or (self.quantbench and httpx.get(self.url + "/healthz").status_code != 200):
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def slow_served() -> Iterator[ThreadServer]:
    """A real uvicorn server whose forward pass takes 0.3 s and whose queue holds 2 requests."""
    model = tiny_model()
    loaded = LoadedVariant(TransformersEngine(model, tiny_tokenizer()), VariantInfo(
        variant="tiny", weight_format="float32", kernel_path="transformers", compute_dtype="float32",
        model_id="tiny-test"), model)
    inner = loaded.engine.forward_many

    def slow(batch):
        time.sleep(0.3)  # a slow model: concurrent requests queue up behind it
        return inner(batch)

    loaded.engine.forward_many = slow
    with ThreadServer(create_app(lambda: loaded, max_queue=2, max_wait_ms=20)) as server:
        yield server


def http_spec(server: ServerProcess | ThreadServer, **over) -> RunSpec:
    return RunSpec(backend="http", endpoint=server.url, api_key=server.key or None, **over)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """On a busy 2-core machine two intra-op threads can run 30x slower than one; answers are the same."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_http_backend_answers_the_default_suite_like_the_in_process_backend(fixture_dir, served):
    records = load_suite(None).records[:SUITE_RECORDS]
    machine = detect()
    local = Bf16Backend().load(RunSpec(backend="bf16", model=str(fixture_dir), dtype="float32", device="cpu"), machine)
    remote = get_backend("http").load(http_spec(served, concurrency=4), machine)
    prepared = [remote.engine.prepare(r.request) for r in records]
    over_http = remote.engine.forward_many(prepared)
    with one_torch_thread():
        local_prepared = [local.engine.prepare(r.request) for r in records]
        local_answers = [local.engine.forward(p) for p in local_prepared]
    for record, p, got, lp, want in zip(records, prepared, over_http, local_prepared, local_answers, strict=True):
        assert got.keys() == want.keys()
        for q in want:
            assert got[q].top == want[q].top, (record.id, q)
            assert list(got[q].probabilities) == list(want[q].probabilities)  # the request's option order
            for opt, prob in want[q].probabilities.items():
                assert abs(got[q].probabilities[opt] - prob) < 1e-4, (record.id, q, opt)
            assert got[q].method == want[q].method
        assert remote.engine.tokens(p) == local.engine.tokens(lp)
        assert p.client_ms > p.server_ms > 0
    remote.engine.close()


def test_load_records_the_servers_identity_as_provenance(fixture_dir, served):
    loaded = HttpBackend().load(http_spec(served, concurrency=2), None)
    health = served.client.get("/healthz").json()
    info = loaded.info
    assert info.variant == "float32" == health["variant"]
    assert info.model_id == health["model"] and info.model_path == str(fixture_dir)
    assert info.kernel_path == "http → transformers experts=grouped_mm, float32 compute" == "http → " + health["kernel_path"]
    assert info.extra["endpoint"] == served.url and info.extra["concurrency"] == 2
    assert info.extra["server_gpu"] == "cpu" and info.extra["server"]["info"]["model_hash"] == info.model_hash
    assert loaded.model is None
    loaded.engine.close()


def test_concurrent_posts_are_in_flight_together_and_the_server_batches_them(slow_served):
    loaded = HttpBackend().load(http_spec(slow_served, concurrency=2), None)
    prepared = [loaded.engine.prepare(parse_request(request_for(i))) for i in range(6)]
    answers = loaded.engine.forward_many(prepared)
    assert len(answers) == 6 and all(a for a in answers)
    # Two requests shared one forward pass: both were in flight at once (one at a time never batches).
    assert max(p.batch for p in prepared) == 2
    assert all(p.client_ms >= 300 for p in prepared)  # each waited for the slow forward, timed end to end
    loaded.engine.close()


def test_a_full_queue_is_waited_out_through_retry_after(slow_served):
    loaded = HttpBackend().load(http_spec(slow_served, concurrency=5), None)
    prepared = [loaded.engine.prepare(parse_request(request_for(i))) for i in range(5)]
    answers = loaded.engine.forward_many(prepared)
    assert len(answers) == 5
    assert sum(p.retries for p in prepared) >= 1  # the queue holds 2: some were told to come back
    retried = max(prepared, key=lambda p: p.retries)
    assert retried.client_ms >= 1000.0  # the wait is part of what the client experienced
    loaded.engine.close()


def test_a_request_the_server_refuses_raises_its_reason(fixture_dir, served):
    limit = json.loads((fixture_dir / "config.json").read_text())["max_position_embeddings"]
    loaded = HttpBackend().load(http_spec(served), None)
    too_long = parse_request({"state": {"text": "the player is facing a wall " * limit},
                              "questions": {"q": {"type": "boolean"}}})
    with pytest.raises(RemoteError, match=f"422.*over the model's limit of {limit}") as e:
        loaded.engine.forward(loaded.engine.prepare(too_long))
    assert e.value.status == 422
    assert isinstance(e.value, RequestError) and e.value.field == "state"  # the server named the field
    loaded.engine.close()


def test_load_errors_name_the_fix(served, monkeypatch):
    with pytest.raises(ConfigError, match="--endpoint"):
        HttpBackend().load(RunSpec(backend="http"), None)
    with pytest.raises(ConfigError, match="http://"):
        HttpBackend().load(RunSpec(backend="http", endpoint="127.0.0.1:8000"), None)
    with pytest.raises(ConfigError, match="--api-key"):
        HttpBackend().load(RunSpec(backend="http", endpoint=served.url, api_key="wrong"), None)
    monkeypatch.setattr(http_backend, "CONNECT_GRACE_S", 0.3)
    with pytest.raises(LoadError, match="no SystemOne server answers"):
        HttpBackend().load(RunSpec(backend="http", endpoint=f"http://127.0.0.1:{free_port()}"), None)


def test_answers_that_do_not_match_the_request_are_refused():
    request = parse_request(CARD_BODY)
    good = QuestionAnswer(top="left", probabilities={"forward": 0.2, "left": 0.5, "right": 0.3}, method="label_logit")
    ordered = check_answers(request, {"action": good})
    assert list(ordered["action"].probabilities) == ["left", "right", "forward"]
    dropped = QuestionAnswer(top="left", probabilities={"left": 0.6, "right": 0.4}, method="label_logit")
    with pytest.raises(RemoteError, match="options"):
        check_answers(request, {"action": dropped})
    with pytest.raises(RemoteError, match="did not answer question 'action'"):
        check_answers(request, {})


def test_a_run_through_the_runner_stores_the_servers_answers_and_client_latencies(served, tmp_path):
    spec = http_spec(served, limit=8, warmup=0, latency_min_decisions=0, latency_min_seconds=0.0)
    result = execute(spec, echo=False)
    assert result.run.status == "ok", result.run.error
    assert result.run.backend == "http" and result.run.variant == "float32"
    assert result.run.extra["endpoint"] == served.url
    assert result.run.tokenizer_hash is None  # the server's token ids are not seen here: not claimed
    assert len({a.record_id for a in result.answers}) == 8
    assert all(lat.model_ms > 0 and lat.tokens > 0 for lat in result.latencies)
    store = Store(tmp_path / "results.duckdb")
    store.write_run(result)
    stored = store.read("SELECT backend, variant, n_timed FROM run_summary")
    assert stored.iloc[0].tolist() == ["http", "float32", 8]


def test_a_kept_alive_connection_the_server_closed_is_asked_again_once():
    """uvicorn closes an idle keep-alive connection after 5 s; a POST that went out on it as it closed gets no
    answer (RemoteProtocolError). The decision is asked again on a new connection, once; a second one fails."""
    request = parse_request(CARD_BODY)
    answer = {"model": "m", "model_ms": 1.0, "tokens": 9, "answers": {"action": {"top": "left", "method": "label_logit",
                                                   "probabilities": {"left": 0.5, "right": 0.3, "forward": 0.2}}}}
    calls = []

    def closing(times):
        def handler(req):
            calls.append(req)
            if len(calls) <= times:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=req)
            return httpx.Response(200, json=answer)
        return handler

    engine = HttpEngine("http://127.0.0.1:1", httpx.Client(transport=httpx.MockTransport(closing(1))))
    prepared = engine.prepare(request)
    assert engine.forward(prepared)["action"].top == "left"
    assert (len(calls), prepared.retries) == (2, 1)
    calls.clear()
    engine = HttpEngine("http://127.0.0.1:1", httpx.Client(transport=httpx.MockTransport(closing(2))))
    with pytest.raises(RemoteError, match="RemoteProtocolError"):
        engine.forward(engine.prepare(request))
    assert len(calls) == 2


# -- a suite's media: sent inline ----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class _Seen(Prepared):
    request: object


class CapturingEngine(EngineBase):
    """A served engine that reads images and audio, keeps the state of every request the server prepared (after the
    server's own media checks), and answers each question with its first option."""

    modalities = frozenset({"image", "audio"})
    device = "cpu"

    def __init__(self):
        self.states: list[dict] = []

    def prepare(self, request):
        self.states.append(request.state)
        return _Seen(request=request, rows=[[1, 2, 3]])

    def forward_many(self, batch):
        return [{name: QuestionAnswer(top=q.options[0], probabilities={o: 1 / len(q.options) for o in q.options},
                                      method="label_logit") for name, q in p.request.questions.items()} for p in batch]

    def forward(self, prepared):
        return self.forward_many([prepared])[0]

    def tokens(self, prepared):
        return 3


def media_suite(folder: Path, records: list[tuple[str, dict]]) -> Path:
    """A suite of boolean questions on the given states, in `folder` (media files beside it)."""
    suite = folder / "suite.jsonl"
    suite.write_text("".join(json.dumps({"id": rid, "benchmark": "media", "request": {
        "state": state, "questions": {"q": {"type": "boolean"}}}}) + "\n" for rid, state in records))
    return suite


def test_a_suites_path_media_arrive_at_the_server_as_data_uris(tmp_path):
    (tmp_path / "media").mkdir()
    png, jpeg, wav = image_bytes("PNG"), image_bytes("JPEG"), audio_bytes("WAV")
    (tmp_path / "media" / "frame.png").write_bytes(png)
    (tmp_path / "media" / "photo.png").write_bytes(jpeg)  # named .png, JPEG inside: the bytes decide the mime type
    (tmp_path / "media" / "clip.wav").write_bytes(wav)
    state = {"observation": "a door", "camera": {"type": "image", "path": "media/frame.png"},
             "views": ["left:", {"type": "image", "path": "media/photo.png"}],
             "mic": {"type": "audio", "path": "media/clip.wav"}}
    suite = media_suite(tmp_path, [("m1", state)])
    engine = CapturingEngine()
    loaded = LoadedVariant(engine, VariantInfo(variant="media", weight_format="bf16", kernel_path="test",
                                               compute_dtype="bf16", model_id="media-test"))
    with ThreadServer(create_app(lambda: loaded)) as server:
        remote = HttpBackend().load(RunSpec(backend="http", endpoint=server.url, suite=str(suite)), None)
        record = load_suite(suite).records[0]
        answers = remote.engine.forward(remote.engine.prepare(record.request))
        remote.engine.close()
    assert answers["q"].top == "yes"
    assert engine.states == [{"observation": "a door", "camera": {"type": "image", "data": uri("image/png", png)},
                              "views": ["left:", {"type": "image", "data": uri("image/jpeg", jpeg)}],
                              "mic": {"type": "audio", "data": uri("audio/wav", wav)}}]
    assert record.request.state == state  # the suite's record itself is left as it was


def test_suite_media_are_checked_as_a_local_run_checks_them_before_anything_is_sent(tmp_path):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "frame.png").write_bytes(image_bytes("PNG", size=(64, 64)))
    (tmp_path / "suite" / "broken.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "outside.png").write_bytes(image_bytes("PNG"))
    posts = []
    client = httpx.Client(transport=httpx.MockTransport(lambda req: posts.append(req) or httpx.Response(500)))
    engine = HttpEngine("http://127.0.0.1:1", client, media_base=tmp_path / "suite", limits=Limits(max_media_bytes=100))

    def refused(path: str) -> RequestError:
        request = parse_request({"state": {"camera": {"type": "image", "path": path}}, "questions": {"q": {"type": "boolean"}}})
        with pytest.raises(RequestError) as e:
            engine.prepare(request)
        return e.value

    big = refused("frame.png")
    assert isinstance(big, LimitError) and big.field == "state.camera.path" and big.flag == "--max-media-bytes"
    assert "is outside the suite's folder" in str(refused("../outside.png"))
    assert str(refused("broken.png")).startswith("state.camera.path: the bytes are not an image quantbench decodes")
    no_base = HttpEngine("http://127.0.0.1:1", client)  # no suite file: a path names nothing to read
    with pytest.raises(RequestError, match="state.camera.path: a path is read only from a suite file"):
        no_base.prepare(parse_request({"state": {"camera": {"type": "image", "path": "frame.png"}},
                                       "questions": {"q": {"type": "boolean"}}}))
    assert posts == []


def test_a_text_only_server_refusing_suite_media_fails_the_run_naming_the_record_and_field(served, tmp_path):
    (tmp_path / "frame.png").write_bytes(image_bytes("PNG"))
    suite = media_suite(tmp_path, [("t1", {"observation": "a wall"}),
                                   ("m1", {"observation": "a door", "camera": {"type": "image", "path": "frame.png"}})])
    result = execute(http_spec(served, suite=str(suite), warmup=0, latency_min_decisions=0, latency_min_seconds=0.0),
                     echo=False)
    assert (result.run.status, result.run.failure) == ("failed", "config_error")
    assert result.run.error.splitlines()[0] == (
        f"RequestError: record m1: state.camera: POST {served.url}/v1/systemone answered 422: the served model reads "
        "text only; it has no image input (send a state without it (describe it in words), or use a server whose "
        "model has that input)")
    assert result.answers == []
