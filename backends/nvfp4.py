"""NVFP4 (W4A4): ModelOpt, compressed-tensors or auto-round NVFP4 checkpoints, read by quantbench.models.modelopt
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

from typing import TYPE_CHECKING, Any, Literal

from quantbench.errors import ConfigError
from quantbench.run.backend import Availability, LoadedVariant, dir_bytes, model_dir
from quantbench.run.record import VariantInfo
from quantbench.run.spec import GroupedMoeOptions, RunSpec, opt

if TYPE_CHECKING:
    import torch
    from torch import Tensor


# -- the backend ----------------------------------------------------------------------------------------------------
class Nvfp4Options(GroupedMoeOptions):
    nvfp4_mode: Literal["packed", "unpacked"] = opt("packed", "NVFP4 weights: packed | unpacked", flag="--nvfp4",
                                                    after="--fast-moe", label="-{}", label_always=True)
    nvfp4_activations: Literal["on", "off"] = opt("on", "NVFP4 activation fake-quant: on | off", after="--nvfp4")


class Nvfp4Backend:
    name = "nvfp4"
    default_model = "nvfp4"
    summary = "NVFP4 W4A4 (ModelOpt / compressed-tensors / auto-round); packed (fused Triton on CUDA) or unpacked"
    Options = Nvfp4Options

    def availability(self, machine) -> Availability:
        if machine.gpu_family == "blackwell":
            return Availability(True, "native", f"{machine.gpu_name}: FP4 tensor cores, a native path would apply; "
                                "quantbench emulates (packed weights decoded in its grouped GEMM)")
        where = machine.gpu_name if machine.has_gpu else "CPU"
        from quantbench.engine.triton_common import triton_available

        path = "triton-fused-nvfp4" if machine.has_gpu and triton_available() else (
            "dequant+grouped_mm" if machine.has_gpu else "cpu-vectorised")
        return Availability(True, "emulated", f"{where}: no FP4 tensor cores; emulated ({path}), activations "
                            "fake-quantized unless --nvfp4-activations off")

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        mode, acts = spec.options.nvfp4_mode, spec.options.nvfp4_activations
        if mode not in ("packed", "unpacked"):
            raise ConfigError(f"--nvfp4 {mode!r}: use packed (experts stay 4-bit) or unpacked (BF16 at load)")
        if acts not in ("on", "off"):
            raise ConfigError(f"--nvfp4-activations {acts!r}: use on (W4A4 emulation) or off (weights only)")
        # torch and the engine are imported here, not with the module: `quantbench run` imports every backend
        # for its flags, and `run --help` or a refused --db should not wait for them (README, Adding a backend).
        from quantbench.engine.moe.engine import experts_nbytes, kernel_paths
        from quantbench.models.families import decision_engine
        from quantbench.models.modelopt import load_checkpoint
        from quantbench.run.placement import device_of, dtype_of

        dtype = dtype_of(spec)
        if spec.shape:
            fields = self._synthetic(spec, dtype, mode, acts == "on")
        else:
            if not spec.options.fast_moe:
                raise ConfigError("--no-fast-moe: transformers has no nvfp4 path of its own for these checkpoints; "
                                  "quantbench's loader always runs them in its grouped-MoE engine")
            got = load_checkpoint(model_dir(spec), "nvfp4", mode=mode, activations=acts == "on", dtype=dtype,
                                  device=device_of(spec), trust_remote_code=spec.trust_remote_code)
            layout = got["layout"]
            if layout.activations == "none":  # a W4A16 export has no input scales: weights only, whatever was asked
                acts = "off"
            fields = {"model": got["model"], "tokenizer": got["tokenizer"], "checkpoint": got["path"],
                      "weight_format": layout.weight_format,
                      "disk_bytes": dir_bytes(got["path"]), "extra": got["extra"], "load_note": got["load_note"],
                      **got["ident"]}
        model = fields.pop("model")
        engine = decision_engine(model, fields.pop("tokenizer"), spec, fields.pop("checkpoint", None))
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
        import torch

        from quantbench.engine.moe.nvfp4 import Nvfp4Experts
        from quantbench.engine.moe.nvfp4_numbers import global_scale_of
        from quantbench.models.synthetic import build_synthetic_quantized, synthetic_id
        from quantbench.run.placement import device_of

        def make(weight: Tensor, amax: Tensor):
            fmt = Nvfp4Experts.from_weights(weight, input_scale=global_scale_of(amax).reshape(1), activations=activations)
            return fmt.unpacked(dtype) if mode == "unpacked" else fmt

        # 4-bit codes and an fp8 scale per 16; "unpacked" keeps the dequantized weights in `dtype`
        bits = torch.finfo(dtype).bits if mode == "unpacked" else 4 + 8 / 16
        model, tokenizer, _ = build_synthetic_quantized(spec.shape, make, layers=spec.layers, seed=spec.seed,
                                                        device=device_of(spec), dtype=dtype, expert_bits=bits)
        acts = "w4a4" if activations else "w4a16"
        return {"model": model, "tokenizer": tokenizer, "weight_format": f"nvfp4 {acts} g16 (quantbench's ModelOpt "
                "port, in memory)", "model_id": synthetic_id(spec.shape, spec.layers, spec.seed),
                "model_hash": f"seed:{spec.seed}", "weights": "synthetic", "extra": {},
                "load_note": "random weights built in memory and NVFP4-quantized by quantbench (ModelOpt's "
                             "algorithm; activation scales from one calibration forward); speed and memory only"}
