"""The server against hostile and sloppy clients (QA): each test is a request that once got a wrong answer, a
useless error or an amplified one. In process through TestClient with the tiny model (a second or two in all)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from quantbench.engine.scoring import TransformersEngine
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.server import create_app
from tests.tiny import tiny_model, tiny_tokenizer

LOCAL = "http://127.0.0.1"
JSON = {"Content-Type": "application/json"}
KEY = "s3cret"
WAIT_S = 60.0


def loaded() -> LoadedVariant:
    model = tiny_model()
    info = VariantInfo(variant="bf16", weight_format="float32", kernel_path="transformers", compute_dtype="float32",
                       model_id="tiny-qa", weights="synthetic")
    return LoadedVariant(TransformersEngine(model, tiny_tokenizer()), info, model)


def started(**settings) -> TestClient:
    client = TestClient(create_app(loaded, **settings), base_url=LOCAL)
    client.__enter__()
    deadline = time.monotonic() + WAIT_S
    while client.get("/healthz", headers={"X-API-Key": KEY}).status_code != 200:
        assert time.monotonic() < deadline, "the model never loaded"
        time.sleep(0.02)
    return client


@pytest.fixture(scope="module")
def server() -> Iterator[TestClient]:
    client = started()
    yield client
    client.__exit__(None, None, None)


def request(state: dict | None = None, criteria: dict | None = None) -> dict:
    return {"state": state or {"o": "a wall"},
            "questions": {"a": {"type": "choice", "criteria": criteria or {"l": "Left", "r": "Right"}}}}


def post(client: TestClient, body: dict | bytes, headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/v1/systemone", content=content, headers=headers or JSON)


def test_a_long_state_with_no_late_space_is_refused_from_its_prefix(server):
    # The prefix was cut back to its last space, the one after "o:", so it counted ~2 tokens and the whole 300 KB
    # value was tokenized (a 3 MB one held a preparing thread 7.7 s) before the engine refused it.
    for value in ["x" * 300_000, "\u4e2d" * 100_000]:
        r = post(server, request(state={"o": value}))
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "state" and r.json()["detail"].startswith("state: its first"), r.text
    assert post(server, request()).status_code == 200


def test_an_error_never_echoes_a_huge_key_whole(server):
    # A 500 KB option key was quoted whole in `detail` and again in `field`: a 1 MB error for a 0.5 MB request.
    huge = "a\u200b" + "q" * 500_000
    r = post(server, request(criteria={huge: "A", "b": "B"}))
    assert r.status_code == 422 and len(r.content) < 8_000, len(r.content)
    error = r.json()
    assert error["field"] == "questions.a.criteria" and "U+200B" in error["detail"] and "left out" in error["detail"]
    r = post(server, {**request(), "q" * 500_000: 1})  # an unknown field named in `field` and `detail`
    assert r.status_code == 422 and len(r.content) < 8_000 and "left out" in r.json()["field"]


def test_a_duplicate_json_key_is_named_by_its_path(server):
    body = b'{"state": {"o": "x"}, "questions": {"a": {"type": "choice", "criteria": {"l": "L", "l": "R"}}}}'
    r = post(server, body)
    assert r.status_code == 422 and r.json()["field"] == "questions.a.criteria.l", r.text
    r = post(server, b'{"state": {"views": [1, {"k": 1, "k": 2}]}, "questions": {"a": {"type": "boolean"}}}')
    assert r.status_code == 422 and r.json()["field"] == "state.views[1].k", r.text
    r = post(server, b'{"state": {"o": 1}, "state": {"o": 2}, "questions": {"a": {"type": "boolean"}}}')
    assert r.status_code == 422 and r.json()["field"] == "state", r.text


def test_a_wrong_method_or_path_says_what_to_send(server):
    for method in ("GET", "PUT", "OPTIONS", "DELETE"):
        r = server.request(method, "/v1/systemone")
        assert r.status_code == 405 and r.headers["allow"] == "POST", (method, r.text)
        assert r.json()["field"] == "method" and "POST /v1/systemone" in r.json()["fix"], r.text
    for path in ("/v1/systemone%00", "/v2/systemone", "/v1/systemone/../healthz"):
        r = server.post(path, content=json.dumps(request()), headers=JSON)
        assert r.status_code == 404 and r.json()["field"] == "path" and "/v1/systemone" in r.json()["fix"], r.text


def test_an_api_key_header_sent_twice_is_refused_whatever_the_order():
    # The last header won: a wrong key then the right one was let in, the right one then a wrong one was not.
    client = started(api_key=KEY)
    try:
        right, wrong = ("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer nope")
        assert post(client, request(), headers=[*JSON.items(), right]).status_code == 200
        for headers in ([wrong, right], [right, wrong], [right, right],
                        [("X-API-Key", "nope"), ("X-API-Key", KEY)]):
            r = post(client, request(), headers=[*JSON.items(), *headers])
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["field"] in ("Authorization", "X-API-Key") and "once" in r.json()["detail"], r.text
    finally:
        client.__exit__(None, None, None)


def test_a_question_over_the_context_is_refused_from_its_prefix(server):
    # Only the state was bounded: a 300 KB option label (or question name) was tokenized whole first.
    r = post(server, request(criteria={"l": "x" * 300_000, "r": "Right"}))
    assert r.status_code == 422 and r.json()["field"] == "questions.a", r.text
    assert r.json()["detail"].startswith("questions.a: its first"), r.text
    r = post(server, {"state": {"o": "x"}, "questions": {"q" * 300_000: {"type": "boolean"}}})
    assert r.status_code == 422 and "its first" in r.json()["detail"] and len(r.content) < 8_000, r.text[:300]
