"""BF16: the reference. A transformers checkpoint in bfloat16 (float32 only when asked), experts implementation
selectable — a second, equally valid kernel (eager vs grouped_mm) is what gives parity its noise floor.

`--experts-impl quantbench` runs the same BF16 expert weights (not copied) through quantbench's grouped-MoE engine
instead of transformers' experts forward: the same `torch._grouped_mm`, with the routed pairs grouped by two small
kernels instead of transformers' sort, gathers and copies, which took over half the GPU time of a forward of 32
decisions of 512 tokens on the H200 (docs/BENCHMARKS.md). The default, `auto`, is that engine on a GPU (16.8 ms
against transformers' grouped_mm 24.0 ms per 512-token decision at the 30B shape on the H200, 2026-12-02) and
transformers' grouped_mm on a CPU (the answers every stored CPU reference was made with); the noise floor keeps a
second kernel of transformers' (quantbench/run/spec.py `noise_floor_kernel`)."""

from __future__ import annotations

from quantbench.errors import ConfigError
from quantbench.models.checkpoint import experts_tensor_bytes, model_identity, read_config
from quantbench.run.backend import EMBEDDED_MODEL, Availability, LoadedVariant, dir_bytes, model_dir
from quantbench.run.record import VariantInfo
from quantbench.run.spec import EngineOptions, RunSpec, opt

QUANTBENCH_IMPL = "quantbench"
AUTO = "auto"


def resolve_experts_impl(name: str, device: str | None) -> str:
    """`auto`: quantbench's engine on a CUDA device, transformers' grouped_mm elsewhere; any other name as given."""
    if name != AUTO:
        return name
    return QUANTBENCH_IMPL if str(device or "").startswith("cuda") else "grouped_mm"


def set_experts_implementation(model, name: str) -> str:
    """Switch the MoE experts kernel through transformers' own registry (or, for "quantbench", swap every MoE
    block for quantbench's grouped-MoE engine over the same weights); returns what runs, for the kernel path."""
    if name == QUANTBENCH_IMPL:
        from quantbench.engine.moe import DenseExperts, install_grouped_moe
        from quantbench.models.families import moe_layout

        def same_weights(_layer, experts):
            if not hasattr(experts, "gate_up_proj"):
                raise ConfigError("--experts-impl quantbench needs transformers' fused experts (gate_up_proj / "
                                  f"down_proj); this model has {type(experts).__name__}")
            return DenseExperts(experts.gate_up_proj.detach()), DenseExperts(experts.down_proj.detach())

        return f"quantbench grouped-moe {install_grouped_moe(model, same_weights, layout=moe_layout(model))}".replace(
            "dequant+grouped_mm", "torch._grouped_mm")
    if not hasattr(model, "set_experts_implementation"):
        raise ConfigError(f"--experts-impl {name}: this transformers model has no selectable experts implementation")
    try:
        model.set_experts_implementation(name)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"--experts-impl {name!r} is not available: {e}") from e
    return name


class Bf16Options(EngineOptions):
    experts_impl: str = opt(AUTO, "BF16 experts kernel: auto (quantbench on a GPU, grouped_mm on a CPU) | grouped_mm | "
                            "eager | batched_mm (transformers') | quantbench (quantbench's grouped-MoE engine, same "
                            "weights)", after="--dtype", label="-{}")


class Bf16Backend:
    name = "bf16"
    default_model = EMBEDDED_MODEL
    summary = ("BF16 transformers checkpoint (the reference); experts kernel quantbench's engine on a GPU, grouped_mm on "
               "a CPU, or eager")
    Options = Bf16Options

    def availability(self, machine) -> Availability:
        where = machine.gpu_name if machine.has_gpu else "CPU"
        return Availability(True, None, f"runs on {where}; experts auto | grouped_mm | eager | quantbench")

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        # torch and the model code are imported here, not with the module: `quantbench run` reads every backend's
        # Options to build its flags, and `run --help` or a refused --db should not wait seconds for torch.
        import torch

        from quantbench.engine.moe import experts_nbytes
        from quantbench.models.families import decision_engine, family_of
        from quantbench.models.modelopt import unread_note
        from quantbench.models.synthetic import build_synthetic, synthetic_id
        from quantbench.run.placement import dtype_of

        dtype = dtype_of(spec)
        if spec.shape:
            model, tokenizer = build_synthetic(spec.shape, layers=spec.layers, device=spec.device, dtype=dtype,
                                               seed=spec.seed)
            ident = {"model_id": synthetic_id(spec.shape, spec.layers, spec.seed),
                     "model_path": None, "model_hash": f"seed:{spec.seed}", "weights": "synthetic"}
            note, disk = "built in memory from the seed; load time is not a disk load", None
            extra = {}
        else:
            from quantbench.models.checkpoint import load_tokenizer

            path = model_dir(spec)
            model = family_of(read_config(path)).load(path, dtype, spec.device, spec.trust_remote_code)
            tokenizer = load_tokenizer(path, spec.trust_remote_code)
            ident = model_identity(path)
            ident.pop("source_model_hash", None)
            extra, note = unread_note(path)
            disk = dir_bytes(path)
        asked = resolve_experts_impl(spec.options.experts_impl, str(next(model.parameters()).device))
        impl = set_experts_implementation(model, asked)
        ours = asked == QUANTBENCH_IMPL  # quantbench's engine runs the experts, not transformers
        engine = decision_engine(model, tokenizer, spec, None if spec.shape else model_dir(spec))
        if impl == "eager":
            engine.decoder.disable("experts=eager loops over the hit experts with a host sync (nonzero): not capturable")
        label = impl if ours else f"transformers experts={impl}"
        info = VariantInfo(
            variant="bf16" if dtype == torch.bfloat16 else spec.dtype,
            weight_format=spec.dtype,
            kernel_path=label + ("" if dtype == torch.bfloat16 else f", {spec.dtype} compute"),
            compute_dtype=spec.dtype,
            disk_bytes=disk,
            experts_bytes=experts_nbytes(model) if ours else experts_tensor_bytes(model),
            load_note=note,
            extra=extra,
            **ident,
        )
        return LoadedVariant(engine=engine, info=info, model=model)
