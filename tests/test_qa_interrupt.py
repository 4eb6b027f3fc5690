"""QA of interruptions as a user meets them: Ctrl-C, SIGTERM or SIGKILL during `run`, `quantize` and the store's
write, and a store held by another writer. Whatever stops, nothing finished is lost, nothing half-made is used
later, and the next command says what happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from quantbench.models.checkpoint import PROVENANCE_FILE
from quantbench.run import runner
from quantbench.run.runner import execute, stop_on_signals, stop_requested
from tests.test_quantize_hostile import source  # noqa: F401 - a fixture
from tests.test_runner import ROOT, importable_tests, spec, suite  # noqa: F401 - fixtures

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


# -- quantize: a variant is whole or absent ------------------------------------------------------------------
# `quantize --overwrite` in a process that the library's step kills with SIGKILL (as the OOM killer, `kill -9` or
# a scheduler's hard stop would) after it has written a loadable checkpoint, before the checks and provenance.
KILLED_MID_QUANTIZE = """
import os, shutil, signal, sys
from pathlib import Path
from quantbench.make import quantize
from quantbench.make.quantize import autoround

def killed(source, out, recipe, **kw):
    shutil.copytree(source, out, dirs_exist_ok=True)  # config.json and whole safetensors: what `run` loads
    os.kill(os.getpid(), signal.SIGKILL)

autoround.quantize_autoround = killed
quantize.quantize(sys.argv[1], "int4", sys.argv[2], overwrite=True, nsamples=4, seqlen=32)
"""


def test_a_quantization_killed_half_way_leaves_the_old_variant_and_nothing_loadable(source, tmp_path):  # noqa: F811
    # Before, quantize wrote into --out itself (and --overwrite removed the old variant first): a SIGKILL or
    # SIGTERM left --out a checkpoint without provenance or checks, which `run --model` loaded as the variant.
    from quantbench.make.quantize import quantize

    out = tmp_path / "v"
    quantize(source, "int4", out, nsamples=4, seqlen=32)
    made = (out / PROVENANCE_FILE).read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_QUANTIZE, str(source), str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            timeout=GENEROUS_S)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / PROVENANCE_FILE).read_bytes() == made  # the old variant, whole
    left = list(tmp_path.glob(".v.partial-*"))
    assert len(left) == 1  # the killed process's own folder, beside --out
    quantize(source, "int4", out, nsamples=4, seqlen=32, overwrite=True)  # the next one replaces it
    assert (out / PROVENANCE_FILE).is_file() and not left[0].exists()


# -- a store another process holds ---------------------------------------------------------------------------
HOLDER = """
import duckdb, os, sys, time
con = duckdb.connect(sys.argv[1])  # a writer: a merge, another run, a script
print(os.getpid(), flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""


def test_a_write_waiting_for_another_processs_lock_says_who_holds_it(tmp_path, monkeypatch):
    # Before, `run` waited up to a minute for the store's lock in silence, after its progress bars had ended.
    import io

    from quantbench.run.record import RunResult
    from quantbench.store import Store
    from tests.test_store import run_row

    db, release = tmp_path / "r.duckdb", tmp_path / "release"
    Store(db).write_run(RunResult(run=run_row()))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(release)], stdout=subprocess.PIPE, text=True)
    try:
        holder_pid = holder.stdout.readline().strip()
        monkeypatch.setattr("quantbench.store.LOCK_SAY_S", 0.0)  # said at once: no wait to time
        monkeypatch.setattr(sys, "stderr", said := io.StringIO())
        writer = threading.Thread(target=Store(db).write_run, args=(RunResult(run=run_row()),), daemon=True)
        writer.start()
        assert _wait_for(lambda: "waiting for" in said.getvalue(), 50), said.getvalue()
    finally:
        release.touch()
        holder.wait(GENEROUS_S)
    writer.join(GENEROUS_S)
    assert f"waiting for {db}: process {holder_pid} holds it (waited 0 s of up to 60 s)" in said.getvalue()
    assert len(Store(db).read("SELECT run_id FROM runs")) == 2  # then it wrote, once the holder let go


# -- the child's result file ---------------------------------------------------------------------------------
def test_a_result_its_run_folder_cannot_hold_goes_to_the_cache_and_the_parent_reads_it(tmp_path, monkeypatch):
    # Before, a full temporary disk at the end of a run lost it: the child's OSError traceback, and a row saying it
    # "died (exit status 1) before reporting", its answers gone.
    from quantbench.run.child import write_result

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "quantbench-run-1-x"
    folder.write_text("")  # not a folder: no file can be made in it, as on a full or read-only disk
    result_path = folder / "result.json"
    assert write_result('{"status": "ok"}', result_path)
    kept = tmp_path / "cache" / "results" / "quantbench-run-1-x.json"
    assert kept.is_file()
    assert runner._read_result(result_path) == {"status": "ok"}
    assert not kept.exists()  # read once, then removed


def test_a_result_nothing_can_hold_is_said_where_it_was_tried(tmp_path, monkeypatch, capsys):
    from quantbench.run.child import write_result

    (tmp_path / "cache").write_text("")  # the cache is a file too
    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "run").write_text("")
    assert not write_result("{}", tmp_path / "run" / "result.json")
    said = " ".join(capsys.readouterr().err.split())
    assert said.count("cannot write the run's result to") == 2
