"""The local executor of `quantbench sweep`: one process per visible GPU on this host (one at a time on CPU).

Each visible GPU (its own CUDA_VISIBLE_DEVICES) and the CPU is a `Slot`, with a thread that takes the next
pending run whose GPU requirement the slot fits and runs it in a fresh child process (`runner.execute`, the same
run `quantbench run` does), one at a time. Where there are GPUs, the CPU slot takes only runs that ask for
`cpu`; a host without a GPU runs one run at a time, because a CPU run uses every core.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from quantbench.errors import GpuMismatchError
from quantbench.run.machine import Machine, check_gpu, detect
from quantbench.sweep.executor import Event, failed_result
from quantbench.sweep.planning import PlannedRun


@dataclass
class Slot:
    """One place a local run can go: a GPU (its own CUDA_VISIBLE_DEVICES) or the CPU."""

    name: str
    machine: Machine
    env: dict[str, str]
    cpu: bool = False


def local_slots() -> list[Slot]:
    """One slot per visible GPU (NVML index, or CUDA_VISIBLE_DEVICES as given) plus the CPU; just the CPU on a
    host without a GPU. Identities are read here, in the main thread, before any worker thread starts."""
    here = detect()
    if not here.has_gpu:
        return [Slot("cpu", here, {}, cpu=True)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        import pynvml

        pynvml.nvmlInit()
        indices = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    if not all(i.isdigit() for i in indices):  # GPU UUIDs: NVML identity by index is unknown, so run them as one
        return [Slot(f"cuda ({visible})", here, {}), _cpu_slot()]
    slots = []
    try:
        for i in indices:
            os.environ["CUDA_VISIBLE_DEVICES"] = i
            slots.append(Slot(f"gpu {i}", detect(), {"CUDA_VISIBLE_DEVICES": i}))
    finally:
        _restore("CUDA_VISIBLE_DEVICES", visible)
    return [*slots, _cpu_slot()]


def _cpu_slot() -> Slot:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return Slot("cpu", detect(), {"CUDA_VISIBLE_DEVICES": ""}, cpu=True)
    finally:
        _restore("CUDA_VISIBLE_DEVICES", visible)


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _same_machine(machine: Machine, row: dict[str, Any]) -> bool:
    if machine.gpu_name or row["gpu_name"]:
        return machine.gpu_name == row["gpu_name"]
    return machine.host == row["host"]


class LocalExecutor:
    """Runs on this host: one thread per GPU, each running its queue one fresh process at a time; on a host
    without a GPU, one run at a time (a CPU run uses every core)."""

    name = "local"

    def __init__(self, slots: list[Slot] | None = None):
        self.slots = slots if slots is not None else local_slots()
        self.has_gpu = any(not s.cpu for s in self.slots)

    def where(self) -> str:
        gpus = [f"{s.name}: {s.machine.gpu_name}" for s in self.slots if not s.cpu]
        return ", ".join(gpus) if gpus else f"CPU ({self.slots[0].machine.cpu_model}), one run at a time"

    def fits(self, slot: Slot, gpu: str) -> bool:
        if gpu == "cpu":
            return slot.cpu
        if slot.cpu and self.has_gpu:
            return False  # `auto` and GPU requirements go to the GPUs; the CPU slot only takes `cpu` runs
        try:
            check_gpu(gpu, slot.machine)
            return True
        except GpuMismatchError:
            return False

    def placeable(self, run: PlannedRun) -> str | None:
        if any(self.fits(s, run.spec.gpu) for s in self.slots):
            return None
        return f"needs gpu {run.spec.gpu!r}; this host has {self.where()} (run it where that GPU is, or with --executor ray)"

    def accepts(self, run: PlannedRun, row: dict[str, Any]) -> bool:
        return any(self.fits(s, run.spec.gpu) and _same_machine(s.machine, row) for s in self.slots)

    def run(self, runs: list[PlannedRun]) -> Iterator[Event]:
        pending, lock, events = list(runs), threading.Lock(), queue.Queue()

        def take(slot: Slot) -> PlannedRun | None:
            from quantbench.run.runner import stopping

            if stopping():  # told to stop: the runs in flight end as interrupted, no new one starts
                return None
            with lock:
                for i, run in enumerate(pending):
                    if self.fits(slot, run.spec.gpu):
                        return pending.pop(i)
            return None

        def work(slot: Slot) -> None:
            from quantbench.run.runner import execute

            try:
                while (run := take(slot)) is not None:
                    events.put(Event("started", run, where=slot.name))
                    spec = run.spec_on(slot.machine)
                    try:
                        result = execute(spec, machine=slot.machine, echo=False, env=slot.env, repeat=run.repeat_tag)
                    except Exception as e:  # the run is lost, not the sweep
                        from quantbench.errors import ConfigError, LoadError

                        # refused before its child started (runner.preflight): labelled as the child would
                        kind = "load_error" if isinstance(e, LoadError) else "config_error" if isinstance(
                            e, ConfigError) else "error"
                        result = failed_result(spec, kind, f"{type(e).__name__}: {e}", repeat=run.repeat_tag)
                    events.put(Event("finished", run, result, slot.name))
            finally:
                events.put(None)

        busy = [s for s in self.slots if any(self.fits(s, r.spec.gpu) for r in runs)]
        for slot in busy:
            threading.Thread(target=work, args=(slot,), name=f"sweep-{slot.name}", daemon=True).start()
        for _ in busy:
            while (event := events.get()) is not None:
                yield event

    def close(self) -> None:
        pass
