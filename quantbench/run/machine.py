"""What machine a run is on: GPU identity through NVML, host through psutil. Every run row carries it.

The parent process reads NVML only (no CUDA context, so it costs no GPU memory); the child adds what only torch
knows (multiprocessor count) once it has initialised CUDA anyway.
"""

from __future__ import annotations

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


def _host() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "host_memory_bytes": psutil.virtual_memory().total,
        "os": f"{platform.system()} {platform.release()}",
        "python_version": platform.python_version(),
    }


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
