"""The Ray executor of `quantbench sweep`: one Ray task per run, on any node whose GPU matches.

Each task calls `runner.execute(spec)` on its node — the same fresh child process as a local run — and returns
the RunResult to the driver, which stores it (the only DuckDB writer). A noise floor that names no kernel gets its
second kernel there, from the node's own hardware (`run --noise-floor`'s choice). With `parquet_dir` each task also writes
its run as a Parquet file there (`quantbench merge DIR` collects them) for clusters where the driver may go away.

Placement: a task asks for `num_gpus=1` (a CPU run asks for no GPU and a whole node's CPUs) and, for a GPU family
or name, a label selector on `ray.io/accelerator-type`, the label Ray puts on every node from its GPU's name
(H100, H200, RTX-PRO-6000, ...; set it with `ray start --labels` where Ray cannot read it). The node checks the
GPU again before it runs (runner.execute refuses a mismatch), so a misplaced task fails instead of storing a
mislabelled row. A task that raises, or whose worker or node dies, becomes a `failed` row and the sweep goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from quantbench.run.machine import KNOWN_FAMILIES
from quantbench.run.record import RunResult
from quantbench.run.spec import RunSpec
from quantbench.sweep.executor import Event, failed_result
from quantbench.sweep.planning import PlannedRun

ACCELERATOR_LABEL = "ray.io/accelerator-type"
# Ray's accelerator types (ray.util.accelerators and the NVML names it shortens) by architecture family.
FAMILY_TYPES = {
    "volta": ("V100",),
    "turing": ("T4", "RTX-6000", "GeForce-RTX-2080-Ti"),
    "ampere": ("A100", "A100-40G", "A100-80G", "A10G", "A10", "A30", "A40", "A16", "A2", "RTX-A6000",
               "RTX-A5000", "RTX-A4000", "GeForce-RTX-3090"),
    "ada": ("L4", "L40", "L40S", "L20", "RTX-6000-Ada", "GeForce-RTX-4090"),
    "hopper": ("H100", "H200", "H20", "H800", "GH200"),
    "blackwell": ("B200", "B100", "B300", "GB200", "GB300", "RTX-PRO-6000", "GeForce-RTX-5090"),
}


def run_task(spec: dict[str, Any], parquet_dir: str | None = None, repeat: tuple[str, int, int] | None = None,
             floor_kernel_here: bool = False) -> RunResult:
    """What one Ray task does on its node: one run in a fresh child process; its RunResult goes back. `repeat`:
    the run's repeat tag; `floor_kernel_here`: a noise floor whose second kernel this node's hardware chooses."""
    from quantbench.run.machine import detect
    from quantbench.run.runner import execute
    from quantbench.run.spec import as_noise_floor

    machine, planned = detect(), RunSpec.from_dict(spec)
    run_spec = as_noise_floor(planned, machine.has_gpu) if floor_kernel_here else planned
    result = execute(run_spec, machine=machine, echo=False, repeat=repeat)
    if parquet_dir:
        write_parquet(result, parquet_dir)
    return result


def write_parquet(result: RunResult, folder: str) -> str:
    """The run as `<folder>/<run_id>.parquet`, in `quantbench export`'s format (a scratch store in between)."""
    import tempfile
    from pathlib import Path

    from quantbench.store import Store
    from quantbench.store.transfer import export

    Path(folder).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quantbench-task-") as tmp:
        scratch = Store(Path(tmp) / "run.duckdb")
        scratch.write_run(result)
        return str(export(scratch, Path(folder) / f"{result.run_id}.parquet")[0])


def accelerator_type(name: str) -> str:
    """A GPU name as Ray labels it: "NVIDIA H100 80GB HBM3" → H100, "rtx pro 6000" → RTX-PRO-6000.
    Ray's own rule (it labels nodes with it); a lower-case name someone typed is read as upper case."""
    name = name.strip() if any(c.isupper() for c in name) else name.strip().upper()
    full = name if name.lower().startswith("nvidia") else f"NVIDIA {name}"
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        found = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(full)
    except (ImportError, AttributeError):  # a Ray that moved it: the plain spelling below
        found = None
    return found or "-".join(full.split()[1:])


def _task_extras(run: PlannedRun) -> dict[str, Any]:
    """run_task's keyword arguments of a run, only those it sets: a task of the plain (spec, parquet_dir) form
    still takes a run that is no repeat and no noise floor of the node's choosing."""
    extras = {"repeat": run.repeat_tag, "floor_kernel_here": run.floor_kernel_here}
    return {k: v for k, v in extras.items() if v}


def _failure(e: Exception) -> tuple[str, str]:
    """(failure kind, message) for a task that came back as an exception instead of a RunResult."""
    from ray import exceptions as rx

    if isinstance(e, rx.RayTaskError):
        cause = getattr(e, "cause", None)
        head = f"{type(cause).__name__}: {cause}" if cause is not None else "the task raised"
        return "error", f"{head}\n\nthe Ray task failed on its node:\n{e}"
    if isinstance(e, rx.OutOfMemoryError):
        return "oom", f"Ray's memory monitor killed the task's worker: {e}"
    if isinstance(e, rx.NodeDiedError):
        return "crashed", f"the Ray node running this task died: {e}"
    if isinstance(e, rx.WorkerCrashedError):
        return "crashed", f"the Ray worker running this task died (killed, or it crashed): {e}"
    if isinstance(e, rx.TaskCancelledError):
        return "error", f"the Ray task was cancelled: {e}"
    return "crashed", f"{type(e).__name__}: {e}"


class RayExecutor:
    """Runs each planned run as a Ray task. Joins `address` (e.g. "auto") or starts a local Ray instance; a Ray
    that is already initialised in this process (tests) is used as it is and left running."""

    name = "ray"

    def __init__(self, address: str | None = None, *, num_cpus: int = 1, max_retries: int = 0,
                 task: Callable[..., RunResult] = run_task, parquet_dir: str | None = None):
        import ray

        self.ray = ray
        self.num_cpus, self.max_retries, self.task, self.parquet_dir = num_cpus, max_retries, task, parquet_dir
        self._hosts: set[str] | None = None
        self.owned = not ray.is_initialized()
        if self.owned:
            import signal

            from quantbench.run.runner import STOP_SIGNALS

            # ray.init installs its own SIGTERM handler (a C stack dump and SIGABRT): `sweep`'s stop_on_signals,
            # installed before, must stay, or a SIGTERM lost every run in flight with no row and no message.
            handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
            try:
                ray.init(address=address, log_to_driver=False,
                         **({} if address else {"include_dashboard": False}))
            except ConnectionError as e:  # no cluster at --address: one line with the fix, not Ray's traceback
                from quantbench.errors import ConfigError

                raise ConfigError(f"--address {address}: no running Ray cluster found there ({e}); start one with "
                                  "`ray start --head`, or leave out --address to start a local Ray for this sweep"
                                  ) from None
            finally:
                for s, handler in handlers.items():
                    if handler is not None:
                        signal.signal(s, handler)

    def _nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def where(self) -> str:
        nodes = self._nodes()
        gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
        types = sorted({n.get("Labels", {}).get(ACCELERATOR_LABEL, "?") for n in nodes if n["Resources"].get("GPU")})
        return f"Ray: {len(nodes)} node(s), {gpus} GPU(s)" + (f" ({', '.join(types)})" if types else "")

    # -- placement -------------------------------------------------------------------------------------------
    def _types(self, gpu: str) -> tuple[str, ...] | None:
        """The accelerator types a requirement allows; None = any."""
        if gpu in ("auto", "cpu"):
            return None
        if gpu in FAMILY_TYPES:
            return FAMILY_TYPES[gpu]
        return (accelerator_type(gpu),)

    def options(self, gpu: str) -> dict[str, Any]:
        nodes = self._nodes()
        if gpu == "cpu" or gpu == "auto" and not any(n["Resources"].get("GPU") for n in nodes):
            # A CPU run uses every core: ask for a whole node's CPUs (the smallest node's), so they go one per node.
            cpus = min((int(n["Resources"].get("CPU", 1)) for n in nodes), default=1)
            return {"num_gpus": 0, "num_cpus": max(1, cpus)}
        opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": self.num_cpus}
        types = self._types(gpu)
        if types:
            opts["label_selector"] = {ACCELERATOR_LABEL: types[0] if len(types) == 1 else f"in({','.join(types)})"}
        return opts

    def placeable(self, run: PlannedRun) -> str | None:
        """None when some live node can take the task; else why not (Ray would wait forever for it)."""
        gpu, opts, types = run.spec.gpu, self.options(run.spec.gpu), self._types(run.spec.gpu)
        for node in self._nodes():
            res, label = node["Resources"], node.get("Labels", {}).get(ACCELERATOR_LABEL)
            if res.get("GPU", 0) >= opts["num_gpus"] and res.get("CPU", 0) >= opts["num_cpus"] and (
                    types is None or label in types):
                return None
        want = "a GPU" if gpu == "auto" else "CPUs" if gpu == "cpu" else (
            f"a {gpu} GPU ({ACCELERATOR_LABEL} in {', '.join(types or ())})" if gpu in KNOWN_FAMILIES
            else f"a GPU named {gpu!r} ({ACCELERATOR_LABEL} = {accelerator_type(gpu)})")
        return f"no node in the Ray cluster has {want}; the cluster has {self.where()}"

    def accepts(self, run: PlannedRun, row: dict[str, Any]) -> bool:
        """Does a stored run on `row`'s machine satisfy this run's GPU requirement? A GPU family or name: any
        machine with that GPU (the same GPU model measures the same). auto and cpu: a node of this cluster."""
        gpu = run.spec.gpu
        if gpu in ("auto", "cpu"):
            if self._hosts is None:
                self._hosts = {n.get("NodeManagerHostname") for n in self._nodes()}
            return row["host"] in self._hosts and (gpu == "auto" or row["gpu_name"] is None)
        if row["gpu_name"] is None:
            return False
        if gpu in KNOWN_FAMILIES:
            return row["gpu_family"] == gpu
        return gpu.lower() in row["gpu_name"].lower()

    # -- running ---------------------------------------------------------------------------------------------
    def run(self, runs: list[PlannedRun]) -> Iterator[Event]:
        from quantbench.run.runner import runs_elsewhere

        with runs_elsewhere():  # a stop signal: the tasks in flight are cancelled and stored as interrupted
            yield from self._run(runs)

    def _run(self, runs: list[PlannedRun]) -> Iterator[Event]:
        import signal

        from quantbench.run.runner import POLL_S, stop_requested, stopping

        ray = self.ray
        remote = ray.remote(self.task)
        pending: dict[Any, PlannedRun] = {}
        for run in runs:
            if stopping():
                break
            opts = self.options(run.spec.gpu)
            ref = remote.options(**opts, max_retries=self.max_retries, name=f"quantbench {run.label}"[:120]).remote(
                run.spec.to_dict(), self.parquet_dir, **_task_extras(run))
            pending[ref] = run
            yield Event("started", run, where="ray")  # submitted; Ray starts it when a matching node is free
        while pending:
            stop = stopping()  # told to stop: collect what has finished, then cancel the rest
            done, _ = ray.wait(list(pending), num_returns=len(pending) if stop else 1, timeout=0 if stop else POLL_S)
            for ref in done:
                run = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # the task never returned a result: record why, keep going
                    failure, error = _failure(e)
                    result = failed_result(run.spec, failure, error, repeat=run.repeat_tag, executor="ray")
                yield Event("finished", run, result, where=str(result.run.host or "ray"))
            if stop:
                name = signal.Signals(stop_requested() or signal.SIGTERM).name
                for ref, run in pending.items():
                    ray.cancel(ref, force=True)  # kills its worker; the run's child dies with it (PDEATHSIG)
                    yield Event("finished", run, failed_result(
                        run.spec, "interrupted", f"quantbench was told to stop ({name}) and cancelled the Ray task "
                        "before it finished", repeat=run.repeat_tag, executor="ray"), "ray")
                return

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
