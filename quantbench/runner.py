"""Run one variant in a fresh child process and turn what it reports into one run's rows.

`execute(spec) -> RunResult` writes nothing: the caller (the CLI, a sweep driver) hands the result to the store.
Whatever happens to the child — an exception, an out-of-memory kill, a segfault, a hang past the timeout — the
result is a whole run: `ok` with every answer, or `failed` with the reason and the traceback.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import quantbench
from quantbench.backend import RunSpec
from quantbench.machine import Machine, check_gpu, detect
from quantbench.store import RunResult, uuid7

# The settings that decide what a run measures; sweeps skip a run whose hash is already stored.
RESULT_KEYS = ("backend", "model", "suite", "dtype", "experts_impl", "fast_moe", "nvfp4_mode", "nvfp4_activations",
               "endpoint", "concurrency", "shape", "layers", "role", "max_tokens", "truncate", "method", "limit", "seed")
TAIL_BYTES = 16_000


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _git_rev() -> str | None:
    root = Path(quantbench.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def provenance() -> dict[str, Any]:
    return {
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "auto_round_version": _version("auto-round"),
        "modelopt_version": _version("nvidia-modelopt"),
        "quantbench_version": quantbench.__version__,
        "quantbench_git_rev": _git_rev(),
    }


def spec_hash(spec: RunSpec, machine: Machine) -> str:
    key = {k: getattr(spec, k) for k in RESULT_KEYS}
    key["gpu"] = machine.gpu_name or f"cpu:{machine.host}"
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stored_spec(spec: RunSpec) -> dict[str, Any]:
    """The spec as stored on the row: everything but secrets."""
    data = spec.to_dict()
    if data.get("api_key"):
        data["api_key"] = "***"
    return data


def _pump(stream, sink, tail: deque[bytes]) -> None:
    """Echo the child's stderr live (progress bars) and keep its tail for a failed run's row."""
    for chunk in iter(lambda: stream.read1(4096), b""):
        tail.append(chunk)
        while sum(len(c) for c in tail) > TAIL_BYTES and len(tail) > 1:
            tail.popleft()
        if sink is not None:
            sink.write(chunk)
            sink.flush()


def execute(spec: RunSpec, *, machine: Machine | None = None, echo: bool = True,
            env: dict[str, str] | None = None) -> RunResult:
    """Run `spec` in a fresh child process; return its rows. Raises GpuMismatchError before spawning anything.

    `env` adds to the child's environment (a sweep gives each GPU's child its own CUDA_VISIBLE_DEVICES)."""
    machine = machine or detect()
    device = check_gpu(spec.gpu, machine)
    spec.device = spec.device or device
    run_id, created = str(uuid7()), dt.datetime.now(dt.UTC)

    with tempfile.TemporaryDirectory(prefix="quantbench-run-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec.to_dict()))
        env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        if echo and sys.stderr.isatty():
            env["QUANTBENCH_TTY"] = "1"
        proc = subprocess.Popen(
            [sys.executable, "-m", "quantbench.child", str(spec_path), str(result_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # its own process group: a timeout kills the child and anything it started
        )
        tail: deque[bytes] = deque()
        sink = getattr(sys.stderr, "buffer", None) if echo else None
        pump = threading.Thread(target=_pump, args=(proc.stdout, sink, tail), daemon=True)
        pump.start()
        timed_out = False
        try:
            proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:  # Ctrl-C: the child has its own session, so it must be stopped by hand
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        pump.join(timeout=5)
        out = json.loads(result_path.read_text()) if result_path.exists() else None
        crash_trace = result_path.with_suffix(".faulthandler")
        crash_text = crash_trace.read_text() if crash_trace.exists() else ""

    stderr_tail = b"".join(tail).decode(errors="replace")
    if timed_out:
        out = {"run": (out or {}).get("run", {}), "status": "failed", "failure": "timeout",
               "error": f"the run exceeded its timeout of {spec.timeout_s:g} s and was killed\n\n{stderr_tail}"}
    elif out is None:
        code = proc.returncode
        how = f"killed by signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit status {code}"
        # SIGKILL with no result is what the kernel's OOM killer does; say so, but it stays a guess.
        failure = "oom" if code == -signal.SIGKILL else "crashed"
        out = {"run": {}, "status": "failed", "failure": failure,
               "error": f"the child process died ({how}) before reporting\n\n{crash_text}\n{stderr_tail}".strip()}

    row: dict[str, Any] = {**machine.as_row(), **provenance(), **out.get("run", {})}
    row.update(
        run_id=run_id, created_at=created, finished_at=dt.datetime.now(dt.UTC), status=out["status"],
        failure=out.get("failure"), error=out.get("error"), backend=spec.backend, role=spec.role,
        gpu_requested=spec.gpu, spec=stored_spec(spec), spec_hash=spec_hash(spec, machine),
    )
    row["device"] = row.get("device") or spec.device
    if out["status"] != "ok":
        return RunResult(run=row)
    return RunResult(run=row, answers=out["answers"], latencies=out["latencies"])
