"""Is a variant what it claims? Its MoE experts' tensors, read from the safetensors headers, against the claim of
the backend that is asked to run it and of the checkpoint's config.

vLLM-Omni 0.28 loaded an AutoRound Qwen3-Omni checkpoint whose expert layers were left unquantized and ran them as
BF16 under the INT4 name, so its figures described BF16 speed. Before a variant loads, every expert projection of
every MoE layer is classified from its tensors alone (names, dtypes, shapes; no tensor data is read):

    int4   `qweight` int32 packed (auto-round / GPTQ: [K·bits/32, N]), `scales` [K/group, N]: bits and group from shapes
    nvfp4  `weight` uint8 [N, K/2] (ModelOpt) or `weight_packed` (compressed-tensors, auto-round) with FP8 block scales
    fp8    `weight` float8_e4m3fn
    bf16   `weight` (or transformers' fused `gate_up_proj` / `down_proj`) in bfloat16 (fp16 / fp32 alike: unquantized)

The per-layer map (format, bits, group size, packed dtype, bytes, bits per weight, experts) goes on the run
(`extra.experts`). A checkpoint is refused, naming the layers, when any expert is not in the claimed format: an
"int4" whose experts are BF16, or only some of them quantized (auto-round's `layer_config` can keep a layer at 16
bits while the config still says bits 4), never runs as INT4; a bf16 run of quantized experts is refused the same
way. The fix is in the message: the backend the experts really are, or quantize every expert.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantbench.errors import LoadError
from quantbench.models.checkpoint import safetensors_header

EXPERT = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts\.(.+)$")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
FLOATS = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}
# Which formats each backend runs, and what a format's bits per weight may be (scales and zero points included).
CLAIMS = {"bf16": ("bf16", "fp16", "fp32"), "int4": ("int4",), "nvfp4": ("nvfp4",), "fp8": ("fp8",)}
BACKEND_OF = {"bf16": "bf16", "fp16": "bf16", "fp32": "bf16", "int4": "int4", "nvfp4": "nvfp4", "fp8": "fp8"}


def _headers(root: Path) -> dict[str, dict[str, Any]]:
    """Every tensor's header entry (dtype, shape, data_offsets) across the checkpoint's safetensors files."""
    out: dict[str, dict[str, Any]] = {}
    for file in sorted(root.glob("*.safetensors")):
        out.update(safetensors_header(file)[1])
    return out


def _nbytes(entry: dict[str, Any]) -> int:
    start, end = entry.get("data_offsets", (0, 0))
    return int(end) - int(start)


def _text_dims(config: dict[str, Any]) -> tuple[int | None, int | None]:
    """(hidden_size, moe_intermediate_size) of the MoE decoder, wherever the config nests it (an Omni thinker's
    text_config, a full Omni checkpoint's thinker_config)."""
    stack = [config]
    while stack:
        d = stack.pop()
        if "moe_intermediate_size" in d and "hidden_size" in d:
            return int(d["hidden_size"]), int(d["moe_intermediate_size"])
        stack += [v for v in d.values() if isinstance(v, dict)]
    return None, None


@dataclass
class Projection:
    """One expert's projection (or a fused projection of all experts): its tensors by suffix."""

    name: str  # gate_proj | up_proj | down_proj | gate_up_proj
    tensors: dict[str, dict[str, Any]]
    experts: int = 1  # a fused tensor holds every expert


def _classify(p: Projection, hidden: int | None, inter: int | None) -> dict[str, Any]:
    """format, bits, group, packed dtype, bytes and weights (parameters) of one projection."""
    t = p.tensors
    in_features = (inter if p.name == "down_proj" else hidden) if hidden and inter else None
    nbytes = sum(_nbytes(e) for e in t.values())
    if "qweight" in t:
        rows, cols = t["qweight"]["shape"][0], t["qweight"]["shape"][-1]
        scales = t.get("scales", {}).get("shape")
        k = in_features or None
        bits = round(32 * rows / k) if k else None
        if k and scales and rows == k and cols != scales[-1]:  # AWQ packing ([K, N·bits/32], along N): not int32
            bits = round(32 * cols / scales[-1])
        group = (k // scales[0]) if k and scales else None
        params = (k or rows * 8) * cols
        return {"format": f"int{bits}" if bits else "int (packed)", "bits": bits, "group_size": group,
                "groups": scales[0] if scales else None, "packed_dtype": t["qweight"]["dtype"], "bytes": nbytes,
                "params": params}
    weight = t.get("weight_packed") or t.get("weight")
    if weight is None:
        return {"format": "unknown", "bits": None, "group_size": None, "packed_dtype": None, "bytes": nbytes,
                "params": 0}
    dtype, shape = weight["dtype"], weight["shape"]
    count = 1
    for d in shape:
        count *= d
    if dtype in ("U8", "I8") and ("weight_scale" in t or "weight_packed" in t):
        scale = t.get("weight_scale", {}).get("shape")
        k = shape[-1] * 2
        return {"format": "nvfp4", "bits": 4, "group_size": (k // scale[-1]) if scale else None,
                "packed_dtype": dtype, "bytes": nbytes, "params": count * 2}
    if dtype.startswith("F8"):
        return {"format": "fp8", "bits": 8, "group_size": None, "packed_dtype": dtype, "bytes": nbytes,
                "params": count}
    if dtype in FLOATS:
        return {"format": FLOATS[dtype], "bits": 8 * DTYPE_BYTES[dtype], "group_size": None, "packed_dtype": dtype,
                "bytes": nbytes, "params": count}
    return {"format": f"unknown ({dtype})", "bits": None, "group_size": None, "packed_dtype": dtype, "bytes": nbytes,
            "params": count}


def expert_map(root: str | Path, config: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Per MoE layer: its experts' format (the projections' formats, counted), bits, group size, packed dtype,
    bytes and bits per weight. Empty for a model without MoE experts."""
    root = Path(root)
    if config is None:
        config = json.loads((root / "config.json").read_text())
    hidden, inter = _text_dims(config)
    projections: dict[int, dict[tuple[str, str], Projection]] = {}
    for name, entry in _headers(root).items():
        m = EXPERT.search(name)
        if not m:
            continue
        layer, rest = int(m.group(1)), m.group(2).split(".")
        if rest[0].isdigit() and len(rest) >= 2:  # experts.E.gate_proj.qweight
            expert, proj, suffix = rest[0], rest[1], rest[2] if len(rest) > 2 else "weight"
        else:  # experts.gate_up_proj (transformers' fused experts)
            expert, proj, suffix = "*", rest[0], rest[1] if len(rest) > 1 else "weight"
        if proj not in PROJECTIONS:
            continue
        key = (expert, proj)
        p = projections.setdefault(layer, {}).setdefault(key, Projection(proj, {}))
        p.tensors[suffix] = entry
        if expert == "*" and suffix == "weight":
            p.experts = int(entry["shape"][0])
    out: dict[int, dict[str, Any]] = {}
    for layer in sorted(projections):
        kinds = [_classify(p, hidden, inter) for p in projections[layer].values()]
        formats: dict[str, int] = {}
        for k in kinds:
            formats[k["format"]] = formats.get(k["format"], 0) + 1
        experts = len({e for e, _ in projections[layer] if e != "*"}) or max(
            p.experts for p in projections[layer].values())
        params, nbytes = sum(k["params"] for k in kinds), sum(k["bytes"] for k in kinds)
        first = kinds[0]
        # A projection quantized as one group per row (auto-round's group_size -1, or a group wider than its
        # inputs) fits any group size: gate/up (hidden inputs) and down (moe_intermediate inputs) of a
        # group_size -1 export have different widths, and the layer read as "mixed" and was refused though it loads.
        groups = {k["group_size"] for k in kinds if k.get("groups") != 1}
        group = groups.pop() if len(groups) == 1 else -1 if not groups else None
        uniform = (len(formats) == 1 and len({(k["bits"], k["packed_dtype"]) for k in kinds}) == 1
                   and (group is not None or first["group_size"] is None))
        out[layer] = {
            "format": first["format"] if uniform else "mixed", "formats": formats, "bits": first["bits"] if uniform else None,
            "group_size": group if uniform else None,
            "packed_dtype": first["packed_dtype"] if uniform else None, "experts": experts, "bytes": nbytes,
            "bits_per_weight": round(8 * nbytes / params, 3) if params else None,
        }
    return out


def claimed(backend: str, config: dict[str, Any]) -> dict[str, Any]:
    """What running this checkpoint under `backend` claims its experts are: the backend's formats, and for int4
    the bits and group size its quantization_config states."""
    qc = config.get("quantization_config") or {}
    claim: dict[str, Any] = {"backend": backend, "formats": list(CLAIMS.get(backend, ()))}
    if backend == "int4":
        claim.update(bits=qc.get("bits"), group_size=qc.get("group_size"))
    return claim


def _layers_text(layers: list[int]) -> str:
    return ", ".join(str(i) for i in layers[:12]) + (f" … ({len(layers)} layers)" if len(layers) > 12 else "")


def check(backend: str, root: str | Path) -> dict[str, Any]:
    """The record of the check (claim, per-layer map, result), or LoadError naming the layers that are not what
    the claim says and the fix. A backend with no claim (a remote server) or a model without MoE experts passes
    with the map it has."""
    root = Path(root)
    config = json.loads((root / "config.json").read_text())
    claim = claimed(backend, config)
    layers = expert_map(root, config)
    record = {"claim": claim, "layers": {str(k): v for k, v in layers.items()}}
    if not claim["formats"] or not layers:
        return {**record, "result": "no MoE experts to check" if not layers else "no claim"}
    wrong = []
    widest = max((d for d in _text_dims(config) if d), default=None)
    for i, info in layers.items():
        formats = set(info["formats"])
        ok = formats <= set(claim["formats"])
        if ok and backend == "int4":
            per_row = info["group_size"] == -1 and widest is not None and (claim["group_size"] or 0) >= widest
            ok = info["bits"] == (claim["bits"] or 4) and (
                claim["group_size"] in (None, -1) or info["group_size"] == claim["group_size"] or per_row)
        if not ok:
            wrong.append(i)
    if not wrong:
        return {**record, "result": f"every expert of {len(layers)} MoE layers is {'/'.join(claim['formats'])}"}
    found: dict[str, list[int]] = {}
    for i in wrong:
        found.setdefault(layers[i]["format"], []).append(i)
    seen = "; ".join(f"{fmt} in layer{'s' if len(ls) > 1 else ''} {_layers_text(ls)}" for fmt, ls in found.items())
    what = backend
    if backend == "int4" and claim.get("bits"):
        what += f" ({claim['bits']} bits, group {claim.get('group_size')}, as its quantization_config says)"
    if backend == "int4" and set(found) == {"int4"}:  # int4 experts, of other bits or groups than the config says
        shapes = sorted({(layers[i]["bits"], layers[i]["group_size"]) for i in wrong}, key=str)
        error = LoadError(
            f"{root}: not run as int4: its quantization_config says {claim['bits']} bits, group "
            f"{claim['group_size']}, but the experts' tensors are "
            + " and ".join(f"{b} bits, group {g}" for b, g in shapes)
            + f" (layer{'s' if len(wrong) > 1 else ''} {_layers_text(wrong)}); the config does not describe the "
            "weights, so their figures would not be what it claims: fix config.json's quantization_config (bits, "
            "group_size) to what the checkpoint's quantizer wrote, or quantize again")
        error.record = {**record, "result": "refused: the quantization_config does not describe the experts"}
        raise error
    if len(wrong) == len(layers) and len(found) == 1:
        real = next(iter(found))
        fix = (f"run it with --backend {BACKEND_OF[real]}" if real in BACKEND_OF else
               "it is in no format quantbench runs")
        head = f"every MoE layer's experts are {real}"
    else:
        fix = ("quantize every expert (auto-round's layer_config / extra_config, or a quantizer's ignore list, kept "
               "some at another precision), or run the checkpoint under the backend its experts are in")
        head = f"only {len(layers) - len(wrong)} of {len(layers)} MoE layers' experts are {backend}"
    error = LoadError(f"{root}: not run as {backend}: {head} ({seen}), while --backend {backend} claims {what} "
                      f"experts; quantbench will not run it as {backend} (its figures would describe other weights): "
                      f"{fix}")
    error.record = {**record, "result": f"refused: {head}"}  # the failed run keeps the per-layer map
    raise error


def check_spec(backend: str, model: str | None, shape: str | None) -> dict[str, Any] | None:
    """The check for a run: None for a backend without a claim (a remote server, a plugin); a note for a synthetic
    model (quantbench built and quantized it in memory: there is no checkpoint to check)."""
    if backend not in CLAIMS:
        return None
    if shape:
        return {"result": "synthetic: built and quantized in memory by quantbench; no checkpoint to check"}
    if not model:
        return None
    root = Path(model)
    if not root.is_dir():
        from quantbench.models import hub

        if not hub.is_hub_id(model):
            return None
        root = hub.resolve(model).path
    return check(backend, root)
