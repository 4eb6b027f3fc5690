"""What the quantized backends share: the device and dtype a RunSpec asks for,
loading a quantized checkpoint with quantbench's loader, and synthetic real-shape models with quantized experts.

Backends never import each other; what two of them need lives here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.moe.engine import DenseExperts, install_grouped_moe, kernel_paths
from quantbench.errors import ConfigError
from quantbench.models.checkpoint import model_identity
from quantbench.run.spec import RunSpec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def device_of(spec: RunSpec) -> str:
    return spec.device or ("cuda:0" if torch.cuda.is_available() else "cpu")


def dtype_of(spec: RunSpec) -> torch.dtype:
    if spec.dtype not in DTYPES:
        raise ConfigError(f"--dtype {spec.dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[spec.dtype]


def load_checkpoint(spec: RunSpec, scheme: str, *, mode: str = "packed", activations: bool = True) -> dict[str, Any]:
    """Load spec.model (or the default model's cached variant) with quantbench's loader; the run row's fields."""
    from transformers import AutoTokenizer

    from quantbench.models.modelopt import load_quantized

    if not spec.options.fast_moe:
        raise ConfigError(f"--no-fast-moe: transformers has no {scheme} path of its own for these checkpoints; "
                          "quantbench's loader always runs them in its grouped-MoE engine")
    if spec.model:
        path = Path(spec.model)
    else:
        from quantbench.models.quantize import default_variant

        path = default_variant(scheme)
    loaded = load_quantized(path, scheme=scheme, mode=mode, activations=activations, dtype=dtype_of(spec),
                            device=device_of(spec), trust_remote_code=spec.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    ident = model_identity(path)
    source_hash = ident.pop("source_model_hash", None)
    return {"model": loaded.model, "tokenizer": tokenizer, "layout": loaded.layout, "path": path, "ident": ident,
            "extra": {"source_model_hash": source_hash, "producer": loaded.layout.producer,
                      "quantized_dense_linears": len(loaded.quantized_linears)}}


# -- synthetic real-shape models ------------------------------------------------------------------------------------
class _AmaxObserver(DenseExperts):
    """BF16 experts that record the absolute maximum of the activations entering them (one calibration pass)."""

    def __init__(self, weight: Tensor):
        super().__init__(weight)
        self.amax = torch.zeros((), dtype=torch.float32, device=weight.device)

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        if x_sorted.numel():
            self.amax = torch.maximum(self.amax, x_sorted.detach().abs().amax().float())
        return x_sorted


def calibration_prompt(tokenizer: Any, seqlen: int = 512) -> Tensor:
    """One packed text of train-split decision records, as the quantizers calibrate on, as input ids."""
    from quantbench.models.quantize import calibration_texts

    text = calibration_texts(tokenizer, 1, seqlen)[0]
    return tokenizer(text, add_special_tokens=False, return_tensors="pt", truncation=True, max_length=seqlen)["input_ids"]


def build_synthetic_quantized(spec: RunSpec, make: Any, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A random real-shape model whose experts are replaced by `make(weight [E, N, K], amax) -> format`, where amax
    is the input's absolute maximum seen by one calibration forward over rendered decision records."""
    from quantbench.models.fixture import build_synthetic

    device = device_of(spec)
    model, tokenizer = build_synthetic(spec.shape, layers=spec.layers, device=device, dtype=dtype, seed=spec.seed)
    install_grouped_moe(model, lambda i, ex: (_AmaxObserver(ex.gate_up_proj.data), _AmaxObserver(ex.down_proj.data)))
    with torch.inference_mode():
        model.get_decoder()(input_ids=calibration_prompt(tokenizer).to(device), use_cache=False)
    from quantbench.engine.moe.engine import GroupedMoE, reset_paths

    for moe in [m for m in model.modules() if isinstance(m, GroupedMoE)]:
        moe.gate_up = make(moe.gate_up.weight, moe.gate_up.amax)
        moe.down = make(moe.down.weight, moe.down.amax)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    reset_paths(model)  # the calibration forward ran the BF16 observers, not this format
    return model, tokenizer, kernel_paths(model)


