"""FP8 (E4M3, W8A8): ModelOpt FP8 or compressed-tensors float-quantized checkpoints (per-tensor or per-channel
weight scales), read by quantbench.models.modelopt into quantbench's grouped-MoE engine.

Native where the GPU has FP8 tensor cores (compute capability >= 8.9: Ada, Hopper, Blackwell): dense FP8 layers
run `torch._scaled_mm`, the experts a Triton grouped GEMM with E4M3 operands. Elsewhere (older GPUs, the CPU)
emulated: weights dequantized, activations fake-quantized as ModelOpt's fake-quant forward does. Recorded.

`--model` unset: the embedded default model's FP8 variant, quantized once with ModelOpt and cached.
`--shape`: a real-shape model with random weights, FP8-quantized in memory (per-tensor, ModelOpt's algorithm),
activation scales from one calibration forward: speed and memory only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantbench.errors import ConfigError
from quantbench.run.backend import Availability, LoadedVariant, dir_bytes, model_dir
from quantbench.run.record import VariantInfo
from quantbench.run.spec import GroupedMoeOptions, RunSpec

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def native_here(device: str, activations: str) -> bool:
    from quantbench.engine.moe.fp8 import native_fp8

    return activations == "static" and native_fp8(device)


class Fp8Backend:
    name = "fp8"
    default_model = "fp8"
    summary = "FP8 E4M3 W8A8 (ModelOpt / compressed-tensors); native on Ada/Hopper/Blackwell, else emulated"
    Options = GroupedMoeOptions

    def availability(self, machine) -> Availability:
        if not machine.has_gpu:
            return Availability(True, "emulated", "CPU: no FP8 units; weights dequantized, activations fake-quantized")
        major, minor = (int(p) for p in (machine.gpu_cc or "0.0").split("."))
        if (major, minor) >= (8, 9):
            return Availability(True, "native", f"{machine.gpu_name}: FP8 tensor cores (torch._scaled_mm, "
                                "Triton E4M3 grouped GEMM)")
        return Availability(True, "emulated", f"{machine.gpu_name} (compute capability {machine.gpu_cc}): no FP8 "
                            "tensor cores; weights dequantized in the grouped GEMM, activations fake-quantized")

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        # torch and the engine are imported here, not with the module: `quantbench run` imports every backend
        # for its flags, and `run --help` or a refused --db should not wait for them (README, Adding a backend).
        from quantbench.engine.moe.engine import experts_nbytes, kernel_paths
        from quantbench.models.families import decision_engine
        from quantbench.models.modelopt import load_checkpoint
        from quantbench.run.placement import device_of, dtype_of

        dtype = dtype_of(spec)
        if spec.shape:
            fields = self._synthetic(spec, dtype)
            activations = "static"
        else:
            if not spec.options.fast_moe:
                raise ConfigError("--no-fast-moe: transformers has no fp8 path of its own for these checkpoints; "
                                  "quantbench's loader always runs them in its grouped-MoE engine")
            got = load_checkpoint(model_dir(spec), "fp8", dtype=dtype, device=device_of(spec),
                                  trust_remote_code=spec.trust_remote_code)
            layout = got["layout"]
            activations = layout.activations
            fields = {"model": got["model"], "tokenizer": got["tokenizer"], "checkpoint": got["path"],
                      "weight_format": layout.weight_format,
                      "disk_bytes": dir_bytes(got["path"]), "extra": got["extra"], "load_note": got["load_note"],
                      **got["ident"]}
        model = fields.pop("model")
        engine = decision_engine(model, fields.pop("tokenizer"), spec, fields.pop("checkpoint", None))
        native = native_here(device_of(spec), activations)
        info = VariantInfo(
            variant="fp8",
            kernel_path=f"quantbench grouped-moe {kernel_paths(model)}",
            compute_dtype=spec.dtype,
            native="native" if native else "emulated",
            experts_bytes=experts_nbytes(model),
            extra={**fields.pop("extra"), "fp8_activations": activations},
            **fields,
        )
        return LoadedVariant(engine=engine, info=info, model=model)

    def _synthetic(self, spec: RunSpec, dtype: torch.dtype) -> dict[str, Any]:
        from quantbench.engine.moe.fp8 import E4M3_MAX, Fp8Experts
        from quantbench.models.synthetic import build_synthetic_quantized, synthetic_id
        from quantbench.run.placement import device_of

        def make(weight: Tensor, amax: Tensor):
            return Fp8Experts.from_weights(weight, input_scale=(amax.float() / E4M3_MAX).reshape(1))

        model, tokenizer, _ = build_synthetic_quantized(spec.shape, make, layers=spec.layers, seed=spec.seed,
                                                        device=device_of(spec), dtype=dtype, expert_bits=8)
        return {"model": model, "tokenizer": tokenizer, "weight_format": "fp8 w8a8 (quantbench's ModelOpt port, "
                "per-tensor, in memory)", "model_id": synthetic_id(spec.shape, spec.layers, spec.seed),
                "model_hash": f"seed:{spec.seed}", "weights": "synthetic", "extra": {},
                "load_note": "random weights built in memory and FP8-quantized by quantbench (ModelOpt's algorithm; "
                             "activation scales from one calibration forward); speed and memory only"}
