"""Fused kernels for every backend's transformers model on a GPU: `install` swaps in quantbench.engine.fused.ops'
RMSNorm, rotary and q/k/v kernels where a probe shows they match, then quantbench.engine.fused.layer's decoder-layer
and attention forwards (the residual adds and q/k norms folded into those kernels). It lives here, above both
modules, so that ops never imports layer."""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from quantbench.engine.fused import layer, ops
from quantbench.engine.triton_common import triton


def install(model: nn.Module, mode: str = "auto") -> str | None:
    """Swap in the fused kernels where they match (CUDA only); returns what was swapped, or None."""
    if mode not in ops.MODES:
        raise ValueError(f"fused ops mode {mode!r}: use one of {', '.join(ops.MODES)}")
    params = list(model.parameters())
    if mode == "off" or not params or params[0].device.type != "cuda":
        return None
    if triton is None:
        return None
    swapped = []
    dtype = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    norms = [m for m in model.modules() if ops.is_rms_norm(m)]
    checked: dict[type, bool] = {}
    for m in norms:
        if type(m) not in checked:
            checked[type(m)] = ops.probe("rmsnorm", ops._norm_matches, m, dtype)
        if checked[type(m)]:
            m.forward = functools.partial(ops._norm_forward, m)
    if any(checked.values()):
        swapped.append("rmsnorm")
    # Attention calls the modeling module's global apply_rotary_pos_emb: it is swapped there, for the whole process
    # (a run is one process); the wrapper still hands CPU tensors and unusual shapes to the original.
    modules = {sys.modules[type(m).__module__] for m in model.modules() if type(m).__name__.endswith("Attention")}
    for mod in modules:
        fn = getattr(mod, "apply_rotary_pos_emb", None)
        if fn is None:
            continue
        if getattr(fn, ops._PATCHED, None) is None:
            if not ops.probe("rope", ops._rope_matches, fn, params[0].device):
                continue
            mod.apply_rotary_pos_emb = ops._fused_rope(fn)
        swapped.append("rope")
    if _install_qkv(model):
        swapped.append("qkv")
    if "rmsnorm" in swapped:  # the adds and q/k norms folded into these kernels (quantbench.engine.fused.layer)
        swapped += layer.install(model)
    return "+".join(swapped) or None


def _install_qkv(model: nn.Module) -> bool:
    """fuse_qkv on every attention whose class passes the probe (probed once per class, as the norms are)."""
    return ops.swap_per_class("qkv", model.modules(), ops.fuse_qkv, ops._qkv_matches, ops.unfuse_qkv)
