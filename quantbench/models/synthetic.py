"""Real model shapes with seeded random weights, for speed and memory runs (`run --shape`, `fixture --shape`):
the Qwen3-30B-A3B text shape and the Qwen3-Omni-30B-A3B thinker (quantbench.models.families.qwen3_omni.synthetic: its towers,
tokenizer and processor), built straight on the target device, and their variants quantized in memory. Their rows
say `weights: synthetic`: latency and memory mean something, answers do not."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.moe.engine import (
    DenseExperts,
    install_grouped_moe,
    kernel_paths,
    reset_paths,
)
from quantbench.models.build import (
    InOrderFill,
    fill_random,
    meta_model,
    moe_config,
    new_model,
    new_rotary,
    refuse_if_too_big,
)
from quantbench.models.calibration import calibration_prompt
from quantbench.models.checkpoint import SYNTHETIC_FILE
from quantbench.models.families import moe_layout
from quantbench.models.families.qwen3_omni.synthetic import OMNI_SHAPES, is_omni_shape, module_prefix
from quantbench.models.tokenizer import build_tokenizer

# Real model shapes for speed / memory runs with random weights (text decoder only).
SYNTHETIC_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "intermediate_size": 6144,
        "norm_topk_prob": True,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
    },
}
# The Qwen3-Omni-30B-A3B thinker: its text decoder's dims here (what --layers and the names read); the whole
# thinker (vocab 152064, 3-D rope, the vision and audio towers) is synthetic_omni's.
for _name, _dims in OMNI_SHAPES.items():
    SYNTHETIC_SHAPES[_name] = _dims["text"]


def synthetic_id(shape: str, layers: int | None = None, seed: int = 0) -> str:
    n = SYNTHETIC_SHAPES[shape]["num_hidden_layers"] if layers is None else layers
    return f"synthetic-{shape}-{n}l-seed{seed}"


def _config_and_tokenizer(shape: str, layers: int | None):
    if shape not in SYNTHETIC_SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; known: {', '.join(sorted(SYNTHETIC_SHAPES))}")
    if layers is not None and layers < 1:
        raise ValueError(f"layers must be at least 1, got {layers}")
    if is_omni_shape(shape):
        from quantbench.models.families.qwen3_omni.synthetic import omni_tokenizer, thinker_config

        tokenizer = omni_tokenizer()
        return thinker_config(shape, layers, tokenizer.pad_token_id, tokenizer.eos_token_id), tokenizer
    dims = dict(SYNTHETIC_SHAPES[shape])
    if layers is not None:
        dims["num_hidden_layers"] = layers
    tokenizer = build_tokenizer()
    config = moe_config(dims, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    # the fixture's tokenizer says 1024 tokens (the fixture's context); here prompts may be as long as the shape's
    tokenizer.model_max_length = config.max_position_embeddings
    return config, tokenizer


def _mark(model, shape: str, layers: int | None, seed: int) -> None:
    model.quantbench_weights = "synthetic"  # read by the runner for the row's `weights` column
    model.quantbench_model_id = synthetic_id(shape, layers, seed)
    if is_omni_shape(shape):  # what models.processor.decision_engine builds the media processor from
        from quantbench.models.families.qwen3_omni.synthetic import processor_settings

        model.quantbench_processor_settings = processor_settings()


def _meta(config, dtype: torch.dtype):
    """The shape's model on the meta device: a Qwen3-Omni thinker or a Qwen3MoeForCausalLM."""
    if getattr(config, "model_type", None) == "qwen3_omni_moe_thinker":
        from quantbench.models.families.qwen3_omni.synthetic import meta_thinker

        return meta_thinker(config, dtype)
    return meta_model(config, dtype)


def _new_buffers(model, device) -> None:
    """The computed buffers (rotary frequencies, the audio sinusoids) a meta model has no values for."""
    if getattr(model.config, "model_type", None) == "qwen3_omni_moe_thinker":
        from quantbench.models.families.qwen3_omni.synthetic import new_buffers

        new_buffers(model, device)
    else:
        new_rotary(model, device)


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
    config, tokenizer = _config_and_tokenizer(shape, layers)
    what = synthetic_id(shape, layers, seed)
    if is_omni_shape(shape):
        model = _meta(config, dtype)
        refuse_if_too_big(what, sum(t.numel() for t in model.parameters()) * torch.finfo(dtype).bits / 8,
                          config.get_text_config().num_hidden_layers, device,
                          f"{str(dtype).removeprefix('torch.')} weights")
        model = model.to_empty(device=device)
        fill_random(model, seed, config.get_text_config().initializer_range)
        _new_buffers(model, device)
        model.eval()
    else:
        model = new_model(config, device, dtype, seed, what=what).eval()
    model.set_experts_implementation(experts_impl)
    _mark(model, shape, layers, seed)
    return model, tokenizer


def save_synthetic(shape: str, out_dir: Path, *, layers: int | None = None, seed: int = 0) -> Path:
    """Write a loadable synthetic checkpoint (safetensors + tokenizer + the synthetic marker file)."""
    out_dir = Path(out_dir)
    model, tokenizer = build_synthetic(shape, layers=layers, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if is_omni_shape(shape):  # the processor files a real Omni checkpoint ships: media reads as from that one
        from quantbench.models.families.qwen3_omni.synthetic import preprocessor_json

        (out_dir / "preprocessor_config.json").write_text(preprocessor_json())
    marker = {"model_id": synthetic_id(shape, layers, seed), "shape": shape,
              "layers": model.config.get_text_config().num_hidden_layers, "seed": seed}
    (out_dir / SYNTHETIC_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    return out_dir


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
    config, tokenizer = _config_and_tokenizer(shape, layers)
    what = synthetic_id(shape, layers, seed)
    model = _meta(config, dtype).eval()
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
    at = module_prefix(model, decoder)  # "model." (Qwen3-MoE), "model.language_model." (the Omni thinker, 5.21+)
    fill = InOrderFill(model, device, seed, text.initializer_range)
    fill.fill_through(f"{at}embed_tokens.")  # and, for the thinker, its towers, which come before it
    _new_buffers(model, device)

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
    _mark(model, shape, layers, seed)
    return model, tokenizer, kernel_paths(model)
