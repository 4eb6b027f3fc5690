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


def fill_random(model: torch.nn.Module, seed: int, std: float) -> None:
    """Seeded N(0, std) weights and unit norms, generated on the parameters' own device."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, std, generator=gen)


def free_bytes(device: str | torch.device) -> int:
    """Memory a new allocation can take on `device`: free GPU memory, or the host's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def new_model(config, device: str | torch.device, dtype: torch.dtype, seed: int, what: str | None = None):
    """A Qwen3MoeForCausalLM allocated directly on `device` (no CPU init pass), filled from a seeded generator.
    With `what` (a synthetic model's name), refuse before allocating when its weights cannot fit: a 61 GB model
    on a 24 GiB host would otherwise be killed by the kernel with no message."""
    from transformers import Qwen3MoeForCausalLM  # lazy: as in moe_config

    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    if what is not None:
        need = sum(t.numel() for t in model.parameters()) * torch.finfo(dtype).bits // 8
        free = free_bytes(device)
        if need > free:
            per_layer = need / config.num_hidden_layers
            fit = int(free // per_layer) - 1
            raise UnsupportedError(
                f"{what}: its {str(dtype).removeprefix('torch.')} weights need {need / 2**30:.1f} GiB on {device}, {free / 2**30:.1f} GiB is "
                f"free; give --layers N (about {per_layer / 2**30:.2f} GiB each"
                + (f"; at most {fit} here)" if fit >= 1 else ")"))
    model = model.to(dtype=dtype).to_empty(device=device)
    fill_random(model, seed, config.initializer_range)
    # to_empty leaves buffers uninitialised: recompute the rotary frequencies on the device.
    rotary = type(model.model.rotary_emb)(config)
    model.model.rotary_emb = rotary.to(device)
    return model
