"""INT4 W4A16 (AutoRound, `auto_round:auto_gptq` packing): any `quant_method: auto-round` checkpoint, loaded by
transformers + auto-round, then by default run through quantbench's grouped-MoE engine (one grouped GEMM per
projection per layer, int4 kept packed; on CUDA a fused kernel: Gluon wgmma on Hopper for 128-row groups, Triton
elsewhere). `fast_moe=False` keeps auto-round's own
per-expert QuantLinear loop, for comparison. Dense int4 linears (if a checkpoint has them) keep auto-round's
kernels either way.

`--int4-activations int8`: W4A8, a variant of its own ("int4-w4a8"): the same int4 weights with int8 activations
per row per 128 inputs (quantbench.engine.moe.w4a8; a Gluon kernel on sm_90, emulated elsewhere). Never W4A16's
stand-in: its answers differ, so it is recorded as its own variant and weight format.

`--model` unset: the embedded default model's INT4 variant, quantized once (RTN) and cached.
`--shape`: a real-shape model with random weights, RTN-quantized in memory (speed and memory only).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from quantbench.errors import ConfigError, LoadError
from quantbench.models.checkpoint import experts_tensor_bytes, model_identity, read_config
from quantbench.run.backend import Availability, LoadedVariant, dir_bytes, model_dir
from quantbench.run.record import VariantInfo
from quantbench.run.spec import GroupedMoeOptions, RunSpec, opt
from quantbench.term import logs_kept

if TYPE_CHECKING:
    import torch


def read_quant_config(path: Path) -> dict[str, Any]:
    """The checkpoint's quantization_config, refused unless it is 4-bit auto-round with auto_gptq packing."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise LoadError(f"{path}: no config.json; --model must be a checkpoint directory")
    qc = json.loads(config_file.read_text()).get("quantization_config")
    if not qc:
        raise LoadError(f"{path}/config.json: no quantization_config; this is not an AutoRound checkpoint "
                        "(use --backend bf16, or make one with `quantbench quantize --scheme int4`)")
    method, packing = qc.get("quant_method"), str(qc.get("packing_format", "auto_round:auto_gptq"))
    if method == "gptq":  # auto_gptq's packing (auto-round's format="auto_gptq" export, GPTQModel's v1): read as is
        layout = str(qc.get("checkpoint_format") or qc.get("format") or "gptq")
        if layout != "gptq":
            raise LoadError(f"{path}/config.json: quantization_config.checkpoint_format is {layout!r}; the int4 "
                            "backend reads GPTQ v1 ('gptq', auto_gptq's packing): export the model in that format, "
                            "or quantize the BF16 model with `quantbench quantize --scheme int4`")
        if qc.get("desc_act"):
            raise LoadError(f"{path}/config.json: quantization_config.desc_act is true (act-order: each input's group "
                            "comes from g_idx); quantbench's int4 kernels and auto-round's read groups in input order: "
                            "export with desc_act=false")
        packing = "auto_round:auto_gptq"
    elif method not in ("auto-round", "intel/auto-round"):
        raise LoadError(f"{path}/config.json: quantization_config.quant_method is {method!r}; the int4 backend reads "
                        "'auto-round' and 'gptq' (v1) checkpoints")
    if "auto_gptq" not in packing:
        made = " (what auto-round writes for sym=false)" if "awq" in packing else ""
        raise LoadError(f"{path}/config.json: quantization_config.packing_format is {packing!r}{made}; the int4 "
                        "backend reads 'auto_round:auto_gptq': quantize the BF16 model with sym=True (`quantbench "
                        "quantize --scheme int4`)")
    if qc.get("bits") != 4:
        raise LoadError(f"{path}/config.json: quantization_config.bits is {qc.get('bits')!r}; the int4 backend "
                        "reads 4-bit checkpoints")
    return qc


FAKE_BACKEND = "auto_round:fake"  # auto-round's fallback: it makes no quantized layers, so nothing reads qweight


def no_kernel_error(path: Path, qc: dict[str, Any], library_log: list[str], device: str) -> LoadError | None:
    """The LoadError to raise instead of a load report's MISSING `weight` / UNEXPECTED `qweight` keys when auto-round
    chose its `fake` backend (no kernel of its own here for this checkpoint: an asymmetric auto_gptq export on a
    CPU): the packed tensors were never read, and the report's keys hid why. None when it chose a real kernel."""
    chosen = [line for line in library_log if "Inference backend selection" in line]
    if not any(FAKE_BACKEND in line for line in chosen):
        return None
    sym = "sym" if qc.get("sym", True) else "asym (sym=false)"
    installs = sorted({line.split("`")[1] for line in library_log if line.count("`") >= 2 and "pip install" in line})
    where = "a CUDA GPU" + (f", or here after {' and '.join(installs)} (auto-round's own advice)" if installs else "")
    return LoadError(f"{path}/config.json: auto-round has no kernel on {device} for this checkpoint's quantization_config "
                     f"({qc.get('bits')}-bit {sym}, packing_format {qc.get('packing_format', 'auto_round:auto_gptq')!r}): "
                     f"it fell back to its {FAKE_BACKEND!r} backend, which does not read the packed int4 tensors; run it "
                     f"where auto-round has a kernel for it ({where}), or quantize the BF16 model with sym=True "
                     "(`quantbench quantize --scheme int4`)")


@contextmanager
def transformers_state_restored() -> Iterator[None]:
    """Undo what loading an auto-round checkpoint changes in transformers' global state: it rewrites the
    qwen3_moe checkpoint conversion mapping (and may patch MoE block classes), after which a plain BF16 MoE
    checkpoint loads in the same process with MISSING / UNEXPECTED expert keys. Restored on exit."""
    from transformers import conversion_mapping, modeling_utils

    cache = conversion_mapping._checkpoint_conversion_mapping_cache
    saved = {
        "cache": copy.deepcopy(cache) if cache is not None else None,
        "user": set(getattr(conversion_mapping, "USER_REGISTERED_MAPPINGS", ())),
        "get": conversion_mapping.get_checkpoint_conversion_mapping,
        "get_mu": getattr(modeling_utils, "get_checkpoint_conversion_mapping", None),
    }
    from quantbench.models.families import modeling_modules

    blocks = {}
    for mod_name in modeling_modules():  # every family's modeling module: auto-round patches the omni one too
        mod = importlib.import_module(mod_name)
        blocks[mod] = {k: v for k, v in vars(mod).items() if isinstance(v, type)}
    try:
        yield
    finally:
        conversion_mapping._checkpoint_conversion_mapping_cache = saved["cache"]
        if hasattr(conversion_mapping, "USER_REGISTERED_MAPPINGS"):
            conversion_mapping.USER_REGISTERED_MAPPINGS.clear()
            conversion_mapping.USER_REGISTERED_MAPPINGS.update(saved["user"])
        conversion_mapping.get_checkpoint_conversion_mapping = saved["get"]
        if saved["get_mu"] is not None:
            modeling_utils.get_checkpoint_conversion_mapping = saved["get_mu"]
        for mod, classes in blocks.items():
            for k, v in classes.items():
                setattr(mod, k, v)


def weight_format(qc: dict[str, Any]) -> str:
    sym = "sym" if qc.get("sym", True) else "asym"
    packing = "gptq v1" if qc.get("quant_method") == "gptq" else qc.get("packing_format", "auto_round:auto_gptq")
    return f"int4 w4a16 g{qc.get('group_size', 128)} {sym} ({packing})"


def per_expert_kernel(model: torch.nn.Module) -> str:
    """auto-round's own path: which QuantLinear class runs each expert."""
    kinds = {type(m).__module__.rsplit(".", 1)[-1] for n, m in model.named_modules()
             if ".experts." in f".{n}." and hasattr(m, "qweight")}
    return "auto-round per-expert loop " + "+".join(sorted(kinds))


W4A8_FORMAT = "; activations int8 per row per 128 inputs (quantbench)"
NO_LIBRARY_W4A8 = ("--int4-activations int8 with --no-fast-moe: auto-round's own per-expert path is W4A16 only; "
                   "W4A8 runs in quantbench's grouped-MoE engine (drop --no-fast-moe)")


class Int4Options(GroupedMoeOptions):
    # after --nvfp4-activations: the two activation flags side by side in `run --help`
    int4_activations: Literal["bf16", "int8"] = opt(
        "bf16", "INT4 activations: bf16 (W4A16, the checkpoint's arithmetic) | int8 (W4A8: a labelled variant, "
        "int8 per row per 128 inputs)", flag="--int4-activations", after="--nvfp4-activations", label="-w4a8")


def w4a8_asked(spec: RunSpec) -> bool:
    # getattr: a subclass of this backend may declare Options without it (W4A16 then)
    return getattr(spec.options, "int4_activations", "bf16") == "int8"


class Int4Backend:
    name = "int4"
    default_model = "int4"
    summary = "INT4 W4A16 AutoRound checkpoint; quantbench grouped-MoE engine (fused Gluon / Triton kernels on CUDA)"
    Options = Int4Options

    def availability(self, machine) -> Availability:
        # Whether it is installed, not imported: importing auto-round takes seconds (`quantbench backends`).
        if importlib.util.find_spec("auto_round") is None:
            return Availability(False, None, "auto-round is not installed (pip install auto-round)")
        if machine.has_gpu:
            from quantbench.engine.moe.align import triton_available

            path = "fused int4 kernels (gluon-wgmma on sm_90, triton elsewhere)" if triton_available() \
                else "dequant+grouped_mm (no triton)"
            return Availability(True, "native", f"{machine.gpu_name}: grouped-MoE {path}; --no-fast-moe: per-expert")
        return Availability(True, "native", "CPU: grouped-MoE cpu-vectorised; --no-fast-moe: per-expert")

    def check(self, spec: RunSpec, machine) -> None:
        """In the parent, before a child starts: W4A8 needs quantbench's engine."""
        if w4a8_asked(spec) and not spec.options.fast_moe:
            raise ConfigError(NO_LIBRARY_W4A8)

    def load(self, spec: RunSpec, machine) -> LoadedVariant:
        self.check(spec, machine)
        # torch and the model code are imported here, not with the module: `quantbench run` imports every backend
        # for its flags, and `run --help` or a refused --db should not wait for them (README, Adding a backend).
        import torch

        from quantbench.models.families import decision_engine, family_of, loads_int4_itself
        from quantbench.models.modelopt import unread_note
        from quantbench.run.placement import device_of, dtype_of

        dtype = dtype_of(spec)
        device = device_of(spec)
        if spec.shape:
            return self._load_synthetic(spec, dtype, device)

        path = model_dir(spec)
        qc = read_quant_config(path)
        library_log: list[str] = []  # auto-round's INFO/WARNING lines while loading: kept on the run, not printed
        family = family_of(read_config(path))
        own_fast = loads_int4_itself(family) and spec.options.fast_moe
        if own_fast:  # transformers cannot load this family's export: the family's loader reads it into the engine
            engine_kernel = "grouped_mm" if dtype == torch.float32 and device.startswith("cuda") else "auto"
            model, own_kernel = family.load_int4(path, dtype, device, sym=qc.get("sym", True), kernel=engine_kernel,
                                                 trust_remote_code=spec.trust_remote_code)
        else:
            with transformers_state_restored(), logs_kept("autoround", library_log):
                try:
                    model = family.load_per_expert(path, dtype, device, spec.trust_remote_code)
                except LoadError as e:
                    raise no_kernel_error(path, qc, library_log, device) or e from e
        if dtype == torch.float32 and not own_fast:
            # auto-round casts to fp16 when asked for fp32 (its kernels' dtype list), and transformers forbids
            # .float() on a quantized model; exact CPU comparisons want fp32, so cast through nn.Module's own .to
            torch.nn.Module.to(model, torch.float32)
        if spec.options.fast_moe:
            # the fused kernel computes in bf16/fp16; float32 on a GPU takes the dequantize + grouped_mm path
            engine_kernel = "grouped_mm" if dtype == torch.float32 and device.startswith("cuda") else "auto"
            kernel = f"quantbench grouped-moe {own_kernel if own_fast else install_int4_engine(model, qc, engine_kernel)}"
            if w4a8_asked(spec):  # the same int4 experts, repacked for int8 activations (the omni family's too)
                kernel = f"quantbench grouped-moe {_install_w4a8(model)}"
            experts_bytes = _engine_bytes(model)
        else:
            kernel = per_expert_kernel(model)
            experts_bytes = experts_tensor_bytes(model)

        from quantbench.models.checkpoint import load_tokenizer

        tokenizer = load_tokenizer(path, spec.trust_remote_code)
        ident = model_identity(path)
        source_hash = ident.pop("source_model_hash", None)
        unread, note = unread_note(path)
        engine = decision_engine(model, tokenizer, spec, path)
        info = VariantInfo(
            variant="int4",
            weight_format=weight_format(qc),
            kernel_path=kernel,
            compute_dtype=spec.dtype,
            native="native",
            disk_bytes=dir_bytes(path),
            experts_bytes=experts_bytes,
            extra={"source_model_hash": source_hash, "fast_moe": spec.options.fast_moe,
                   **({"library_log": library_log} if library_log else {}), **unread},
            load_note=note,
            **ident,
        )
        if w4a8_asked(spec):
            _label_w4a8(info, model, device)
        return LoadedVariant(engine=engine, info=info, model=model)

    def _load_synthetic(self, spec: RunSpec, dtype: torch.dtype, device: str) -> LoadedVariant:
        if not spec.options.fast_moe:
            raise ConfigError("--shape with --backend int4 runs the grouped-MoE engine only; drop --no-fast-moe "
                              "(a per-expert synthetic run needs a checkpoint: `quantbench quantize --scheme int4`)")
        from quantbench.engine.moe.int4 import rtn_experts
        from quantbench.models.families import decision_engine
        from quantbench.models.synthetic import build_synthetic_quantized, synthetic_id

        # built layer by layer: each layer's BF16 experts are quantized and freed before the next layer's exist
        # (4-bit codes, fp16 scales and uint8 zero points per group of 128)
        model, tokenizer, path = build_synthetic_quantized(
            spec.shape, lambda weight, _amax: rtn_experts(weight), layers=spec.layers, seed=spec.seed, device=device,
            dtype=dtype, expert_bits=4 + (16 + 8) / 128, calibrate=False)
        if w4a8_asked(spec):
            path = _install_w4a8(model)
        engine = decision_engine(model, tokenizer, spec, None)  # a synthetic Omni thinker reads media too
        info = VariantInfo(
            variant="int4",
            weight_format="int4 w4a16 g128 sym (RTN in memory)",
            kernel_path=f"quantbench grouped-moe {path}",
            compute_dtype=spec.dtype,
            model_id=synthetic_id(spec.shape, spec.layers, spec.seed),
            model_hash=f"seed:{spec.seed}",
            weights="synthetic",
            native="native",
            experts_bytes=_engine_bytes(model),
            load_note="random weights built in memory and RTN-quantized by quantbench (not AutoRound); "
                      "speed and memory only, load time is not a disk load",
        )
        if w4a8_asked(spec):
            _label_w4a8(info, model, device)
        return LoadedVariant(engine=engine, info=info, model=model)


def install_int4_engine(model: torch.nn.Module, qc: dict[str, Any], kernel: str = "auto") -> str:
    """Regroup every MoE layer's per-expert int4 QuantLinears into stacked tensors and swap in the engine."""
    from quantbench.engine.moe import install_grouped_moe
    from quantbench.engine.moe.int4 import regroup_experts
    from quantbench.models.families import moe_layout

    sym = qc.get("sym", True)
    return install_grouped_moe(model, lambda i, ex: regroup_experts(ex, sym=sym, name=f"layers.{i}.mlp.experts"),
                               kernel=kernel, layout=moe_layout(model))


def _install_w4a8(model: torch.nn.Module) -> str:
    """Every GroupedMoE's int4 experts as W4A8 (quantbench.engine.moe.w4a8); the kernel path they plan."""
    from quantbench.engine.moe import kernel_paths
    from quantbench.engine.moe.w4a8 import install_w4a8

    install_w4a8(model)
    return kernel_paths(model)


def _label_w4a8(info: VariantInfo, model: torch.nn.Module, device: str) -> None:
    """A W4A8 run's own variant and format (never pooled with W4A16's), and whether its kernel runs here: where
    it does not (a CPU, a GPU other than sm_90, float32 compute) the int8 activations are emulated (fake-quantized,
    times the dequantized weights), and the kernel path says so."""
    from quantbench.engine.moe.w4a8 import KERNEL, Int4W4A8Experts

    native = KERNEL in info.kernel_path and any(
        m.quantizes_input_in_kernel(device) for m in model.modules() if isinstance(m, Int4W4A8Experts))
    info.variant = "int4-w4a8"
    info.weight_format = info.weight_format.replace("w4a16", "w4a8") + W4A8_FORMAT
    info.native = "native" if native else "emulated"
    if not native:
        info.kernel_path += ", int8 activations emulated"
    info.extra = {**info.extra, "int4_activations": "int8"}


def _engine_bytes(model: torch.nn.Module) -> int:
    from quantbench.engine.moe import experts_nbytes

    return experts_nbytes(model)
