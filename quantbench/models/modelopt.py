"""Loading NVFP4 and FP8 checkpoints onto a transformers model, exactly or not at all.

transformers does not run these checkpoints itself, so quantbench reads them: the model is built from its config
on the meta device (no random weights are ever made), every tensor comes from the checkpoint's *.safetensors,
and the load is refused with a LoadError naming the tensor if anything is missing, left over, misshapen or of a
format this module does not know. Which tensor names a checkpoint uses (ModelOpt, compressed-tensors,
auto-round) is read by quantbench.models.layout.

MoE experts (`<block>.experts.<e>.{gate,up,down}_proj.*`) become one quantbench.engine.moe format per projection and
layer (gate and up stacked as transformers fuses them) inside the grouped-MoE engine; other quantized Linears
(a full variant's attention) become Nvfp4Linear / Fp8Linear.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from quantbench.engine.moe.engine import DenseExperts, install_grouped_moe
from quantbench.errors import LoadError
from quantbench.models.checkpoint import load_tokenizer, model_identity, read_config, unread_tensors
from quantbench.models.families import family_of, has_key_layouts, moe_layout
from quantbench.models.layout import Layout, read_layout
from quantbench.models.strict import Checkpoint, finish, stacked_experts

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")




def _scalar(t: Tensor, key: str, reciprocal: bool) -> Tensor:
    if t.numel() != 1:
        raise LoadError(f"tensor {key}: {tuple(t.shape)}, expected one per-tensor scale")
    t = t.float().reshape(())
    if not torch.isfinite(t) or t <= 0:
        raise LoadError(f"tensor {key}: {t.item()}, expected a positive finite scale")
    return 1.0 / t if reciprocal else t


@dataclass
class QuantLinearTensors:
    """One quantized Linear as read: weight [N, K/2] uint8 (nvfp4) or [N, K] E4M3 (fp8), scales, bias."""

    weight: Tensor
    block_scale: Tensor | None  # nvfp4 only
    scale: Tensor  # nvfp4: global scale (scalar); fp8: [N] per-row scales
    input_scale: Tensor | None
    bias: Tensor | None = None


def read_linear(ck: Checkpoint, prefix: str, layout: Layout, in_features: int | None = None) -> QuantLinearTensors:
    wkey = f"{prefix}.{layout.weight}"
    w = ck.take(wkey, f"the {layout.scheme} weight of {prefix}")
    skey = f"{prefix}.weight_scale"
    ws = ck.take(skey, f"the weight scale of {prefix}")
    ikey = f"{prefix}.{layout.input_scale}" if layout.input_scale else None
    inp = ck.maybe(ikey) if ikey else None
    if layout.activations == "static" and inp is None:
        raise LoadError(f"{ck.root}: tensor {ikey} is missing (the static activation scale of {prefix})")
    inp = None if inp is None else _scalar(inp, ikey, layout.reciprocal)
    if layout.scheme == "nvfp4":
        if w.dtype != torch.uint8 or w.dim() != 2:
            raise LoadError(f"tensor {wkey}: {w.dtype} {tuple(w.shape)}, expected uint8 [out, in/2] (two E2M1 per byte)")
        n, k = w.shape[0], w.shape[1] * 2
        if in_features is not None and k != in_features:
            raise LoadError(f"tensor {wkey}: {tuple(w.shape)} packs {k} inputs, the model's layer has {in_features}")
        if ws.dtype != torch.float8_e4m3fn or tuple(ws.shape) != (n, k // 16):
            raise LoadError(f"tensor {skey}: {ws.dtype} {tuple(ws.shape)}, expected float8_e4m3fn {(n, k // 16)}")
        gkey = f"{prefix}.{layout.global_scale}"
        gs = _scalar(ck.take(gkey, f"the global scale of {prefix}"), gkey, layout.reciprocal)
        return QuantLinearTensors(w, ws, gs, inp)
    if w.dtype != torch.float8_e4m3fn or w.dim() != 2:
        raise LoadError(f"tensor {wkey}: {w.dtype} {tuple(w.shape)}, expected float8_e4m3fn [out, in]")
    n, k = w.shape
    if in_features is not None and k != in_features:
        raise LoadError(f"tensor {wkey}: {tuple(w.shape)} has {k} inputs, the model's layer has {in_features}")
    if ws.numel() == 1:
        scale = ws.float().reshape(1).expand(n)
    elif ws.numel() == n:
        scale = ws.float().reshape(n)
    else:
        raise LoadError(f"tensor {skey}: {tuple(ws.shape)}, expected one scale per tensor or one per output row ({n})")
    return QuantLinearTensors(w, None, scale.contiguous(), inp)


# -- experts ------------------------------------------------------------------------------------------------------------
def _same_input_scale(parts: list[QuantLinearTensors], where: str) -> Tensor | None:
    scales = [p.input_scale for p in parts]
    if scales[0] is None:
        return None
    if any(not torch.equal(s, scales[0]) for s in scales[1:]):
        raise LoadError(f"{where}: gate_proj and up_proj have different activation scales; quantbench runs them as "
                        "one fused projection over one quantized input (re-export with shared input scales)")
    return scales[0]


def _expert_input_scales(scales: list[Tensor | None], where: str) -> Tensor | None:
    if all(s is None for s in scales):
        return None
    if any(s is None for s in scales):
        raise LoadError(f"{where}: some experts have an activation scale and some do not")
    stacked = torch.stack(scales)
    return stacked[:1] if torch.all(stacked == stacked[0]) else stacked  # one shared scale: the common case


def build_experts(ck: Checkpoint, prefix: str, num_experts: int, layout: Layout, *, mode: str, activations: bool,
                  dtype: torch.dtype) -> tuple[nn.Module, nn.Module]:
    """(gate_up, down) formats for the experts under `prefix` (`<block>.experts`)."""
    from quantbench.engine.moe.fp8 import Fp8Experts
    from quantbench.engine.moe.nvfp4 import Nvfp4Experts

    fused: dict[str, list[list[QuantLinearTensors]]] = {"gate_up": [], "down": []}
    for e in range(num_experts):
        parts = {p: read_linear(ck, f"{prefix}.{e}.{p}", layout) for p in PROJECTIONS}
        fused["gate_up"].append([parts["gate_proj"], parts["up_proj"]])
        fused["down"].append([parts["down_proj"]])
    out = []
    for name, experts in fused.items():
        where = f"{prefix}.*.{name}"
        shapes = {tuple(torch.cat([p.weight for p in parts]).shape) for parts in experts}
        if len(shapes) != 1:
            raise LoadError(f"{where}: the experts' {layout.weight} tensors differ in shape ({sorted(shapes)})")
        weight = torch.stack([torch.cat([p.weight for p in parts]) for parts in experts])
        in_scale = _expert_input_scales([_same_input_scale(parts, f"{prefix}.{e}") for e, parts in enumerate(experts)],
                                        where)
        if layout.scheme == "nvfp4":
            block = torch.stack([torch.cat([p.block_scale for p in parts]) for parts in experts])
            rows = torch.stack([torch.cat([p.scale.expand(p.weight.shape[0]) for p in parts]) for parts in experts])
            fmt = Nvfp4Experts(weight, block, rows.contiguous(), in_scale, activations=activations, name=where)
            out.append(fmt.unpacked(dtype) if mode == "unpacked" else fmt)
        else:
            rows = torch.stack([torch.cat([p.scale for p in parts]) for parts in experts])
            out.append(Fp8Experts(weight, rows.contiguous(), in_scale, activations=layout.activations, name=where))
    return out[0], out[1]


def _check_expert_shapes(root: Path, prefix: str, experts: nn.Module, formats: tuple[nn.Module, nn.Module]) -> None:
    """The experts read from the tensors must have the shape the config gives the model's (transformers' fused
    gate_up_proj [E, 2I, H] and down_proj [E, H, I]): the formats are built from the tensors alone, so a config
    whose moe_intermediate_size disagreed with them ran (bf16 and int4 refuse it) under a config that was wrong."""
    for fmt, name in zip(formats, ("gate_up_proj", "down_proj"), strict=True):
        want = getattr(experts, name, None)
        if want is None:  # experts kept per expert by this family's model: nothing fused to compare with
            continue
        got = (fmt.num_experts, fmt.out_features, fmt.in_features)
        if got != tuple(want.shape):
            raise LoadError(f"{root}: the experts of {prefix} are {got} [experts, out, in] in the checkpoint's tensors "
                            f"({name}), its config.json (num_experts, moe_intermediate_size, hidden_size) gives "
                            f"{tuple(want.shape)}; fix config.json to match the tensors, or copy the checkpoint again")


def _dense_experts(ck: Checkpoint, prefix: str, num_experts: int, dtype: torch.dtype) -> tuple[nn.Module, nn.Module]:
    """BF16 experts of a layer the checkpoint left unquantized (per-expert tensors, fused as transformers does)."""
    gate_up, down = stacked_experts(ck, prefix, num_experts, dtype)
    return DenseExperts(gate_up), DenseExperts(down)


# -- the model ----------------------------------------------------------------------------------------------------------
@dataclass
class LoadedQuant:
    model: nn.Module
    layout: Layout
    kernel_path: str
    quantized_linears: list[str] = field(default_factory=list)  # dense Linears replaced (a full variant's attention)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def _quantized_prefixes(ck: Checkpoint, layout: Layout) -> set[str]:
    suffix = f".{layout.weight}"
    return {k[: -len(suffix)] for k in ck.where if k.endswith(suffix) and f"{k[: -len(suffix)]}.weight_scale" in ck}


def load_quantized(
    path: str | Path,
    *,
    scheme: str,
    mode: str = "packed",
    activations: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    kernel: str = "auto",
    trust_remote_code: bool = False,
) -> LoadedQuant:
    """Load an NVFP4 (`mode` packed | unpacked, `activations` on | off) or FP8 checkpoint onto its transformers
    model with quantbench's grouped-MoE engine; every tensor from the checkpoint, or a LoadError."""
    root = Path(path)
    layout = read_layout(root)
    if layout.scheme != scheme:
        raise LoadError(f"{root}: a {layout.scheme} checkpoint ({layout.detail}); run it with --backend {layout.scheme}")
    if mode not in ("packed", "unpacked"):
        raise LoadError(f"--nvfp4 {mode!r}: use packed or unpacked")
    if not activations and layout.scheme == "nvfp4":
        layout = replace(layout, activations="none")
    model, ck = _meta_model(root, dtype, device, trust_remote_code)
    quantized = _quantized_prefixes(ck, layout)
    acts_on = layout.activations != "none"

    # experts: one format per projection and layer, swapped in by the grouped-MoE engine
    built: dict[int, tuple[nn.Module, nn.Module]] = {}
    expert_prefixes = []
    moe = moe_layout(model)
    for ref in moe.blocks:
        prefix = f"{ref.name}.experts"
        expert_prefixes.append(prefix + ".")
        num = int(getattr(ref.block.experts, "num_experts", None) or len(ref.block.experts))
        if f"{prefix}.0.gate_proj" in quantized:
            built[ref.layer_index] = build_experts(ck, prefix, num, layout, mode=mode, activations=acts_on, dtype=dtype)
        else:
            built[ref.layer_index] = _dense_experts(ck, prefix, num, dtype)
        _check_expert_shapes(root, prefix, ref.block.experts, built[ref.layer_index])
    if not built:
        raise LoadError(f"{root}: {type(model).__name__} has no MoE block; quantbench's nvfp4 / fp8 backends run MoE models")
    path_taken = install_grouped_moe(model, lambda i, _experts: built[i], kernel, layout=moe)

    # dense quantized Linears (a full variant): replaced in place
    from quantbench.engine.moe.fp8 import Fp8Linear
    from quantbench.engine.moe.nvfp4 import Nvfp4Linear

    dense = sorted(p for p in quantized if not any(p.startswith(e) for e in expert_prefixes))
    for name in dense:
        try:
            old = model.get_submodule(name)
        except AttributeError:
            raise LoadError(f"{root}: quantized tensors for {name}, which the model does not have") from None
        if not isinstance(old, nn.Linear):
            raise LoadError(f"{name}: quantized in the checkpoint but a {type(old).__name__} in the model; quantbench "
                            "keeps routers and embeddings in 16 bits and reads quantized nn.Linear layers only")
        t = read_linear(ck, name, layout, old.in_features)
        if t.weight.shape[0] != old.out_features:
            raise LoadError(f"tensor {name}.{layout.weight}: {old.out_features} outputs expected, got {t.weight.shape[0]}")
        bias = ck.take(f"{name}.bias").to(dtype) if old.bias is not None else None
        if layout.scheme == "nvfp4":
            new = Nvfp4Linear(t.weight, t.block_scale, t.scale, t.input_scale, bias, activations=acts_on,
                              unpacked_dtype=dtype if mode == "unpacked" else None)
        else:
            new = Fp8Linear(t.weight, t.scale, t.input_scale, bias, activations=layout.activations)
        _set_module(model, name, new)

    made = (DenseExperts, Nvfp4Linear, Fp8Linear)  # built from the checkpoint above (the nvfp4 / fp8 formats too)
    built_ids = {id(t) for m in model.modules() if isinstance(m, made) or hasattr(m, "quantize_input")
                 for t in m.buffers(recurse=False) if t is not None}
    finish(model, ck, dtype, device, built_ids)
    return LoadedQuant(model, layout, path_taken, dense)


def _meta_model(root: Path, dtype: torch.dtype, device: str, trust_remote_code: bool) -> tuple[nn.Module, Checkpoint]:
    """The checkpoint's model on the meta device, and its tensors by the model's module names."""
    model, rename = family_of(read_config(root)).meta_model(root, dtype, trust_remote_code)
    return model, Checkpoint(root, device, rename=rename)


def unread_note(root: Path) -> tuple[dict[str, Any], str]:
    """What a run records about the checkpoint components it never read: (extra fields, load note)."""
    config = read_config(root)
    family = family_of(config)
    if not has_key_layouts(family):
        return {}, ""  # one key layout, every tensor read: the run row stays as it was
    prefixes = family.unread_prefixes(config)
    if not prefixes:
        return {"family": family.name}, ""
    skipped = unread_tensors(root, prefixes)
    note = (f"{' + '.join(skipped['components'])} not read: {skipped['tensors']} tensors, {skipped['bytes']:,} bytes "
            f"of {skipped['total_bytes']:,}")
    return {"family": family.name, "skipped": skipped}, note


def load_checkpoint(path: str | Path, scheme: str, *, mode: str = "packed", activations: bool = True,
                    dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> dict[str, Any]:
    """Load the `scheme` checkpoint at `path` with quantbench's loader, and its tokenizer; the run row's fields."""
    path = Path(path)
    loaded = load_quantized(path, scheme=scheme, mode=mode, activations=activations, dtype=dtype, device=device,
                            trust_remote_code=trust_remote_code)
    tokenizer = load_tokenizer(path, trust_remote_code)
    ident = model_identity(path)
    source_hash = ident.pop("source_model_hash", None)
    unread, note = unread_note(path)
    return {"model": loaded.model, "tokenizer": tokenizer, "layout": loaded.layout, "path": path, "ident": ident,
            "extra": {"source_model_hash": source_hash, "producer": loaded.layout.producer,
                      "quantized_dense_linears": len(loaded.quantized_linears), **unread}, "load_note": note}
