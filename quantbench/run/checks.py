"""Every option of a run that can be judged without the model, judged in the parent in well under a second,
before any child starts or anything is stored: a bad option is one line naming the flag and the fix (exit 2),
never a failed run 20 seconds later.

What runner.preflight checks (the model directory, the suite) is its own; this is the rest: --device against the
GPUs NVML sees, --gpu against this machine, --dtype, --method, the counts and limits, --shape and --layers, the
backend's availability here and anything the backend itself checks (`check(spec, machine)`, optional: the http
backend's --endpoint).
"""

from __future__ import annotations

import os
import re
from typing import Any

from quantbench.errors import ConfigError
from quantbench.run.machine import Machine, check_gpu
from quantbench.run.settings import GENERIC, refusal
from quantbench.run.spec import RunSpec

DEVICE = re.compile(r"^(cpu|cuda)(:(\d+))?$")


def visible_gpus(machine: Machine) -> int:
    """GPUs a child process can use: CUDA_VISIBLE_DEVICES' list where set, else those NVML counts."""
    if not machine.has_gpu:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import pynvml

        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # NVML answered detect() a moment ago; if it will not count, assume the one it saw
        return 1


def check_device(device: str | None, gpu: str, machine: Machine) -> None:
    """--device: cpu, cuda or cuda:N, where such a device exists here and agrees with --gpu."""
    if device is None:
        return
    m = DEVICE.match(device.strip().lower())
    if not m:
        raise ConfigError(f"--device {device!r}: use cpu, cuda or cuda:N (or leave it out: a GPU when there is one)")
    if m.group(1) == "cuda":
        n = visible_gpus(machine)
        if n == 0:
            raise ConfigError(f"--device {device}: this machine has no GPU that NVML can see (CPU: {machine.cpu_model})"
                              "; leave --device out, or give --device cpu")
        index = int(m.group(3) or 0)
        if index >= n:
            raise ConfigError(f"--device {device}: this machine has {n} GPU{'s' * (n != 1)} visible (cuda:0"
                              + (f" … cuda:{n - 1}" if n > 1 else "") + "); give one of them")
        if gpu.strip().lower() == "cpu":
            raise ConfigError(f"--device {device} with --gpu cpu: the run would be labelled CPU but run on the GPU; "
                              "drop one of them")
    elif gpu.strip().lower() not in ("auto", "cpu"):
        raise ConfigError(f"--device cpu with --gpu {gpu}: the run would be labelled {gpu} but run on the CPU; use "
                          "--gpu cpu (or leave --device out)")


def check_spec(spec: RunSpec, machine: Machine, backend: Any) -> None:
    """Refuse, naming the flag, every setting of `spec` that would fail the run (see the module docstring).
    `backend` is the backend's instance (quantbench.run.backend.get_backend)."""
    check_gpu(spec.gpu, machine)  # a GpuMismatchError names --gpu and what is here
    check_device(spec.device, spec.gpu, machine)
    for name in GENERIC:  # --dtype, --method, the counts and bounds: as quantbench.run.settings declares them
        if why := refusal(name, getattr(spec, name)):
            raise ConfigError(why)
    if spec.layers is not None and not spec.shape:
        raise ConfigError("--layers sets the layer count of a synthetic --shape model; give --shape too (a checkpoint "
                          "has the layers it has)")
    if spec.shape:
        from quantbench.models.families import synthetic_shapes  # every family's, read without torch

        shapes = synthetic_shapes()
        if spec.shape not in shapes:
            raise ConfigError(f"--shape {spec.shape!r}: use one of {', '.join(sorted(shapes))}")
    availability = backend.availability(machine)
    if not availability.available:
        raise ConfigError(f"--backend {spec.backend}: not available here: {availability.detail}")
    own = getattr(backend, "check", None)
    if callable(own):
        own(spec, machine)
