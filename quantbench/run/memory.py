"""Memory figures of one run: torch's allocator counters, an NVML per-process sampler, and the run's own peak RSS.

On a CPU host every GPU figure stays None (NULL in the store), never 0.

Peak host RSS is this process's own: `VmHWM` from /proc/self/status, after resetting it (writing 5 to
/proc/self/clear_refs sets the high-water mark to the current RSS) when the run starts; where /proc cannot be read,
a thread samples the RSS every 20 ms and keeps the largest. Never `ru_maxrss`: a freshly exec'd child starts with
its parent's high-water mark there, so every variant of a demo showed the demo's own peak.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


def vm_hwm_bytes(status: str = STATUS) -> int | None:
    """This process's peak resident set since it started or since its last reset (VmHWM), or None."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss(clear_refs: str = CLEAR_REFS) -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False where it cannot be."""
    try:
        with open(clear_refs, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class RssSampler:
    """The largest RSS seen every `interval_s`: the fallback where VmHWM cannot be read."""

    def __init__(self, interval_s: float = 0.02):
        self.interval, self.peak = interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def _loop(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            self._stop.wait(self.interval)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=1.0)
        return self.peak


class OwnPeakRss:
    """`start()` when the run starts, `finish()` → (peak bytes, how read: vmhwm | sampled)."""

    def __init__(self, status: str = STATUS, clear_refs: str = CLEAR_REFS):
        self.status, self.clear_refs = status, clear_refs
        self.sampler: RssSampler | None = None

    def start(self) -> None:
        reset_peak_rss(self.clear_refs)  # a fresh process's VmHWM is already its own; the reset makes it the run's
        if vm_hwm_bytes(self.status) is None:
            self.sampler = RssSampler().start()

    def finish(self) -> tuple[int | None, str | None]:
        if self.sampler is not None:
            return self.sampler.stop() or None, "sampled"
        peak = vm_hwm_bytes(self.status)
        return peak, "vmhwm" if peak is not None else None


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
    host_rss_peak_source: str | None = None  # vmhwm | sampled


class MemoryTracker:
    """Call `before_load()`, `after_load()`, then `finish()` to get the figures of one run."""

    def __init__(self, device: str, nvml_index: int | None):
        self.cuda = device.startswith("cuda")
        self.device = torch.device(device)
        self.sampler = NvmlSampler(nvml_index if self.cuda else None)
        self.figures = MemoryFigures()
        self._before = 0
        self.rss = OwnPeakRss()
        self.rss.start()

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
        self.figures.host_rss_peak_bytes, self.figures.host_rss_peak_source = self.rss.finish()
        return self.figures
