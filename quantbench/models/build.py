"""Building a Qwen3-MoE model in memory, shared by the embedded fixture (trained) and the synthetic real shapes
(random weights): its config from a shape, allocated straight on the device, filled from a seeded generator."""

from __future__ import annotations

from typing import Any

import psutil
import torch

from quantbench.errors import UnsupportedError


def moe_config(shape: dict[str, Any], **extra: Any):
    """The Qwen3MoeConfig of a shape (the fixture's MODEL, a SYNTHETIC_SHAPES entry): every layer sparse."""
    # lazy: transformers takes seconds to import, and `quantbench backends` imports every backend (and so this
    # module) only to ask what it can do here
    from transformers import Qwen3MoeConfig

    shape = dict(shape)
    rope = {"rope_type": "default", "rope_theta": shape.pop("rope_theta")}
    return Qwen3MoeConfig(**shape, rope_parameters=rope, decoder_sparse_step=1, mlp_only_layers=[], **extra)


def _fill_one(name: str, t: torch.Tensor, gen: torch.Generator, std: float) -> None:
    if name.endswith("norm.weight"):
        t.fill_(1.0)
    else:
        t.normal_(0.0, std, generator=gen)


def fill_random(model: torch.nn.Module, seed: int, std: float) -> None:
    """Seeded N(0, std) weights and unit norms, generated on the parameters' own device."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        _fill_one(name, p.data, gen, std)


class InOrderFill:
    """fill_random, one stretch of parameters at a time: a meta model's parameters are made on `device` and filled
    in named_parameters() order from the same seeded generator, so every value equals fill_random's, while the
    caller may quantize (and so free) what it has before the rest exists."""

    def __init__(self, model: torch.nn.Module, device: str | torch.device, seed: int, std: float):
        self.model, self.device, self.std = model, torch.device(device), std
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.todo = [name for name, _ in model.named_parameters()]

    def fill_through(self, prefix: str | None = None) -> None:
        """Make every parameter up to and including the last one named `prefix...` (all that are left: None)."""
        hits = [k for k, name in enumerate(self.todo) if prefix is None or name.startswith(prefix)]
        for name in self.todo[: hits[-1] + 1 if hits else 0]:
            owner, _, attr = name.rpartition(".")
            module = self.model.get_submodule(owner)
            meta = module._parameters[attr]
            t = torch.empty_like(meta, device=self.device)  # to_empty's allocation: same shape and strides
            _fill_one(name, t, self.gen, self.std)
            module._parameters[attr] = torch.nn.Parameter(t, requires_grad=meta.requires_grad)
        del self.todo[: hits[-1] + 1 if hits else 0]


def free_bytes(device: str | torch.device) -> int:
    """Memory a new allocation can take on `device`: free GPU memory, or the host's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def new_model(config, device: str | torch.device, dtype: torch.dtype, seed: int, what: str | None = None):
    """A Qwen3MoeForCausalLM allocated directly on `device` (no CPU init pass), filled from a seeded generator.
    With `what` (a synthetic model's name), refuse before allocating when its weights cannot fit."""
    model = meta_model(config, dtype)
    if what is not None:
        refuse_if_too_big(what, sum(t.numel() for t in model.parameters()) * torch.finfo(dtype).bits / 8,
                          config.num_hidden_layers, device, f"{str(dtype).removeprefix('torch.')} weights")
    model = model.to_empty(device=device)
    fill_random(model, seed, config.initializer_range)
    new_rotary(model, device)
    return model


def meta_model(config, dtype: torch.dtype):
    """A Qwen3MoeForCausalLM on the meta device (no memory yet), its parameters typed `dtype`."""
    from transformers import Qwen3MoeForCausalLM  # lazy: as in moe_config

    with torch.device("meta"):
        return Qwen3MoeForCausalLM(config).to(dtype=dtype)


def new_rotary(model, device: str | torch.device) -> None:
    """The rotary frequencies, computed on the device: to_empty (or a meta model) leaves that buffer without values."""
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config).to(device)


def refuse_if_too_big(what: str, need: float, layers: int, device: str | torch.device, weights: str) -> None:
    """UnsupportedError before allocating when `need` bytes cannot fit on `device`: a 61 GB model on a 24 GiB host
    would otherwise be killed by the kernel with no message."""
    free = free_bytes(device)
    if need > free:
        per_layer = need / layers
        fit = int(free // per_layer) - 1
        raise UnsupportedError(
            f"{what}: its {weights} need {need / 2**30:.1f} GiB on {device}, {free / 2**30:.1f} GiB is "
            f"free; give --layers N (about {per_layer / 2**30:.2f} GiB each"
            + (f"; at most {fit} here)" if fit >= 1 else ")"))
