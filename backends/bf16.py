"""BF16: the reference. A transformers checkpoint in bfloat16 (float32 only when asked), experts implementation
selectable — a second, equally valid kernel (eager vs grouped_mm) is what gives parity its noise floor."""

from __future__ import annotations

from pathlib import Path

import torch

from quantbench.backend import Availability, LoadedVariant, RunSpec, VariantInfo, dir_bytes
from quantbench.checkpoint import experts_tensor_bytes, load_causal_lm, model_identity
from quantbench.errors import ConfigError
from quantbench.loading import dtype_of
from quantbench.scoring import TransformersEngine


def set_experts_implementation(model, name: str) -> str:
    """Switch the MoE experts kernel through transformers' own registry; returns the name that runs."""
    if not hasattr(model, "set_experts_implementation"):
        raise ConfigError(f"--experts-impl {name}: this transformers model has no selectable experts implementation")
    try:
        model.set_experts_implementation(name)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"--experts-impl {name!r} is not available: {e}") from e
    return name


class Bf16Backend:
    name = "bf16"
    summary = "BF16 transformers checkpoint (the reference); experts kernel grouped_mm or eager"

    def availability(self, machine) -> Availability:
        where = machine.gpu_name if machine.has_gpu else "CPU"
        return Availability(True, None, f"runs on {where}; experts grouped_mm | eager")

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        dtype = dtype_of(spec)
        if spec.shape:
            from quantbench.fixture import build_synthetic, synthetic_id

            model, tokenizer = build_synthetic(spec.shape, layers=spec.layers, device=spec.device, dtype=dtype,
                                               seed=spec.seed, experts_impl=spec.experts_impl)
            ident = {"model_id": synthetic_id(spec.shape, spec.layers, spec.seed),
                     "model_path": None, "model_hash": f"seed:{spec.seed}", "weights": "synthetic"}
            note, disk = "built in memory from the seed; load time is not a disk load", None
        else:
            from transformers import AutoTokenizer

            if spec.model:
                path = Path(spec.model)
            else:
                from quantbench.fixture import default_model_dir

                path = default_model_dir()
            model = load_causal_lm(path, dtype=dtype, device=spec.device, trust_remote_code=spec.trust_remote_code)
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
            ident = model_identity(path)
            ident.pop("source_model_hash", None)
            note, disk = "", dir_bytes(path)
        impl = set_experts_implementation(model, spec.experts_impl)
        engine = TransformersEngine.for_spec(model, tokenizer, spec)
        if impl == "eager":
            engine.decoder.disable("experts=eager loops over the hit experts with a host sync (nonzero): not capturable")
        info = VariantInfo(
            variant="bf16" if dtype == torch.bfloat16 else spec.dtype,
            weight_format=spec.dtype,
            kernel_path=f"transformers experts={impl}" + ("" if dtype == torch.bfloat16 else f", {spec.dtype} compute"),
            compute_dtype=spec.dtype,
            disk_bytes=disk,
            experts_bytes=experts_tensor_bytes(model),
            load_note=note,
            **ident,
        )
        return LoadedVariant(engine=engine, info=info, model=model)
