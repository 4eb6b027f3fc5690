"""The server under load: a burst is answered in about N / max_batch forward passes, excess load is refused with
503 + Retry-After before any parsing (a refused request is never tokenized), an admitted request that waits past
--max-queue-ms is refused then, /healthz reports the kernel path of what ran, and `serve` builds the RunSpec that
`run` builds (--shape, --layers, the backend's own options)."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from quantbench.cli import app as cli_app
from quantbench.engine.base import EngineReport
from quantbench.engine.scoring import TransformersEngine
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.server import create_app
from quantbench.server.warm import warm_sizes
from tests.test_server import request_for, wait_until
from tests.tiny import tiny_model, tiny_tokenizer

LOCAL = "http://127.0.0.1"  # the server answers its loopback names only (guard.py); TestClient's default is testserver

WAIT_S = 60.0


class SlowEngine:
    """The tiny model's engine with a fixed forward time (and optionally a slow prepare), counting calls."""

    def __init__(self, inner: TransformersEngine, forward_s: float, prepare_s: float = 0.0):
        self.inner, self.forward_s, self.prepare_s = inner, forward_s, prepare_s
        self.batches: list[int] = []
        self.prepared = 0
        self.fake_report: EngineReport | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prepare(self, request):
        self.prepared += 1
        time.sleep(self.prepare_s)
        return self.inner.prepare(request)

    def forward_many(self, batch):
        # forward_s in all, the tiny model's own forward included: on a loaded CPU that alone took up to ~0.6 s,
        # which on top of a fixed sleep moved the admission test's expected waits across its bound
        t0 = time.perf_counter()
        self.batches.append(len(batch))
        out = self.inner.forward_many(batch)
        time.sleep(max(0.0, self.forward_s - (time.perf_counter() - t0)))
        return out

    def report(self) -> EngineReport:
        return self.fake_report or self.inner.report()


@pytest.fixture(scope="module")
def tiny_engine() -> TransformersEngine:
    return TransformersEngine(tiny_model(), tiny_tokenizer())


def loaded_with(engine) -> LoadedVariant:
    info = VariantInfo(variant="tiny", weight_format="float32", kernel_path="transformers experts=grouped_mm",
                       compute_dtype="float32", model_id="tiny-test", weights="synthetic")
    return LoadedVariant(engine, info, engine.inner.model)


def started(app) -> TestClient:
    client = TestClient(app, base_url=LOCAL)
    client.__enter__()
    wait_until(lambda: client.get("/healthz").status_code == 200, "the model to load")
    return client


def burst(client: TestClient, n: int) -> list:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: client.post("/v1/systemone", json=request_for(i)), range(n)))


def test_a_burst_is_answered_in_about_n_over_max_batch_forward_passes(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=0.3)
    client = started(create_app(lambda: loaded_with(slow), max_batch=8, max_queue=64))
    try:
        rs = burst(client, 24)
    finally:
        client.__exit__(None, None, None)
    assert [r.status_code for r in rs] == [200] * 24, [r.text for r in rs if r.status_code != 200][:2]
    # the first request may go alone (it found the model idle); the other 23 fill batches of 8
    assert len(slow.batches) <= math.ceil(24 / 8) + 1, slow.batches
    assert sum(slow.batches) == 24 and max(slow.batches) == 8


def test_a_closed_loop_of_clients_settles_into_full_batches(tiny_engine, monkeypatch):
    """8 clients each sending their next request as soon as they have an answer: once the first requests are
    answered, every pass holds all 8. Before, a pass left behind the clients it had just answered (they came back
    while the next pass was being collected), and the loop settled into alternating passes (1 and 7, or 3 and 5
    on the H200). The wait for returning clients is scaled up here: this in-process client turns around in
    milliseconds to tens of them on a loaded CPU, the H200's load generator in well under one. The fill wait is
    scaled up with it: a returning client admitted but still being prepared is waited for by the fill wait, which
    the shipped constants keep at least as long as the return wait (CI's loaded runner prepared one for over 20 ms
    and it missed every pass: passes of 7)."""
    from quantbench.server import batcher

    monkeypatch.setattr(batcher, "RETURN_WAIT_MAX_S", 0.25)
    monkeypatch.setattr(batcher, "RETURN_WAIT_SHARE", 0.5)
    monkeypatch.setattr(batcher, "FILL_WAIT_MAX_S", 0.25)
    slow = SlowEngine(tiny_engine, forward_s=0.5)
    client = started(create_app(lambda: loaded_with(slow), max_batch=8, max_queue=64))
    try:
        def loop(c: int) -> list[int]:
            return [client.post("/v1/systemone", json=request_for(c * 10 + i)).status_code for i in range(5)]

        with ThreadPoolExecutor(8) as pool:
            codes = [code for codes in pool.map(loop, range(8)) for code in codes]
    finally:
        client.__exit__(None, None, None)
    assert codes == [200] * 40
    # the first request finds the model idle and goes alone, the other 7 meet in the next pass; from then on, 8
    assert sum(slow.batches) == 40 and slow.batches[2:].count(8) >= 3, slow.batches
    assert 1 not in slow.batches[2:], slow.batches


def test_one_client_never_waits_for_company(tiny_engine, monkeypatch):
    """The wait for returning clients (scaled up as above, 100 ms here) costs one client nothing: the only client
    the last pass answered is the one whose request starts the next."""
    from quantbench.server import batcher

    monkeypatch.setattr(batcher, "RETURN_WAIT_MAX_S", 0.25)
    monkeypatch.setattr(batcher, "RETURN_WAIT_SHARE", 0.5)
    slow = SlowEngine(tiny_engine, forward_s=0.2)
    client = started(create_app(lambda: loaded_with(slow)))
    try:
        rs = [client.post("/v1/systemone", json=request_for(i)) for i in range(5)]
    finally:
        client.__exit__(None, None, None)
    queue_ms = [float(r.headers["server-timing"].split("queue;dur=")[1].split(",")[0]) for r in rs]
    assert slow.batches == [1] * 5 and max(queue_ms) < 50.0, queue_ms


def test_past_the_queue_bound_requests_get_503_with_retry_after_and_are_never_tokenized(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=0.5, prepare_s=0.05)
    client = started(create_app(lambda: loaded_with(slow), max_batch=4, max_queue=4))
    try:
        t0 = time.perf_counter()
        rs = burst(client, 16)
        codes = [r.status_code for r in rs]
        metrics = client.get("/metrics").json()
    finally:
        client.__exit__(None, None, None)
    assert 0 < codes.count(200) and codes.count(503) >= 8, codes
    refused = [r for r in rs if r.status_code == 503]
    assert all(int(r.headers["retry-after"]) >= 1 and "queue is full" in r.json()["detail"] for r in refused)
    # admission comes before parsing: only the admitted requests were prepared (before, every refused one was
    # tokenized first, on the one preparing thread, queued behind the others)
    assert slow.prepared == codes.count(200), (slow.prepared, codes)
    assert metrics["shed"] == {"queue_full": codes.count(503)}
    assert time.perf_counter() - t0 < WAIT_S


def test_an_admitted_request_past_the_queue_deadline_gets_503_and_is_not_computed(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=1.5)
    client = started(create_app(lambda: loaded_with(slow), max_batch=1, max_queue=8, max_queue_ms=300))
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, "/v1/systemone", json=request_for(0))
            wait_until(lambda: slow.prepared == 1, "the first request to be prepared")
            time.sleep(0.1)  # the first is in its forward pass now
            t0 = time.perf_counter()
            second = client.post("/v1/systemone", json=request_for(1))
            waited = time.perf_counter() - t0
            assert first.result(WAIT_S).status_code == 200
        wait_until(lambda: client.get("/metrics").json()["pending"] == 0, "the queue to empty")
        metrics = client.get("/metrics").json()
    finally:
        client.__exit__(None, None, None)
    assert second.status_code == 503, second.text
    assert "--max-queue-ms" in second.json()["detail"] and int(second.headers["retry-after"]) >= 1
    assert waited < 1.3, waited  # refused at its queue deadline, not after the 1.5 s forward pass ahead of it
    assert slow.batches == [1] and metrics["shed"] == {"queue_deadline": 1}


def test_healthz_reports_the_kernel_path_of_what_ran_after_the_first_forward(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=0.0)
    client = started(create_app(lambda: loaded_with(slow)))
    try:
        before = client.get("/healthz").json()
        slow.fake_report = EngineReport(fused_ops="rmsnorm+rope", graphs={"mode": "auto", "captured": [[1, 32]],
                                                                          "replays": 3, "eager_calls": 0,
                                                                          "disabled": None})
        assert client.post("/v1/systemone", json=request_for(0)).status_code == 200
        after = client.get("/healthz").json()
    finally:
        client.__exit__(None, None, None)
    assert before["kernel"] == {"planned": "transformers experts=grouped_mm", "ran": None, "forwards": 0}
    # what run's child would store for the same engine report: the label, the fused ops, the graphs
    assert after["kernel_path"] == "transformers experts=grouped_mm +fused rmsnorm+rope +cuda-graph"
    assert after["kernel"]["ran"] == after["kernel_path"] and after["kernel"]["forwards"] == 1
    assert after["engine"]["fused_ops"] == "rmsnorm+rope" and after["engine"]["cuda_graph"]["replays"] == 3


def test_warm_answers_the_demo_request_before_healthz_says_ok(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=0.0)
    client = started(create_app(lambda: loaded_with(slow), max_batch=8, warm=True))
    try:
        health = client.get("/healthz").json()
        metrics = client.get("/metrics").json()
    finally:
        client.__exit__(None, None, None)
    assert slow.batches == [1]  # on a CPU one pass: no CUDA graphs to capture
    assert health["kernel"]["forwards"] == 1 and health["kernel"]["ran"] == health["kernel_path"]
    assert health["warm_s"] is not None and health["warm_error"] is None
    assert metrics["batches"] == 0 and metrics["answered"] == 0  # warm-up passes are not served requests


def test_on_a_gpu_the_warm_up_covers_each_power_of_two_batch_up_to_max_batch():
    assert warm_sizes(16, cuda=True) == [1, 2, 4, 8, 16]
    assert warm_sizes(12, cuda=True) == [1, 2, 4, 8, 12]
    assert warm_sizes(1, cuda=True) == [1] and warm_sizes(16, cuda=False) == [1]


# -- `quantbench serve` builds run's RunSpec ------------------------------------------------------------------------
class Recorded(Exception):
    pass


def test_serve_passes_shape_layers_seed_and_the_backends_own_options_to_its_load(monkeypatch):
    seen = {}

    class Recorder:
        def load(self, spec, machine):
            seen["spec"] = spec
            raise Recorded

    monkeypatch.setattr("quantbench.server.command.get_backend", lambda name: Recorder())
    result = CliRunner().invoke(cli_app, ["serve", "--backend", "int4", "--shape", "qwen3-30b-a3b", "--layers", "2",
                                          "--seed", "7", "--cuda-graph", "off", "--fused-ops", "off", "--demo"])
    assert isinstance(result.exception, Recorded), result.output
    spec = seen["spec"]
    assert (spec.shape, spec.layers, spec.seed, spec.backend) == ("qwen3-30b-a3b", 2, 7, "int4")
    assert spec.options.cuda_graph == "off" and spec.options.fused_ops == "off" and spec.options.fast_moe is True


@pytest.mark.parametrize("args,text", [
    (["--shape", "qwen3-30b-a3b", "--model", "x"], "--shape serves a synthetic model"),
    (["--shape", "llama-9000"], "--shape 'llama-9000': unknown"),
    (["--layers", "2"], "--layers sets the layer count of a --shape model"),
    (["--nvfp4", "unpacked"], "--nvfp4 is not a setting of backend bf16"),
    (["--endpoint", "http://x"], "No such option: --endpoint"),
    (["--max-queue", "0"], "--max-queue"),
], ids=["shape_and_model", "unknown_shape", "layers_alone", "other_backends_option", "client_option", "max_queue"])
def test_serve_refuses_bad_flags_before_loading(args, text):
    result = CliRunner().invoke(cli_app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert text in " ".join(result.output.split()), result.output


def test_the_serve_flags_default_to_the_servers_defaults():
    # the flags derive from the server's declared settings (quantbench.server.settings); the batcher's defaults are
    # the same names
    import typer

    from quantbench.server import batcher

    command = typer.main.get_command(cli_app).commands["serve"]
    defaults = {p.name: p.default for p in command.get_params(command.make_context("serve", []))}
    assert (defaults["max_batch"], defaults["max_queue"], defaults["max_queue_ms"], defaults["max_wait_ms"]) == (
        batcher.DEFAULT_MAX_BATCH, batcher.DEFAULT_MAX_QUEUE, batcher.DEFAULT_MAX_QUEUE_MS, batcher.DEFAULT_MAX_WAIT_MS)


def test_threads_left_behind_are_none():
    # every TestClient above was closed: no model worker of theirs is still running
    assert not [t for t in threading.enumerate() if t.name.startswith("quantbench-model") and t.is_alive()]


# -- admission by expected wait, Server-Timing, one send a response -------------------------------------------------
def test_a_request_whose_expected_wait_is_over_max_queue_ms_gets_503_at_admission_and_is_never_tokenized(tiny_engine):
    # The forward time the server learns is 1.0 s (SlowEngine's, the tiny model's own forward inside it): one pass
    # ahead stays under 1,500 ms and two passes ahead are always over it.
    slow = SlowEngine(tiny_engine, forward_s=1.0)
    client = started(create_app(lambda: loaded_with(slow), max_batch=1, max_queue=64, max_queue_ms=1500))
    try:
        assert client.post("/v1/systemone", json=request_for(0)).status_code == 200  # the forward time is known
        with ThreadPoolExecutor(6) as pool:
            t0 = time.perf_counter()
            futures = [pool.submit(client.post, "/v1/systemone", json=request_for(i)) for i in range(6)]
            rs = [f.result(WAIT_S) for f in futures]
        metrics = client.get("/metrics").json()
    finally:
        client.__exit__(None, None, None)
    refused = [r for r in rs if r.status_code == 503]
    # one forward pass of >= 1 s each: a request with two or more ahead of it would wait over 1,500 ms
    assert 2 <= len(rs) - len(refused) <= 3 and refused, [r.status_code for r in rs]
    assert all("--max-queue-ms" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1 for r in refused)
    assert metrics["shed"].get("expected_wait") == len(refused) and "queue_deadline" not in metrics["shed"]
    assert slow.prepared == 1 + len(rs) - len(refused)  # refused before parsing and tokenizing
    assert max(r.elapsed.total_seconds() for r in refused) < 0.3 < time.perf_counter() - t0  # refused at once


def test_every_answer_says_where_its_time_went_in_server_timing(tiny_engine):
    slow = SlowEngine(tiny_engine, forward_s=0.05)
    client = started(create_app(lambda: loaded_with(slow)))
    try:
        ok = client.post("/v1/systemone", json=request_for(0))
        bad = client.post("/v1/systemone", json={"state": {}, "questions": {"q": {"type": "choice"}}})
    finally:
        client.__exit__(None, None, None)
    spans = {p.split(";dur=")[0].strip(): float(p.split(";dur=")[1]) for p in ok.headers["server-timing"].split(",")}
    assert list(spans) == ["read", "prepare", "queue", "forward", "app"]
    assert spans["forward"] >= 50.0 and spans["app"] >= spans["read"] + spans["prepare"] + spans["forward"]
    assert spans["forward"] == pytest.approx(ok.json()["model_ms"], abs=0.01)
    assert bad.status_code == 422 and "app;dur=" in bad.headers["server-timing"]


def test_writes_in_one_step_of_the_event_loop_leave_in_one_send_and_close_sends_them_first():
    import asyncio

    from quantbench.server.app import CoalescedWrites

    class Recorder:
        def __init__(self):
            self.writes, self.closed = [], False

        def write(self, data):
            self.writes.append(data)

        def is_closing(self):
            return self.closed

        def close(self):
            self.closed = True

        def get_extra_info(self, name):
            return ("127.0.0.1", 1) if name == "peername" else None

    async def go():
        inner = Recorder()
        t = CoalescedWrites(inner, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"")
        t.write(b"{}")
        assert inner.writes == []  # nothing sent within the step
        await asyncio.sleep(0)
        first = list(inner.writes)
        t.write(b"last")
        t.close()
        return first, inner.writes, inner.closed, t.get_extra_info("peername")

    first, writes, closed, peer = asyncio.run(go())
    assert first == [b"HTTP/1.1 200 OK\r\n\r\n{}"] and writes[-1] == b"last" and closed
    assert peer == ("127.0.0.1", 1)  # everything else is the transport's own


def test_the_expected_wait_counts_the_forward_passes_ahead_rounded_up():
    # 5 requests ahead at 4 a pass are two passes, not one: a partly filled pass still takes a whole forward
    from types import SimpleNamespace

    from quantbench.server.batcher import Metrics, MicroBatcher, QueueFull

    loaded = SimpleNamespace(engine=None, info=SimpleNamespace(model_id="m"))
    b = MicroBatcher(loaded, max_batch=4, max_wait_ms=1, max_queue=64, metrics=Metrics(), max_queue_ms=1500)
    b.forward_s = 1.0
    assert [b.expected_wait_s(n) for n in (0, 1, 4, 5, 8, 9)] == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
    b.pending = 4  # one pass ahead: 1 s, under the 1.5 s bound
    b.admit()
    assert b.pending == 5  # now two passes ahead: 2 s
    with pytest.raises(QueueFull) as refused:
        b.admit()
    assert refused.value.why == "expected_wait" and refused.value.expected_ms == 2000.0 and b.pending == 5


def test_the_shipped_return_wait_never_outlasts_the_fill_wait():
    """A returning client already admitted is waited for by the fill wait (batcher._collect): that holds only while
    the return wait is never the longer of the two, at any forward time."""
    from quantbench.server import batcher

    assert batcher.RETURN_WAIT_MAX_S <= batcher.FILL_WAIT_MAX_S and batcher.RETURN_WAIT_SHARE <= 0.5
