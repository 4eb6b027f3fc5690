"""The server against what an operator gets wrong and a stranger should not learn (QA, third round): a failed load
told to a caller without a key, a NaN or infinite setting (each failed before its fix)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from quantbench.errors import ConfigError, LoadError
from quantbench.server.app import PATH_SHOWN_AS, create_app, without_paths_in_text
from quantbench.server.settings import ServerSettings
from tests.test_server import CARD_BODY, JSON_HEADERS, LOCAL, wait_until

SECRET_PATH = "/home/operator/models/clef-omni-int4/model-00002-of-00004.safetensors"


def _broken():
    raise LoadError(f"[Errno 2] No such file or directory: '{SECRET_PATH}'")


def test_a_failed_load_names_no_server_path_to_a_caller_without_a_key():
    # /healthz hid model_path and every other path from the public, but a failed load's message (and the 503 of a
    # request) said where the operator keeps the model.
    with TestClient(create_app(_broken), base_url=LOCAL) as client:
        wait_until(lambda: client.get("/healthz").json()["status"] == "failed", "the failure to show")
        health = client.get("/healthz")
        assert health.status_code == 503 and "/home/operator" not in health.text
        assert health.json()["error"] == f"LoadError: [Errno 2] No such file or directory: '{PATH_SHOWN_AS}'"
        r = client.post("/v1/systemone", content=CARD_BODY, headers=JSON_HEADERS)
        assert r.status_code == 503 and "/home/operator" not in r.text and "failed to load" in r.text


def test_a_server_with_a_key_tells_its_key_holders_the_whole_message():
    with TestClient(create_app(_broken, api_key="k3y"), base_url=LOCAL, headers={"X-API-Key": "k3y"}) as client:
        wait_until(lambda: client.get("/healthz").json()["status"] == "failed", "the failure to show")
        assert SECRET_PATH in client.get("/healthz").json()["error"]


@pytest.mark.parametrize("text, shown", [
    ("ConfigError: /srv/m/clef: no config.json.", f"ConfigError: {PATH_SHOWN_AS}: no config.json."),
    ("OSError: ~/models/x not found", f"OSError: {PATH_SHOWN_AS} not found"),
    ("OSError: C:\\Users\\me\\model missing", f"OSError: {PATH_SHOWN_AS} missing"),
    ("RuntimeError: 1/2 done, see http://x.org/a/b", "RuntimeError: 1/2 done, see http://x.org/a/b"),
])
def test_paths_in_a_message_are_replaced_and_nothing_else(text, shown):
    assert without_paths_in_text(text) == shown


@pytest.mark.parametrize("name, value, says", [
    ("max_wait_ms", float("nan"), "--max-wait-ms nan: give a finite number, 0 or more"),
    ("max_queue_ms", float("nan"), "--max-queue-ms nan: give a finite number, 0 or more"),
    ("request_timeout_s", float("nan"), "--request-timeout nan: give a positive number"),
])
def test_a_nan_setting_is_refused_by_name(name, value, says):
    # serve --max-wait-ms nan was taken (NaN < 0 is false): the batcher waited NaN ms.
    with pytest.raises(ConfigError, match=says):
        ServerSettings(**{name: value})
