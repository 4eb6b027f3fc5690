"""What a loaded variant's forwards ran: the kernel path (`KernelPath`) and the engine's facts beside it (fused ops,
CUDA graphs, PDL, media). `run`'s child records it on the run row after the timed phase; `quantbench serve`
reports it in /healthz after its forwards: both read it here, so the server says what `run` would store."""

from __future__ import annotations

from typing import Any

from quantbench.engine import pdl
from quantbench.engine.moe.engine import kernel_paths, kernel_paths_ran
from quantbench.run.backend import LoadedVariant
from quantbench.run.record import KernelPath


def planned_kernel(loaded: LoadedVariant) -> KernelPath:
    """The kernel path the backend's label and the grouped-MoE layers plan; read right after load, before any
    forward (the layers' `kernel_path` then follows what ran last)."""
    return KernelPath.planned(loaded.info.kernel_path, kernel_paths(loaded.model) if loaded.model is not None else "")


def kernel_ran(loaded: LoadedVariant, planned: KernelPath, device: str) -> tuple[KernelPath, dict[str, Any]]:
    """The kernel path of the forwards so far and the `extra` facts behind it (kernel_paths, media, fused_ops, pdl,
    cuda_graph; each only where it applies). Before any forward it is `planned`, with the engine's facts."""
    extra: dict[str, Any] = {}
    kernel = planned
    ran = kernel_paths_ran(loaded.model) if loaded.model is not None else ""
    if kernel.experts and ran and ran != kernel.experts:  # what ran, not only what was planned
        extra["kernel_paths"] = {"planned": kernel.experts, "ran": ran}
        kernel = kernel.model_copy(update={"experts": ran})
    report = loaded.engine.report()
    if report.media is not None:  # the media types the model read, and which video processor ran
        extra["media"] = report.media
    if report.server is not None:  # a remote server's own forward time: the stored latencies are the client's
        extra["server_timing"] = report.server
    if report.fused_ops:  # RMSNorm / rotary ran as quantbench's Triton kernels (quantbench.engine.fused.ops)
        extra["fused_ops"] = report.fused_ops
        kernel = kernel.model_copy(update={"fused": report.fused_ops})
    if loaded.model is not None and str(device).startswith("cuda"):  # quantbench's kernels launched early or not
        import torch  # lazy: only a CUDA device gets here, and torch is loaded by then

        extra["pdl"] = pdl.enabled(torch.device(device))
    if report.graphs is not None:  # a GPU run: say whether the timed forwards were graph replays
        extra["cuda_graph"] = report.graphs
        if report.graphs["replays"]:
            kernel = kernel.model_copy(update={"graphs": "partly" if report.graphs["eager_calls"] else "all"})
    return kernel, extra
