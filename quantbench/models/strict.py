"""Strict meta-device loading: a model built on the meta device (no weights are ever made) gets every tensor from
the checkpoint's *.safetensors, or the load is refused with a LoadError naming the tensor (missing, left over,
misshapen). Shared by the NVFP4 / FP8 loader (models/modelopt.py) and the families transformers cannot load
itself (models/family.py: Qwen3-Omni-MoE)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from quantbench.errors import LoadError
from quantbench.models.checkpoint import check_safetensors_only, weight_files


class Checkpoint:
    """Every tensor of a safetensors checkpoint by name, read on demand; remembers which were used."""

    def __init__(self, root: Path, device: str, rename: Callable[[str], str | None] | None = None):
        """`rename` maps a checkpoint key to the model's module name (a family with several key layouts), or to
        None for a tensor that is never read (an omni checkpoint's talker); tensors are then taken by that name."""
        from safetensors import safe_open

        check_safetensors_only(root)
        self.root = root
        self.files: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        self.key: dict[str, str] = {}  # name -> the checkpoint's own key
        self.unread: list[str] = []  # checkpoint keys never read (rename gave None)
        for f in sorted(f for f in root.glob("*.safetensors") if f.name not in weight_files(root)):  # not the scorer's
            handle = safe_open(str(f), framework="pt", device=device)
            self.files[f.name] = handle
            for key in handle.keys():
                name = rename(key) if rename else key
                if name is None:
                    self.unread.append(key)
                    continue
                if name in self.where:
                    raise LoadError(f"{root}: tensor {key} is in both {self.where[name]} and {f.name}"
                                    + (f" (as {self.key[name]})" if self.key[name] != key else ""))
                self.where[name] = f.name
                self.key[name] = key
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def take(self, key: str, what: str = "") -> Tensor:
        if key not in self.where:
            raise LoadError(f"{self.root}: tensor {key} is missing{' (' + what + ')' if what else ''}; the checkpoint "
                            "is incomplete or not in the layout its config.json declares")
        self.used.add(key)
        return self.files[self.where[key]].get_tensor(self.key[key])

    def maybe(self, key: str) -> Tensor | None:
        return self.take(key) if key in self.where else None

    def unused(self) -> list[str]:
        return sorted(self.key[n] for n in set(self.where) - self.used)


def stacked_experts(ck: Checkpoint, prefix: str, num_experts: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Per-expert BF16 tensors under `prefix` (`<block>.experts`) stacked as transformers fuses them:
    gate_up [E, 2I, H] (gate rows, then up rows) and down [E, H, I]."""
    def w(e: int, p: str) -> Tensor:
        return ck.take(f"{prefix}.{e}.{p}.weight").to(dtype)

    gate_up = torch.stack([torch.cat([w(e, "gate_proj"), w(e, "up_proj")]) for e in range(num_experts)])
    down = torch.stack([w(e, "down_proj") for e in range(num_experts)])
    return gate_up, down


def fill_remaining(model: nn.Module, ck: Checkpoint, dtype: torch.dtype, built: set[int]) -> None:
    """Every parameter and persistent buffer not built above gets its tensor from the checkpoint, or the load fails."""
    owners: dict[int, list[tuple[nn.Module, str, str, bool]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((module, pname, f"{mname}.{pname}".lstrip("."), True))
        for bname, b in module.named_buffers(recurse=False):
            if b is None or bname in module._non_persistent_buffers_set:
                continue
            owners.setdefault(id(b), []).append((module, bname, f"{mname}.{bname}".lstrip("."), False))
    missing = []
    for tid, places in owners.items():
        if tid in built:
            continue
        names = [n for _, _, n, _ in places]
        key = next((n for n in names if n in ck), None)
        if key is None:
            missing.append(names[0])
            continue
        current = places[0][0]._parameters.get(places[0][1]) if places[0][3] else places[0][0]._buffers[places[0][1]]
        t = ck.take(key)
        for other in names:  # tied weights: every alias the checkpoint also stores is used up
            if other in ck:
                ck.take(other)
        if tuple(t.shape) != tuple(current.shape):
            raise LoadError(f"tensor {key}: shape {tuple(t.shape)}, the model expects {tuple(current.shape)}")
        if t.is_floating_point():
            t = t.to(current.dtype)
        value = nn.Parameter(t, requires_grad=False) if places[0][3] else t
        for module, attr, _, is_param in places:
            (module._parameters if is_param else module._buffers)[attr] = value
    if missing:
        shown = ", ".join(missing[:6]) + (f" … (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        raise LoadError(f"{ck.root}: the checkpoint has no tensor for {shown}; refusing to run with made-up weights")


def init_computed_buffers(model: nn.Module, device: str) -> None:
    """Non-persistent buffers (rotary inv_freq) are computed, not stored: transformers' own init computes them."""
    for name, module in model.named_modules():
        metas = [b for b, t in module._buffers.items() if t is not None and t.is_meta]
        if not metas:
            continue
        if any(True for _ in module.parameters(recurse=False)):
            raise LoadError(f"{name}: computed buffers {metas} on a module with weights; cannot initialise them safely")
        for b in metas:
            module._buffers[b] = torch.empty_like(module._buffers[b], device=device)
        model._init_weights(module)


def finish(model: nn.Module, ck: Checkpoint, dtype: torch.dtype, device: str, built_ids: set[int]) -> None:
    """Fill what is not built yet (`built_ids`: tensors already made), compute the computed buffers, and refuse a
    checkpoint with tensors left over; the model ends on `device`, in eval mode."""
    fill_remaining(model, ck, dtype, built_ids)
    init_computed_buffers(model, device)
    left = ck.unused()
    if left:
        shown = ", ".join(left[:6]) + (f" … (+{len(left) - 6} more)" if len(left) > 6 else "")
        raise LoadError(f"{ck.root}: tensors the model has no place for: {shown}; the checkpoint does not match its "
                        "config")
    model.to(device)
    model.eval()
