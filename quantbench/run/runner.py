"""Run one variant in a fresh child process and turn what it reports into one run's rows.

`execute(spec) -> RunResult` writes nothing: the caller (the CLI, a sweep driver) hands the result to the store.
Whatever happens to the child — an exception, an out-of-memory kill, a segfault, a hang past the timeout, this
process told to stop — the result is a whole run: `ok` with every answer, or `failed` with the reason and the
traceback. What can be checked without a model (paths, the suite, checkpoint headers, a state far over the
model's context) is checked here, before anything is spawned, and raises instead of making a failed run. A run
that ends without its child's result keeps what was known of it (the child's saved progress, the suite and model
this process knew), so its row lands in its model's table.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import quantbench
from quantbench.errors import ConfigError, QuantbenchError, classify
from quantbench.models import hub, scorer
from quantbench.paths import remove_dead_folders
from quantbench.run.backend import get_backend
from quantbench.run.checks import check_state_lengths
from quantbench.run.machine import Machine, check_gpu, detect
from quantbench.run.record import (
    MachineFacts,
    Measured,
    Provenance,
    RunIdentity,
    RunRecord,
    RunResult,
    SuiteFacts,
    progress_file,
    result_files,
    uuid7,
)
from quantbench.run.resolve import resolve
from quantbench.run.settings import refusal
from quantbench.run.spec import RunSpec, is_remote

if TYPE_CHECKING:
    from quantbench.protocol.suite import Suite

# The settings that decide what a run measures; sweeps skip a run whose hash is already stored. Frozen (read from
# the flat spec) so every stored row keeps its hash; a backend option declared `hashed` joins the hash only when it
# differs from its default (RunSpec.options.hashed_changes), so cuda_graph = "off" is another configuration.
RESULT_KEYS = ("backend", "model", "suite", "dtype", "experts_impl", "fast_moe", "nvfp4_mode", "nvfp4_activations",
               "endpoint", "concurrency", "shape", "layers", "role", "max_tokens", "truncate", "method", "limit", "seed")
TAIL_BYTES = 16_000
TMP_PREFIX = "quantbench-run-"
POLL_S = 0.2  # how often a waiting parent looks at its stop flag and the timeout
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


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
    flat = spec.flat()
    key = {k: flat[k] for k in RESULT_KEYS}
    key.update({k: v for k, v in spec.options.hashed_changes().items() if k not in RESULT_KEYS})
    key["gpu"] = machine.gpu_name or f"cpu:{machine.host}"
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stored_spec(spec: RunSpec) -> dict[str, Any]:
    """The spec as stored on the row (the flat layout): everything but secrets."""
    return {**spec.flat(), **spec.options.stored()}


def _pump(stream, sink, tail: deque[bytes]) -> None:
    """Echo the child's stderr live (progress bars) and keep its tail for a failed run's row."""
    for chunk in iter(lambda: stream.read1(4096), b""):
        tail.append(chunk)
        while sum(len(c) for c in tail) > TAIL_BYTES and len(tail) > 1:
            tail.popleft()
        if sink is not None:
            sink.write(chunk)
            sink.flush()


# -- checks before spawning -----------------------------------------------------------------------------------
_warned: set[str] = set()


def preflight(spec: RunSpec) -> dict[str, Any]:
    """Check in this process, in well under a second, what would otherwise fail only after the child has imported
    torch: --model is a checkpoint directory (or a hub id whose snapshot is in the Hugging Face cache) with a
    readable config.json and whole safetensors files, --suite parses. Raises ConfigError / LoadError naming the
    flag or file and the fix. Returns notes for the run's `extra` (an `auto_map` that was not followed, the hub
    repo and commit a hub id resolved to)."""
    return _preflight(spec)[0]


def _preflight(spec: RunSpec) -> tuple[dict[str, Any], Suite | None]:
    """preflight's notes, and the --suite it loaded (None: the built-in suite, not loaded)."""
    notes: dict[str, Any] = {}
    suite = None
    if spec.model and not spec.shape and not is_remote(spec.backend):  # a remote backend reads no --model
        from quantbench.models.checkpoint import (
            check_safetensors_only,
            check_tokenizer_json,
            read_config,
            refuse_code_only_architecture,
        )
        from quantbench.models.families import family_of

        root = Path(spec.model)
        if hub.is_hub_id(spec.model):
            snapshot = hub.resolve(spec.model)
            root, notes["hub"] = snapshot.path, snapshot.note()
        elif held := hub.snapshot_of(root):  # a hub cache snapshot given as a directory (a sweep's hub id)
            notes["hub"] = {"repo_id": held[0], "commit": held[1], "path": str(root.absolute())}
        if not root.exists():
            raise ConfigError(f"--model {spec.model}: no such directory; give a checkpoint directory "
                              "(config.json + *.safetensors), a hub id org/name[@revision], or omit --model for "
                              "the embedded default model")
        if not root.is_dir():
            raise ConfigError(f"--model {spec.model}: a file, not a directory; give the checkpoint's directory "
                              "(config.json + *.safetensors)")
        config = read_config(root)
        family_of(config).check_config(root, config)  # a config its family cannot load, before any model is built
        check_safetensors_only(root)
        check_tokenizer_json(root)
        scorer.require_trust(scorer.describe(root, config), spec.trust_remote_code)  # its own scorer's code
        auto_map = config.get("auto_map")
        if auto_map and not spec.trust_remote_code:
            # an architecture that exists only as the checkpoint's code has no built-in to load instead: the
            # warning below claimed one, then the child failed
            refuse_code_only_architecture(root, config, "; pass --trust-remote-code to run it (it runs that code)")
            builtin = ", ".join(config.get("architectures") or []) or config.get("model_type") or "?"
            notes["auto_map_ignored"] = {"auto_map": auto_map, "loaded": builtin}
        if notes.get("auto_map_ignored") and str(root.resolve()) not in _warned:  # once per checkpoint
            _warned.add(str(root.resolve()))
            print(f"warning: {root / 'config.json'} names its own code (auto_map) but --trust-remote-code is off: "
                  f"loading transformers' built-in {builtin} instead (recorded on the run)", file=sys.stderr)
    if spec.suite is not None:
        from quantbench.protocol.suite import check_suite_media

        suite = _suite_of(spec)
        check_suite_media(suite, spec.limits(), spec.limit)  # before any model loads, as the README promises
    if why := refusal("timeout_s", spec.timeout_s):  # a spec that check_spec did not see (sweep, API)
        raise ConfigError(why)
    return notes, suite


_last_suite: tuple[tuple, Suite] | None = None  # (the file's state and the read's bounds, what was read)


def _suite_of(spec: RunSpec) -> Suite:
    """spec's --suite, validated as far as the run reads it (its first --limit records: a bad record past them does
    not stop the run; a full run refuses it). Read once while the file is unchanged: `run` checks it before its
    runs and each run checks it again before its child (every run of --repeat N, every run of a local sweep): a
    300,000-record suite was parsed N + 1 times here, ~25 s and 1.2 GB each, besides the child's own read. Media
    files are rehashed by the child, which records the run's suite hash."""
    from quantbench.protocol.suite import load_suite

    global _last_suite
    if spec.suite is None:  # the built-in suite: small
        return load_suite(None, limits=spec.limits(), limit=spec.limit)
    path = Path(spec.suite)
    try:
        st = path.stat()
    except OSError:  # no such file: load_suite says so, with the fix
        return load_suite(spec.suite, limits=spec.limits(), limit=spec.limit)
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, spec.limits(), spec.limit)
    if _last_suite is None or _last_suite[0] != key:
        _last_suite = None  # the old one freed before the new one is read
        _last_suite = (key, load_suite(spec.suite, limits=spec.limits(), limit=spec.limit))
    return _last_suite[1]


# -- stopping: this process told to stop, the kernel's OOM killer ---------------------------------------------
class _StopState:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.installed = False
        self.live = 0  # children running under execute() now
        self.writing = 0  # runs being written to the store now (finishing_write)
        self.preparing = False  # the main thread is in resolve() (training or quantizing: minutes, no child to kill)
        self.lock = threading.Lock()


class _StoppedWhilePreparing(BaseException):  # noqa: N818 - not an error: what a stop signal raises in resolve()
    """Raised by a stop signal in the main thread while it prepares the model (`_preparing`), as Ctrl-C raises
    KeyboardInterrupt: a BaseException, so no `except Exception` of the training or quantizing code swallows it."""


_stop = _StopState()


def stop_requested() -> int | None:
    """The signal that asked this process to stop during the last `stop_on_signals`, or None."""
    return _stop.signum


def stopping() -> bool:
    """Inside `stop_on_signals`, after a stop signal: runs in flight are ending, no new one may start."""
    return _stop.installed and _stop.signum is not None


def _on_stop_signal(signum: int, frame: Any) -> None:
    first = _stop.signum is None
    _stop.signum = _stop.signum or signum
    if _stop.preparing:  # training or quantizing in this thread: stop it now, not minutes later (_resolve_in_parent)
        raise _StoppedWhilePreparing
    # No run to wind up: stop now, as the signal's default would; unless a finished run is being written, which
    # the first signal lets finish (under a second) and a second one interrupts.
    if _stop.live == 0 and (_stop.writing == 0 or not first):
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def finishing_write() -> Iterator[None]:
    """While inside (a run's rows going into the store), a stop signal does not interrupt the write: it is
    recorded (stop_requested) and the write finishes; a second signal interrupts it, and the store keeps the run
    in a side file, saying which signal stopped it. A SIGTERM that arrived during the final write used to cut it
    and report only "(143)"."""
    _stop.writing += 1
    try:
        yield
    finally:
        _stop.writing -= 1


@contextlib.contextmanager
def runs_elsewhere() -> Iterator[None]:
    """While inside, runs are in flight outside this process (a Ray sweep's tasks): a stop signal is recorded
    (`stopping()`) instead of exiting at once, so the caller can end them and store them as interrupted."""
    with _stop.lock:
        _stop.live += 1
    try:
        yield
    finally:
        with _stop.lock:
            _stop.live -= 1


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM, SIGHUP and SIGINT (what `timeout`, a scheduler, a closed terminal, Ctrl-C send) stop
    the runs in flight instead of killing this process outright: each run's child is killed and execute() returns
    the run as `failed: interrupted`, for the caller to store before it exits with 128 + the signal. With no run
    in flight the process exits at once. Main thread only (elsewhere, and when nested, it does nothing)."""
    if threading.current_thread() is not threading.main_thread() or _stop.installed:
        yield
        return
    previous = {s: signal.signal(s, _on_stop_signal) for s in STOP_SIGNALS}
    _stop.installed, _stop.signum = True, None
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stop.installed = False


def _stop_message(signum: int) -> str:
    return f"quantbench was told to stop ({signal.Signals(signum).name}) and killed the run before it finished"


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (v2 memory.events, v1 memory.oom_control),
    or None where neither can be read. The child runs in the same cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    v1 = next((line.split(":", 2)[2] for line in lines if ":memory:" in line), None)
    candidates = []
    if v2 is not None:
        candidates += [Path("/sys/fs/cgroup") / v2.lstrip("/") / "memory.events", Path("/sys/fs/cgroup/memory.events")]
    if v1 is not None:
        candidates += [Path("/sys/fs/cgroup/memory") / v1.lstrip("/") / "memory.oom_control",
                       Path("/sys/fs/cgroup/memory/memory.oom_control")]
    for file in candidates:
        try:
            match = re.search(r"^oom_kill (\d+)$", file.read_text(), re.M)
        except OSError:
            continue
        if match:
            return int(match.group(1))
    return None


def death_failure(code: int, oom_before: int | None, oom_after: int | None) -> tuple[str, str]:
    """(failure, explanation) of a child that died without a result. A SIGKILL is `oom` only with evidence: the
    cgroup's OOM-kill counter rose while it ran. Otherwise `killed` (someone or something else sent it)."""
    if code >= 0:
        return "crashed", f"exit status {code}"
    how = f"killed by signal {-code} ({signal.Signals(-code).name})"
    if code != -signal.SIGKILL:
        return "crashed", how
    if oom_before is not None and oom_after is not None and oom_after > oom_before:
        return "oom", f"{how} by the kernel's OOM killer (the memory cgroup's oom_kill count went {oom_before} → {oom_after})"
    evidence = ("no OOM kill was recorded in the memory cgroup" if oom_before is not None
                else "the memory cgroup's OOM-kill count cannot be read here")
    return "killed", f"{how} from outside quantbench; {evidence}, so it is not labelled oom"


def _clear_orphaned_tmp() -> None:
    """Remove run folders left by parents that were killed (SIGKILL leaves no chance to clean up)."""
    remove_dead_folders(Path(tempfile.gettempdir()), TMP_PREFIX)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _resolve_in_parent(spec: RunSpec) -> tuple[RunSpec, dict[str, Any] | None]:
    """`resolve(spec)` (training or quantizing the embedded model can take minutes) counted as a run in flight,
    so a stop signal meanwhile ends this run as interrupted instead of exiting before its row is stored. Returns
    the spec for the child, or the failed result (classified as a child's failure would be) and no child."""
    with _stop.lock:
        _stop.live += 1
    try:
        with _preparing():
            resolved = resolve(spec)
    except _StoppedWhilePreparing:
        return spec, _interrupted_row()
    except Exception as exc:  # a failed row, never a lost run; KeyboardInterrupt still propagates
        if stopping():  # Ctrl-C reached the quantizing child too, which failed of it: stopped, not crashed
            return spec, _interrupted_row()
        return spec, {"run": {}, "status": "failed", "failure": classify(exc),
                      "error": f"{type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))}
    finally:
        with _stop.lock:
            _stop.live -= 1
    if stopping():  # the resolved spec all the same: its model is known, and the failed row names it
        return resolved, _interrupted_row()
    return resolved, None


@contextlib.contextmanager
def _preparing() -> Iterator[None]:
    """While inside, a stop signal raises _StoppedWhilePreparing in the main thread: before, a Ctrl-C or SIGTERM
    during the embedded model's training (minutes) or its variant's quantization was only noted, and every further
    Ctrl-C too, until the model was ready. Only where the signal handler runs (the main thread, under
    stop_on_signals); a sweep's worker thread still finishes preparing first."""
    if not _stop.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    if stopping():  # a signal that came before: no handler would raise it again
        raise _StoppedWhilePreparing
    _stop.preparing = True
    try:
        yield
    finally:
        _stop.preparing = False


def _interrupted_row() -> dict[str, Any]:
    return {"run": {}, "status": "failed", "failure": "interrupted",
            "error": _stop_message(_stop.signum or signal.SIGTERM)}


def _read_result(result_path: Path) -> dict[str, Any] | None:
    """The child's whole result, from its run folder or, where that disk was full, the cache (removed once read);
    None if it wrote none."""
    for path in result_files(result_path):
        if path.exists():
            out = json.loads(path.read_text())
            if path != result_path:
                path.unlink(missing_ok=True)
            return out
    return None


def _read_progress(result_path: Path) -> dict[str, Any]:
    """What a child that never wrote its result had saved of its run (quantbench.run.child.save_progress): {} if
    nothing, or nothing readable."""
    try:
        saved = json.loads(progress_file(result_path).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _model_columns(spec: RunSpec) -> dict[str, Any]:
    """The model columns of a run whose child never said them (it failed or was killed before its model loaded),
    as the local backends fill them (quantbench.models.checkpoint.model_identity of the directory they load; a
    synthetic shape's id), so the failed row lands in its model's table. {} for a remote backend: its server names
    the model, and it was never asked."""
    if is_remote(spec.backend):
        return {}
    if spec.shape:
        from quantbench.models.families import synthetic_shapes  # read without torch

        shape = synthetic_shapes().get(spec.shape)
        if shape is None:
            return {}
        # quantbench.models.synthetic.synthetic_id, which imports torch (tests/test_suite_faults.py holds them equal)
        layers = spec.layers if spec.layers is not None else shape["num_hidden_layers"]
        return {"model_id": f"synthetic-{spec.shape}-{layers}l-seed{spec.seed}", "model_hash": f"seed:{spec.seed}",
                "weights": "synthetic"}
    if not spec.model or not Path(spec.model).is_dir():
        return {}
    from quantbench.models.checkpoint import model_identity

    try:
        ident = model_identity(spec.model)  # a content hash: seconds for a checkpoint near 2 GiB, only on failure
    except Exception:  # a checkpoint odd enough to fail its load may fail this too: the failed row is kept anyway
        return {}
    ident.pop("source_model_hash", None)
    return ident


def _what_the_parent_knew(record: RunRecord, spec: RunSpec, child_spec: RunSpec, suite: Suite | None) -> RunRecord:
    """The row of a failed run, with what this process knew before the child started filled in where the child
    never said it: the suite (id, hash, counts) and the model (id, path, hash). A run killed by a stop signal, a
    timeout or a crash, or whose child reported a load error, was stored with them NULL, and the report listed it
    among the runs that "failed before their model or suite was known". What only loading says (the variant, its
    kernel) stays NULL unless the child saved it (quantbench.run.child.save_progress)."""
    known: dict[str, Any] = {}
    if record.suite_hash is None:
        try:
            suite = suite or _suite_of(spec)
        except (QuantbenchError, OSError):
            suite = None
        if suite is not None:
            known.update(SuiteFacts.of(suite, spec.limit).model_dump())
    if record.model_id is None:
        known.update(_model_columns(child_spec))
    known = {k: v for k, v in known.items() if getattr(record, k) is None}
    return record.model_copy(update=known) if known else record


def _without_result(spec: RunSpec, ended: str | None, saved: dict[str, Any], code: int, oom_before: int | None,
                    crash_text: str, stderr_tail: str) -> dict[str, Any]:
    """The failed result of a child that wrote none: timed out or stopped by this process, or died on its own."""
    if ended == "timeout":
        return {"run": saved, "status": "failed", "failure": "timeout",
                "error": f"the run exceeded its timeout of {spec.timeout_s:g} s and was killed\n\n{stderr_tail}"}
    if ended == "interrupted":
        return {"run": saved, "status": "failed", "failure": "interrupted",
                "error": f"{_stop_message(_stop.signum or signal.SIGTERM)}\n\n{stderr_tail}".strip()}
    failure, how = death_failure(code, oom_before, oom_kill_count())
    return {"run": saved, "status": "failed", "failure": failure,
            "error": f"the child process died ({how}) before reporting\n\n{crash_text}\n{stderr_tail}".strip()}


def execute(spec: RunSpec, *, machine: Machine | None = None, echo: bool = True,
            env: dict[str, str] | None = None, repeat: tuple[str, int, int] | None = None) -> RunResult:
    """Run `spec` in a fresh child process; return its rows. Raises GpuMismatchError, ConfigError or LoadError
    before spawning anything (see `preflight`).

    `env` adds to the child's environment (a sweep gives each GPU's child its own CUDA_VISIBLE_DEVICES);
    `repeat` = (repeat_id, index from 1, count) marks one run of `run --repeat N` (the same spec, N fresh children)."""
    machine = machine or detect()
    device = check_gpu(spec.gpu, machine)
    if is_remote(spec.backend):
        # the backend's own check (http: --endpoint, which must hold no password) before anything is stored: a
        # sweep's or an API caller's spec has not been through `run`'s check_spec
        own = getattr(get_backend(spec.backend), "check", None)
        if callable(own):
            own(spec, machine)
    notes, suite = _preflight(spec)
    spec.device = spec.device or device
    run_id, created = str(uuid7()), dt.datetime.now(dt.UTC)
    _clear_orphaned_tmp()

    # spec_hash, the stored spec and role below stay those of the requested spec (model None for the embedded
    # model), so a run's hash does not depend on where the cache lives; the child gets the resolved one.
    child_spec, out = _resolve_in_parent(spec)
    if out is None and suite is not None:  # the built-in suite's states are short: nothing to check
        check_state_lengths(suite, child_spec, child_spec.model)  # before the child loads the model
    if out is None:
        with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as tmp:
            spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
            spec_path.write_text(json.dumps(child_spec.to_dict()))
            env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "QUANTBENCH_PARENT_PID": str(os.getpid())}
            if echo and sys.stderr.isatty():
                env["QUANTBENCH_TTY"] = "1"
            oom_before = oom_kill_count()
            ended = None  # "timeout" | "interrupted" when this process ended the run
            with _stop.lock:
                _stop.live += 1
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "quantbench.run.child", str(spec_path), str(result_path)],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # its own process group: a timeout kills the child and anything it started
                )
                tail: deque[bytes] = deque()
                sink = getattr(sys.stderr, "buffer", None) if echo else None
                pump = threading.Thread(target=_pump, args=(proc.stdout, sink, tail), daemon=True)
                pump.start()
                deadline = time.monotonic() + spec.timeout_s
                try:
                    while proc.poll() is None:
                        if stopping():
                            ended = "interrupted"
                        elif time.monotonic() > deadline:
                            ended = "timeout"
                        if ended:
                            _kill_group(proc)
                            break
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            proc.wait(timeout=POLL_S)
                except BaseException:  # anything else (Ctrl-C outside stop_on_signals): the child must not outlive us
                    _kill_group(proc)
                    raise
            finally:
                with _stop.lock:
                    _stop.live -= 1
            pump.join(timeout=5)
            # A result file is whole (the child writes it aside and renames it): it stands even when the timeout or
            # a stop signal came while the child was exiting after writing it. Before, that finished run was
            # stored as failed (interrupted / timeout) and its answers thrown away.
            out = _read_result(result_path)
            saved = _read_progress(result_path) if out is None else {}
            crash_trace = result_path.with_suffix(".faulthandler")
            crash_text = crash_trace.read_text() if crash_trace.exists() else ""

        if out is None:  # a child that never reported keeps what it had saved (its suite, its variant once loaded)
            out = _without_result(spec, ended, saved, proc.returncode, oom_before,
                                  crash_text, b"".join(tail).decode(errors="replace"))

    identity = RunIdentity(
        run_id=run_id, created_at=created, finished_at=dt.datetime.now(dt.UTC), status=out["status"],
        failure=out.get("failure"), error=out.get("error"), backend=spec.backend, role=spec.role,
        gpu_requested=spec.gpu, spec=stored_spec(spec), spec_hash=spec_hash(spec, machine),
        **(dict(zip(("repeat_id", "repeat_index", "repeat_count"), repeat, strict=True)) if repeat else {}),
    )
    record = RunRecord.compose(identity, MachineFacts(**machine.as_row()), Provenance(**provenance()),
                               Measured.model_validate(out.get("run", {})), notes)
    if out["status"] != "ok":
        # A failed row gets what this process knew where the child never said it: one the child reported (a model
        # refused at load: its reason, but not which model) and one this process made up (stopped, timed out,
        # crashed, not resolved) alike, so it lands in its model's table as failed, not among the runs of none.
        with _stop.lock:  # counted as a run in flight: a stop signal meanwhile must not lose the row (SystemExit)
            _stop.live += 1
        try:
            return RunResult(run=_what_the_parent_knew(record, spec, child_spec, suite))
        finally:
            with _stop.lock:
                _stop.live -= 1
    return RunResult(run=record, answers=out["answers"], latencies=out["latencies"])
