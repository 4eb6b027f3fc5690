"""Real model shapes with seeded random weights, for speed and memory runs (`run --shape`, `fixture --shape`):
the Qwen3-30B-A3B text shape (the Qwen3-Omni thinker's too), built straight on the target device, and its variants
quantized in memory. Their rows say `weights: synthetic`: latency and memory mean something, answers do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.moe.engine import (
    DenseExperts,
    GroupedMoE,
    install_grouped_moe,
    kernel_paths,
    reset_paths,
)
from quantbench.models.build import moe_config, new_model
from quantbench.models.calibration import calibration_prompt
from quantbench.models.checkpoint import SYNTHETIC_FILE
from quantbench.models.family import moe_layout
from quantbench.models.fixture import build_tokenizer

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
# The Qwen3-Omni-30B-A3B thinker's text decoder has the same shape.
SYNTHETIC_SHAPES["qwen3-omni-30b-a3b-thinker"] = SYNTHETIC_SHAPES["qwen3-30b-a3b"]


def synthetic_id(shape: str, layers: int | None = None, seed: int = 0) -> str:
    n = SYNTHETIC_SHAPES[shape]["num_hidden_layers"] if layers is None else layers
    return f"synthetic-{shape}-{n}l-seed{seed}"


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
    if shape not in SYNTHETIC_SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; known: {', '.join(sorted(SYNTHETIC_SHAPES))}")
    dims = dict(SYNTHETIC_SHAPES[shape])
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        dims["num_hidden_layers"] = layers
    tokenizer = build_tokenizer()
    config = moe_config(dims, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    # the fixture's tokenizer says 1024 tokens (the fixture's context); here prompts may be as long as the shape's
    tokenizer.model_max_length = config.max_position_embeddings
    model = new_model(config, device, dtype, seed, what=synthetic_id(shape, layers, seed)).eval()
    model.set_experts_implementation(experts_impl)
    model.quantbench_weights = "synthetic"  # read by the runner for the row's `weights` column
    model.quantbench_model_id = synthetic_id(shape, layers, seed)
    return model, tokenizer


def save_synthetic(shape: str, out_dir: Path, *, layers: int | None = None, seed: int = 0) -> Path:
    """Write a loadable synthetic checkpoint (safetensors + tokenizer + the synthetic marker file)."""
    out_dir = Path(out_dir)
    model, tokenizer = build_synthetic(shape, layers=layers, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    marker = {"model_id": synthetic_id(shape, layers, seed), "shape": shape,
              "layers": model.config.num_hidden_layers, "seed": seed}
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


def build_synthetic_quantized(shape: str, make: Any, *, layers: int | None, seed: int, device: str,
                              dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A random real-shape model whose experts are replaced by `make(weight [E, N, K], amax) -> format`, where amax
    is the input's absolute maximum seen by one calibration forward over rendered decision records."""
    model, tokenizer = build_synthetic(shape, layers=layers, device=device, dtype=dtype, seed=seed)
    install_grouped_moe(model, lambda i, ex: (_AmaxObserver(ex.gate_up_proj.data), _AmaxObserver(ex.down_proj.data)),
                        layout=moe_layout(model))
    with torch.inference_mode():
        model.get_decoder()(input_ids=calibration_prompt(tokenizer).to(device), use_cache=False)
    for moe in [m for m in model.modules() if isinstance(m, GroupedMoE)]:
        moe.gate_up = make(moe.gate_up.weight, moe.gate_up.amax)
        moe.down = make(moe.down.weight, moe.down.amax)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    reset_paths(model)  # the calibration forward ran the BF16 observers, not this format
    return model, tokenizer, kernel_paths(model)
