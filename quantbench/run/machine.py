"""What machine a run is on: GPU identity through NVML, host through psutil. Every run row carries it.

The parent process reads NVML only (no CUDA context, so it costs no GPU memory); the child adds what only torch
knows (multiprocessor count) once it has initialised CUDA anyway.

A host name alone does not identify a machine (every VM of an image may be called `vm`): a run also records the
CPU model, its logical CPUs and a machine id (a hash of /etc/machine-id, never the id itself, which systemd asks
to keep private), and `LoadProbe` records how busy the machine was while the run was timed.
"""

from __future__ import annotations

import hashlib
import os
import platform
import socket
import sys
from dataclasses import asdict, dataclass

import psutil

from quantbench.errors import GpuMismatchError

# Compute capability (major, minor) → architecture family. Blackwell spans 10.x (B200) and 12.x (RTX PRO 6000).
FAMILIES = {
    (7, 0): "volta", (7, 2): "volta", (7, 5): "turing",
    (8, 0): "ampere", (8, 6): "ampere", (8, 7): "ampere", (8, 9): "ada",
    (9, 0): "hopper",
    (10, 0): "blackwell", (10, 1): "blackwell", (10, 3): "blackwell", (11, 0): "blackwell",
    (12, 0): "blackwell", (12, 1): "blackwell",
}
KNOWN_FAMILIES = ("cpu", "volta", "turing", "ampere", "ada", "hopper", "blackwell")


def family_of(cc: tuple[int, int] | None) -> str:
    if cc is None:
        return "cpu"
    if cc in FAMILIES:
        return FAMILIES[cc]
    return "blackwell" if cc[0] >= 10 else f"sm_{cc[0]}{cc[1]}"


@dataclass
class Machine:
    device: str  # "cuda:0" or "cpu"
    gpu_name: str | None
    gpu_family: str  # cpu | ampere | ada | hopper | blackwell | ...
    gpu_uuid: str | None
    gpu_cc: str | None
    gpu_sm_count: int | None
    gpu_memory_bytes: int | None
    driver_version: str | None
    cuda_version: str | None
    host: str
    cpu_model: str
    host_memory_bytes: int
    os: str
    python_version: str
    nvml_index: int | None = None
    cpu_cores: int | None = None
    machine_id: str | None = None

    @property
    def has_gpu(self) -> bool:
        return self.gpu_name is not None

    @property
    def label(self) -> str:
        return f"{self.gpu_name} ({self.gpu_family})" if self.has_gpu else f"CPU: {self.cpu_model}"

    def as_row(self) -> dict[str, object]:
        row = asdict(self)
        row.pop("nvml_index")
        return row


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine_id(files: tuple[str, ...] = MACHINE_ID_FILES) -> str | None:
    """sha256 of the machine id (16 hex digits), or None where no such file can be read."""
    for name in files:
        try:
            raw = open(name).read().strip()
        except OSError:
            continue
        if raw:
            return hashlib.sha256(f"quantbench:{raw}".encode()).hexdigest()[:16]
    return None


def _host() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "host_memory_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python_version": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "machine_id": machine_id(),
    }


# -- how busy the machine was ---------------------------------------------------------------------------------------
# A run is timed on a machine others may share. Over the timed phase: CPU steal (time the hypervisor gave another
# guest) and the CPU time of every other process (all CPUs' busy time from /proc/stat, less this process's own),
# each as a share of all CPU time, and the 1-minute load average at its end (quantbench.analysis.conditions says
# when that is busy).


def _proc_stat(path: str = "/proc/stat") -> list[int] | None:
    """The aggregate `cpu` line: user nice system idle iowait irq softirq steal … in clock ticks."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    return [int(x) for x in first[1:]] if first and first[0] == "cpu" else None


class LoadProbe:
    """`start()` and `stop()` around the timed phase; `facts()` gives the run's load columns. The readers are
    injected (`stat`, `own_cpu_s`, `loadavg`) so the arithmetic is tested with made-up counters."""

    def __init__(self, stat=_proc_stat, own_cpu_s=None, loadavg=None, ticks_per_s: float | None = None):
        self.stat = stat
        self.own_cpu_s = own_cpu_s or (lambda: sum(os.times()[:4]))  # this process and its waited-for children
        self.loadavg = loadavg or (lambda: os.getloadavg()[0])
        if ticks_per_s is None:
            ticks_per_s = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
        self.ticks = ticks_per_s
        self._start: tuple[list[int] | None, float] | None = None
        self.load_avg_1m: float | None = None
        self.cpu_steal_share: float | None = None
        self.cpu_others_share: float | None = None

    def start(self) -> None:
        self._start = (self.stat(), self.own_cpu_s())

    def stop(self) -> None:
        try:
            self.load_avg_1m = float(self.loadavg())
        except OSError:
            self.load_avg_1m = None
        if self._start is None or self._start[0] is None:
            return
        end, own = self.stat(), self.own_cpu_s()
        if end is None:
            return
        delta = [b - a for a, b in zip(self._start[0], end, strict=False)]
        total = sum(delta[:8])  # user … steal (guest time is already inside user)
        if total <= 0:
            return
        idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
        steal = delta[7] if len(delta) > 7 else 0
        busy = total - idle - steal
        mine = (own - self._start[1]) * self.ticks
        self.cpu_steal_share = steal / total
        self.cpu_others_share = min(1.0, max(0.0, (busy - mine) / total))

    def facts(self) -> dict[str, float | None]:
        return {"load_avg_1m": self.load_avg_1m, "cpu_steal_share": self.cpu_steal_share,
                "cpu_others_share": self.cpu_others_share}


def _visible_index() -> int:
    """NVML counts every GPU; CUDA_VISIBLE_DEVICES picks which one is cuda:0 for this process."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def _nvml_gpu() -> dict[str, object] | None:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: a CPU machine
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        index = _visible_index()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        name = pynvml.nvmlDeviceGetName(h)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        return {
            "device": "cuda:0",
            "gpu_name": name.decode() if isinstance(name, bytes) else name,
            "gpu_family": family_of((major, minor)),
            "gpu_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "gpu_cc": f"{major}.{minor}",
            "gpu_sm_count": None,
            "gpu_memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            "driver_version": str(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "nvml_index": index,
        }
    except Exception:
        return None


def detect(with_torch: bool = False) -> Machine:
    gpu = _nvml_gpu()
    if gpu is None:
        gpu = {
            "device": "cpu", "gpu_name": None, "gpu_family": "cpu", "gpu_uuid": None, "gpu_cc": None,
            "gpu_sm_count": None, "gpu_memory_bytes": None, "driver_version": None, "cuda_version": None,
        }
    elif with_torch:
        import torch

        if torch.cuda.is_available():
            gpu["gpu_sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    return Machine(**gpu, **_host())


def check_gpu(requested: str, machine: Machine) -> str:
    """Validate `--gpu` against the detected hardware; return the torch device to run on.

    auto: whatever is here. cpu: run on the CPU even if a GPU exists. A family (hopper, blackwell, ...) or a
    name fragment (h200, "rtx pro 6000"): must match the detected GPU, or the run is refused — a mislabelled row
    would be worse than no row.
    """
    req = (requested or "auto").strip().lower()
    if req == "auto":
        return machine.device
    if req == "cpu":
        return "cpu"
    if not machine.has_gpu:
        raise GpuMismatchError(
            f"--gpu {requested}: this machine has no GPU that NVML can see (CPU: {machine.cpu_model}); "
            "use --gpu auto or --gpu cpu, or run on the machine with that GPU"
        )
    if req in KNOWN_FAMILIES:
        if req != machine.gpu_family:
            raise GpuMismatchError(
                f"--gpu {requested}: this machine's GPU is {machine.gpu_name} ({machine.gpu_family}, "
                f"compute capability {machine.gpu_cc}); use --gpu {machine.gpu_family} or --gpu auto"
            )
        return machine.device
    if req not in (machine.gpu_name or "").lower():
        raise GpuMismatchError(
            f"--gpu {requested}: not the GPU here ({machine.gpu_name}, {machine.gpu_family}); "
            f"use a family ({', '.join(KNOWN_FAMILIES)}), part of the GPU's name, or auto"
        )
    return machine.device


def python_executable() -> str:
    return sys.executable
