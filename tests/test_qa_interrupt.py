"""QA of interruptions as a user meets them: Ctrl-C, SIGTERM or SIGKILL during `run`, `quantize` and the store's
write, and a store held by another writer. Whatever stops, nothing finished is lost, nothing half-made is used
later, and the next command says what happened."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from quantbench.run import runner
from quantbench.run.runner import execute, stop_on_signals, stop_requested
from tests.test_runner import importable_tests, spec, suite  # noqa: F401 - fixtures

GENEROUS_S = 180  # a loaded 2-core machine: a child's imports alone can take a minute


def _wait_for(predicate, timeout: float = GENEROUS_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _signal_when(predicate, sig: int = signal.SIGTERM) -> threading.Thread:
    """Send `sig` to this process once `predicate()` holds (a thread: the handler runs in the main thread)."""
    def send() -> None:
        if _wait_for(predicate):
            os.kill(os.getpid(), sig)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def _own_result_file() -> bool:
    """Whether this process's run folder holds the child's whole result file."""
    return any(Path(tempfile.gettempdir()).glob(f"{runner.TMP_PREFIX}{os.getpid()}-*/result.json"))


# -- a finished run is never thrown away ---------------------------------------------------------------------
def test_a_stop_signal_after_the_child_wrote_its_result_keeps_the_finished_run(suite):  # noqa: F811
    # The child wrote its whole result, then lingered on its way out (its atexit hook); SIGTERM came then. Before,
    # the parent killed it and stored the run as failed: interrupted, its answers thrown away.
    sender = _signal_when(_own_result_file)
    with stop_on_signals():
        result = execute(spec("LingeringBackend", suite), echo=False)
    sender.join(5)
    assert stop_requested() == signal.SIGTERM
    assert (result.run.status, result.run.failure) == ("ok", None), result.run.error
    assert len(result.answers) == 6 and result.latencies


# -- a stop signal while the parent prepares the model --------------------------------------------------------
def _slow_preparation(monkeypatch, seconds: float = 60.0) -> dict[str, bool]:
    """resolve() replaced by one that takes `seconds`, as training the embedded model or quantizing its variant
    does (minutes); says when it started and whether it ran to its end."""
    seen = {"started": False, "finished": False}

    def preparing(spec):
        seen["started"] = True
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
        seen["finished"] = True
        return spec

    monkeypatch.setattr(runner, "resolve", preparing)
    return seen


def test_a_stop_signal_while_the_model_is_prepared_stops_it_then(suite, monkeypatch):  # noqa: F811
    # Before, Ctrl-C or SIGTERM during the embedded model's training (1 min 44 s on 2 idle cores, over 4 min
    # loaded) was only noted: it trained to the end, and every further Ctrl-C was noted too.
    seen = _slow_preparation(monkeypatch)
    sender = _signal_when(lambda: seen["started"], signal.SIGINT)
    with stop_on_signals():
        result = execute(spec("TinyBackend", suite), echo=False)
    sender.join(5)
    assert not seen["finished"]
    assert (result.run.status, result.run.failure) == ("failed", "interrupted")
    assert "told to stop (SIGINT)" in result.run.error

