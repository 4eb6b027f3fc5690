"""Programmatic dependent launch (PDL) for quantbench's Triton and Gluon kernels on Hopper and later GPUs.

Why: inside a CUDA graph a kernel is launched only once the kernel before it has finished, and its programs then
start from nothing: at the 30B shape one decoder layer is about 16 launches, and the graph's replay took ~25 µs
per layer more than its kernels' sum (docs/BENCHMARKS.md, fifth H200 session). With PDL a kernel launched with
the attribute may start while the one before it still runs: its programs become resident as the earlier kernel's
last ones retire and wait there (`griddepcontrol.wait`) until that kernel has completed and its writes are
visible. Measured on the H200 (eighth session): INT4 11.7-12.0 ms per 512-token decision against 12.1-12.2 without,
FP8 10.5 against 10.8; identical logits.

The rule every quantbench kernel keeps, so that nothing changes but the timing: a kernel launched with PDL waits
first, before it reads or writes any memory, and only then lets the next kernel launch
(`griddepcontrol.launch_dependents`). Each kernel therefore still runs after everything before it has completed,
as without PDL (a kernel's wait returns once the kernel before it completed, which itself waited for the one before
it), and computes the same bits. Kernels of other libraries (cuBLAS, flash attention) launch as before: PDL is a
property of the later kernel's launch, and only quantbench's kernels, which wait, are given it.

`launch_args(device)` gives a launch both halves together (the kernel's PDL constexpr and Triton's `launch_pdl`),
so a kernel is never launched early without its wait. Off with QUANTBENCH_PDL=0; never on CPUs, GPUs before
compute capability 9.0, or under Triton's interpreter (the tests), where the kernels compile without the wait.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

ENV = "QUANTBENCH_PDL"


def enabled(device: torch.device) -> bool:
    """Whether quantbench's kernels on `device` launch with PDL."""
    if device.type != "cuda" or os.environ.get(ENV, "1") == "0" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0) and _gdc() is not None


@functools.cache
def _gdc() -> tuple[Any, Any] | None:
    """Triton's grid dependency control (wait, launch_dependents), or None in a Triton without it (before 3.3):
    its kernels then launch as before."""
    try:  # lazy: optional Triton, and these exist from Triton 3.3 on (this module sits below triton_common)
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:
        return None
    return gdc_wait, gdc_launch_dependents


def launch_args(device: torch.device) -> dict[str, Any]:
    """Keyword arguments for a kernel launch on `device`: its PDL constexpr and, when on, Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@functools.cache
def triton_open() -> Any:
    """`pdl_open(PDL)`: the first statement of a Triton kernel launched with launch_args."""
    # lazy: Triton is optional; triton_common (which imports this module) calls this only where it is installed
    import triton
    import triton.language as tl

    gdc_wait, gdc_launch_dependents = _gdc() or (None, None)  # without them PDL is never on (enabled())
    # Triton resolves a jitted function's callees through its module's globals
    globals().update(tl=tl, gdc_wait=gdc_wait, gdc_launch_dependents=gdc_launch_dependents)

    @triton.jit
    def pdl_open(ON: tl.constexpr):
        if ON:
            gdc_wait()  # the kernel before has completed and its writes are visible
            gdc_launch_dependents()  # the next kernel may now launch (its programs wait in turn)

    return pdl_open


@functools.cache
def gluon_open() -> Any:
    """`pdl_open(PDL)` for Gluon kernels (a Gluon kernel cannot call a Triton function)."""
    # lazy: Gluon exists only in recent Triton builds; the Gluon kernels (sm_90 only) call this
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    globals().update(gl=gl)

    @gluon.jit
    def pdl_open_gluon(ON: gl.constexpr):
        if ON:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)

    return pdl_open_gluon
