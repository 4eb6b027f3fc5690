"""NVFP4 (W4A4): ModelOpt, compressed-tensors or auto-round NVFP4 checkpoints, read by quantbench.modelopt_loader
(transformers cannot run them) into quantbench's grouped-MoE engine.

`--nvfp4 packed` (default): the experts stay packed in memory (4.5 bits per weight with their scales) and are
decoded on the fly per layer (a fused Triton grouped GEMM on CUDA, vectorised torch on the CPU).
`--nvfp4 unpacked`: dequantized to BF16 once at load: weights memory about BF16's, the same answers.
`--nvfp4-activations on` (default) fake-quantizes every quantized layer's input as ModelOpt's fake-quant forward
does (the A4 of W4A4); `off` runs weight-only (W4A16, what vLLM's Hopper path does). Both are recorded.
No GPU here has a native NVFP4 path in quantbench: Blackwell has FP4 tensor cores (the availability says a
native path would apply there), every run emulates and says so.

`--model` unset: the embedded default model's NVFP4 variant, quantized once with ModelOpt and cached.
`--shape`: a real-shape model with random weights, quantized in memory by quantbench's port of ModelOpt's NVFP4
quantizer (bit-identical on the same weights; see tests/test_nvfp4.py), activation scales from one calibration
forward: speed and memory only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.backend import Availability, LoadedVariant, RunSpec, VariantInfo, dir_bytes
from quantbench.checkpoint import model_identity
from quantbench.errors import ConfigError
from quantbench.moe.engine import DenseExperts, experts_nbytes, install_grouped_moe, kernel_paths
from quantbench.scoring import TransformersEngine

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def device_of(spec: RunSpec) -> str:
    return spec.device or ("cuda:0" if torch.cuda.is_available() else "cpu")


def dtype_of(spec: RunSpec) -> torch.dtype:
    if spec.dtype not in DTYPES:
        raise ConfigError(f"--dtype {spec.dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[spec.dtype]


def engine_for(model: Any, tokenizer: Any, spec: RunSpec) -> TransformersEngine:
    return TransformersEngine(model, tokenizer, max_options=spec.max_options, max_tokens=spec.max_tokens,
                              truncate=spec.truncate, method=spec.method)


def load_checkpoint(spec: RunSpec, scheme: str, *, mode: str = "packed", activations: bool = True) -> dict[str, Any]:
    """Load spec.model (or the default model's cached variant) with quantbench's loader; the run row's fields."""
    from transformers import AutoTokenizer

    from quantbench.modelopt_loader import load_quantized

    if not spec.fast_moe:
        raise ConfigError(f"--no-fast-moe: transformers has no {scheme} path of its own for these checkpoints; "
                          "quantbench's loader always runs them in its grouped-MoE engine")
    if spec.model:
        path = Path(spec.model)
    else:
        from quantbench.quantize import default_variant

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
    from quantbench.quantize import calibration_texts

    text = calibration_texts(tokenizer, 1, seqlen)[0]
    return tokenizer(text, add_special_tokens=False, return_tensors="pt", truncation=True, max_length=seqlen)["input_ids"]


def build_synthetic_quantized(spec: RunSpec, make: Any, dtype: torch.dtype) -> tuple[Any, Any, str]:
    """A random real-shape model whose experts are replaced by `make(weight [E, N, K], amax) -> format`, where amax
    is the input's absolute maximum seen by one calibration forward over rendered decision records."""
    from quantbench.fixture import build_synthetic

    device = device_of(spec)
    model, tokenizer = build_synthetic(spec.shape, layers=spec.layers, device=device, dtype=dtype, seed=spec.seed)
    install_grouped_moe(model, lambda i, ex: (_AmaxObserver(ex.gate_up_proj.data), _AmaxObserver(ex.down_proj.data)))
    with torch.inference_mode():
        model.get_decoder()(input_ids=calibration_prompt(tokenizer).to(device), use_cache=False)
    from quantbench.moe.engine import GroupedMoE

    for moe in [m for m in model.modules() if isinstance(m, GroupedMoE)]:
        moe.gate_up = make(moe.gate_up.weight, moe.gate_up.amax)
        moe.down = make(moe.down.weight, moe.down.amax)
        moe.kernel_path = moe.planned_path(torch.device(device))
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return model, tokenizer, kernel_paths(model)


# -- the backend ----------------------------------------------------------------------------------------------------
class Nvfp4Backend:
    name = "nvfp4"
    summary = "NVFP4 W4A4 (ModelOpt / compressed-tensors / auto-round); packed (fused Triton on CUDA) or unpacked"

    def availability(self, machine) -> Availability:
        if machine.gpu_family == "blackwell":
            return Availability(True, "native", f"{machine.gpu_name}: FP4 tensor cores, a native path would apply; "
                                "quantbench emulates (packed weights decoded in its grouped GEMM)")
        where = machine.gpu_name if machine.has_gpu else "CPU"
        from quantbench.moe.nvfp4 import triton_available

        path = "triton-fused-nvfp4" if machine.has_gpu and triton_available() else (
            "dequant+grouped_mm" if machine.has_gpu else "cpu-vectorised")
        return Availability(True, "emulated", f"{where}: no FP4 tensor cores; emulated ({path}), activations "
                            "fake-quantized unless --nvfp4-activations off")

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        mode, acts = spec.nvfp4_mode, spec.nvfp4_activations
        if mode not in ("packed", "unpacked"):
            raise ConfigError(f"--nvfp4 {mode!r}: use packed (experts stay 4-bit) or unpacked (BF16 at load)")
        if acts not in ("on", "off"):
            raise ConfigError(f"--nvfp4-activations {acts!r}: use on (W4A4 emulation) or off (weights only)")
        dtype = dtype_of(spec)
        if spec.shape:
            fields = self._synthetic(spec, dtype, mode, acts == "on")
        else:
            got = load_checkpoint(spec, "nvfp4", mode=mode, activations=acts == "on")
            layout = got["layout"]
            fields = {"model": got["model"], "tokenizer": got["tokenizer"], "weight_format": layout.weight_format,
                      "disk_bytes": dir_bytes(got["path"]), "extra": got["extra"], "load_note": "", **got["ident"]}
        model = fields.pop("model")
        engine = engine_for(model, fields.pop("tokenizer"), spec)
        blackwell = getattr(machine, "gpu_family", "cpu") == "blackwell"
        extra = {**fields.pop("extra"), "nvfp4_mode": mode, "nvfp4_activations": acts,
                 "native_fp4_hardware": blackwell}
        if mode == "unpacked":
            fields["weight_format"] += "; unpacked to BF16 at load (weights memory about BF16's)"
        info = VariantInfo(
            variant=f"nvfp4-{mode}",
            kernel_path=f"quantbench grouped-moe {kernel_paths(model)}",
            compute_dtype=spec.dtype,
            native="emulated",
            experts_bytes=experts_nbytes(model),
            extra=extra,
            **fields,
        )
        return LoadedVariant(engine=engine, info=info, model=model)

    def _synthetic(self, spec: RunSpec, dtype: torch.dtype, mode: str, activations: bool) -> dict[str, Any]:
        from quantbench.fixture import synthetic_id
        from quantbench.moe.nvfp4 import Nvfp4Experts, global_scale_of

        def make(weight: Tensor, amax: Tensor):
            fmt = Nvfp4Experts.from_weights(weight, input_scale=global_scale_of(amax).reshape(1), activations=activations)
            return fmt.unpacked(dtype) if mode == "unpacked" else fmt

        model, tokenizer, _ = build_synthetic_quantized(spec, make, dtype)
        acts = "w4a4" if activations else "w4a16"
        return {"model": model, "tokenizer": tokenizer, "weight_format": f"nvfp4 {acts} g16 (quantbench's ModelOpt "
                "port, in memory)", "model_id": synthetic_id(spec.shape, spec.layers, spec.seed),
                "model_hash": f"seed:{spec.seed}", "weights": "synthetic", "extra": {},
                "load_note": "random weights built in memory and NVFP4-quantized by quantbench (ModelOpt's "
                             "algorithm; activation scales from one calibration forward); speed and memory only"}
