"""Real model shapes with seeded random weights, for speed and memory runs (`run --shape`, `fixture --shape`), built
straight on the target device from what their family declares (quantbench.models.families: the Qwen3-30B-A3B text
shape, the Qwen3-Omni-30B-A3B thinker with its towers, tokenizer and processor), and their variants quantized in
memory. Their rows say `weights: synthetic`: latency and memory mean something, answers do not.

They live with the readers, not with quantbench.make: a `--shape` run builds its model here, in the child, at load
time (the seed is its checkpoint), and a variant is quantized in memory by the engine's own weight formats (the
same classes that hold a loaded checkpoint's experts), never by a quantizing library."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.moe.engine import (
    DenseExperts,
    install_grouped_moe,
    kernel_paths,
    reset_paths,
)
from quantbench.models.build import InOrderFill, fill_random, refuse_if_too_big
from quantbench.models.calibration import calibration_prompt
from quantbench.models.families import moe_layout, shape_family, synthetic_shapes


def synthetic_id(shape: str, layers: int | None = None, seed: int = 0) -> str:
    n = synthetic_shapes()[shape]["num_hidden_layers"] if layers is None else layers
    return f"synthetic-{shape}-{n}l-seed{seed}"


def _family_config(shape: str, layers: int | None):
    """(the shape's family, its config, its tokenizer)."""
    family = shape_family(shape)  # ValueError naming the known shapes
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    config, tokenizer = family.synthetic_config(shape, layers)
    return family, config, tokenizer


def _mark(model, family: Any, shape: str, layers: int | None, seed: int) -> None:
    model.quantbench_weights = "synthetic"  # read by the runner for the row's `weights` column
    model.quantbench_model_id = synthetic_id(shape, layers, seed)
    for name, value in family.synthetic_marks().items():  # a media processor's settings: the family's engine reads them
        setattr(model, name, value)


def build_synthetic(
    shape: str = "qwen3-30b-a3b",
    *,
    layers: int | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    experts_impl: str = "grouped_mm",
):
    """A real-shape Qwen3MoeForCausalLM with seeded random weights made on `device`, and the fixture tokenizer
    (its ids are a subset of the real vocabulary; the model keeps vocab_size 151936). Weights are synthetic:
    latency and memory mean something, answers do not."""
    family, config, tokenizer = _family_config(shape, layers)
    what = synthetic_id(shape, layers, seed)
    text = config.get_text_config()
    model = family.synthetic_meta(config, dtype)
    refuse_if_too_big(what, sum(t.numel() for t in model.parameters()) * torch.finfo(dtype).bits / 8,
                      text.num_hidden_layers, device, f"{str(dtype).removeprefix('torch.')} weights")
    model = model.to_empty(device=device)
    fill_random(model, seed, text.initializer_range)
    family.synthetic_buffers(model, device)
    model.eval()
    model.set_experts_implementation(experts_impl)
    _mark(model, family, shape, layers, seed)
    return model, tokenizer


def _module_prefix(model, module) -> str:
    """The qualified name of `module` inside `model`, with a trailing dot ('' for the model itself)."""
    for name, m in model.named_modules():
        if m is module:
            return f"{name}." if name else ""
    raise ValueError("module not in model")


# -- quantized in memory -----------------------------------------------------------------------------------------
class _AmaxObserver(DenseExperts):
    """BF16 experts that record the absolute maximum of the activations entering them (one calibration pass)."""

    def __init__(self, weight: Tensor):
        super().__init__(weight)
        self.amax = torch.zeros((), dtype=torch.float32, device=weight.device)

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        if x_sorted.numel():
            self.amax = torch.maximum(self.amax, x_sorted.detach().abs().amax().float())
        return x_sorted


def build_synthetic_quantized(shape: str, make: Callable[[Tensor, Tensor | None], Any], *, layers: int | None,
                              seed: int, device: str, dtype: torch.dtype, expert_bits: float,
                              calibrate: bool = True) -> tuple[Any, Any, str]:
    """A random real-shape model whose experts are `make(weight [E, N, K], amax) -> format`, built layer by layer so
    the peak is the quantized model plus one layer of BF16 experts, not the whole BF16 model.

    The model starts on the meta device; its parameters are made in build_synthetic's order from the same seeded
    generator (InOrderFill), so every BF16 weight the quantizer sees equals build_synthetic's. With `calibrate`,
    amax is the input's absolute maximum over one calibration forward, as before, but that forward makes each
    layer just before it runs (a pre-hook) and quantizes its experts just after (a hook): the hidden states reaching
    layer i come from the same BF16 layers 0..i-1, so the amax values are the whole-model forward's. Without it
    (RTN int4) amax is None and no forward runs. `expert_bits`: bits per expert weight of the format, for the
    refusal before allocating when the variant cannot fit."""
    family, config, tokenizer = _family_config(shape, layers)
    what = synthetic_id(shape, layers, seed)
    model = family.synthetic_meta(config, dtype).eval()
    model.set_experts_implementation("grouped_mm")
    text = config.get_text_config()
    layout = moe_layout(model)
    experts = {ref.layer_index: ref for ref in layout.blocks}
    experts_numel = sum(p.numel() for ref in layout.blocks for p in ref.block.experts.parameters())
    rest_numel = sum(p.numel() for p in model.parameters()) - experts_numel
    one_layer = experts_numel / max(1, len(layout.blocks))
    # from here the blocks are reachable from `experts` alone, so popping one frees its BF16 experts
    layout = dataclasses.replace(layout, blocks=[])
    bits = torch.finfo(dtype).bits
    refuse_if_too_big(what, (rest_numel * bits + experts_numel * expert_bits + one_layer * bits) / 8,
                      text.num_hidden_layers, device, f"weights ({expert_bits:g}-bit experts)")
    decoder = model.get_decoder()
    at = _module_prefix(model, decoder)  # "model." (Qwen3-MoE), "model.language_model." (the Omni thinker, 5.21+)
    fill = InOrderFill(model, device, seed, text.initializer_range)
    fill.fill_through(f"{at}embed_tokens.")  # and, for the thinker, its towers, which come before it
    family.synthetic_buffers(model, device)

    def make_layer(i: int) -> None:
        """Layer i's parameters, its experts observed in BF16 (they still are: nothing has run them yet)."""
        fill.fill_through(f"{at}layers.{i}.")
        if i in experts:
            install_grouped_moe(model, lambda _, ex: (_AmaxObserver(ex.gate_up_proj.data),
                                                      _AmaxObserver(ex.down_proj.data)),
                                layout=dataclasses.replace(layout, blocks=[experts[i]]))

    def quantize_layer(i: int) -> None:
        """Layer i's experts to the format; dropping the block's last reference frees its BF16 experts."""
        ref = experts.pop(i, None)
        if ref is None:
            return
        moe = getattr(ref.parent, ref.attr)
        moe.gate_up = make(moe.gate_up.weight, moe.gate_up.amax if calibrate else None)
        moe.down = make(moe.down.weight, moe.down.amax if calibrate else None)
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()

    if calibrate:
        hooks = [decoder.norm.register_forward_pre_hook(lambda *_: fill.fill_through(f"{at}norm."))]
        for i, layer in enumerate(decoder.layers):
            hooks.append(layer.register_forward_pre_hook(lambda *_, i=i: make_layer(i)))
            hooks.append(layer.register_forward_hook(lambda *_, i=i: quantize_layer(i)))
        try:
            with torch.no_grad():
                decoder(input_ids=calibration_prompt(tokenizer).to(device), use_cache=False)
        finally:
            for hook in hooks:
                hook.remove()
    else:
        for i in range(len(decoder.layers)):
            make_layer(i)
            quantize_layer(i)
    fill.fill_through(None)
    if fill.todo or experts or any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise RuntimeError(f"{what}: the layer-by-layer build left parameters unmade")  # a bug here, not input
    reset_paths(model)  # the calibration forward ran the BF16 observers, not this format
    _mark(model, family, shape, layers, seed)
    return model, tokenizer, kernel_paths(model)
