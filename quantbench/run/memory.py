"""Memory figures of one run: torch's allocator counters, an NVML per-process sampler, and the host's peak RSS.

On a CPU host every GPU figure stays None (NULL in the store), never 0.
"""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass

import torch


def host_rss_peak_bytes() -> int:
    # ru_maxrss is the process's lifetime peak, in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class NvmlSampler:
    """Samples this process's GPU memory as NVML sees it (context + allocator + anything else), keeping the max."""

    def __init__(self, nvml_index: int | None, interval_s: float = 0.01):
        self.index, self.interval = nvml_index, interval_s
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, handle) -> int | None:
        import pynvml

        pid = os.getpid()
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None

    def _loop(self) -> None:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        while not self._stop.is_set():
            used = self._read(handle)
            if used is not None:
                self.peak = max(self.peak or 0, used)
            self._stop.wait(self.interval)

    def start(self) -> NvmlSampler:
        if self.index is None:
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return self
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        return self.peak


@dataclass
class MemoryFigures:
    mem_weights_bytes: int | None = None
    mem_peak_allocated_bytes: int | None = None
    mem_peak_reserved_bytes: int | None = None
    mem_nvml_peak_bytes: int | None = None
    host_rss_peak_bytes: int | None = None


class MemoryTracker:
    """Call `before_load()`, `after_load()`, then `finish()` to get the figures of one run."""

    def __init__(self, device: str, nvml_index: int | None):
        self.cuda = device.startswith("cuda")
        self.device = torch.device(device)
        self.sampler = NvmlSampler(nvml_index if self.cuda else None)
        self.figures = MemoryFigures()
        self._before = 0

    def before_load(self) -> None:
        if self.cuda:
            torch.cuda.init()
            # cuBLAS's workspace (32 MiB on Hopper) comes from PyTorch's allocator with the first GEMM and stays:
            # taken here, it is not counted as weights when a load's probe (fused_ops) runs the first GEMM
            a = torch.ones(16, 16, device=self.device)
            torch.nn.functional.linear(a, a, a[0])  # addmm with a bias: cuBLASLt's workspace too
            torch.mm(a, a)
            del a
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._before = torch.cuda.memory_allocated(self.device)
        self.sampler.start()

    def after_load(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.figures.mem_weights_bytes = torch.cuda.memory_allocated(self.device) - self._before

    def finish(self) -> MemoryFigures:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.figures.mem_peak_allocated_bytes = torch.cuda.max_memory_allocated(self.device)
            self.figures.mem_peak_reserved_bytes = torch.cuda.max_memory_reserved(self.device)
        self.figures.mem_nvml_peak_bytes = self.sampler.stop()
        self.figures.host_rss_peak_bytes = host_rss_peak_bytes()
        return self.figures
