"""Which quantized format a checkpoint is in, from its config: the names its quantized Linears' tensors have.

Three producers write the same NVFP4 numbers under different names:

    producer (config.json quantization_config)            weight          block scale    global scale           activation scale
    ModelOpt (quant_method modelopt, quant_algo NVFP4)    weight uint8    weight_scale   weight_scale_2         input_scale
    compressed-tensors (format nvfp4-pack-quantized)      weight_packed   weight_scale   weight_global_scale⁻¹  input_global_scale⁻¹
    auto-round (packing_format auto_round:llm_compressor) weight_packed   weight_scale   weight_global_scale⁻¹  input_global_scale⁻¹

(⁻¹: stored as the reciprocal, 448 · 6 / amax.) FP8: ModelOpt (quant_algo FP8: `weight` E4M3, `weight_scale`
per tensor, `input_scale`) and compressed-tensors (format float-quantized: per-tensor or per-channel
`weight_scale`, static `input_scale` or dynamic per-token activations).

A format this module does not know is refused with a LoadError naming the config field and what is read instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantbench.errors import LoadError
from quantbench.models.checkpoint import json_file, read_config

HF_QUANT_CONFIG = "hf_quant_config.json"  # where older ModelOpt exports keep their quantization, beside config.json


@dataclass(frozen=True)
class Layout:
    """How one checkpoint stores its quantized Linears."""

    scheme: str  # nvfp4 | fp8
    producer: str  # modelopt | compressed-tensors | auto-round
    weight: str  # name of the quantized weight tensor within a Linear
    global_scale: str | None  # nvfp4: the per-tensor scale
    input_scale: str | None  # the static activation scale
    reciprocal: bool  # global and input scales stored as 1 / scale
    activations: str  # static | dynamic | none
    detail: str  # e.g. "modelopt 0.47.0, quant_algo NVFP4, group 16"

    @property
    def weight_format(self) -> str:
        acts = {"nvfp4": {"static": "w4a4", "none": "w4a16"}, "fp8": {"static": "w8a8", "dynamic": "w8a8 dynamic",
                                                                           "none": "w8a16"}}[self.scheme][self.activations]
        return f"{self.scheme} {acts}{' g16' if self.scheme == 'nvfp4' else ''} ({self.detail})"


def _unsupported(path: Path, what: str, fix: str, where: str = "config.json quantization_config") -> LoadError:
    return LoadError(f"{path}/{where}: {what}; {fix}")


def read_layout(path: str | Path) -> Layout:
    """The quantization layout of checkpoint `path`, from config.json (and hf_quant_config.json)."""
    root = Path(path)
    config = read_config(root)
    qc = config.get("quantization_config")
    hf_quant = root / HF_QUANT_CONFIG
    where = "config.json quantization_config"
    if qc is None and hf_quant.is_file():  # older ModelOpt exports keep it beside config.json only
        q = _hf_quant_config(hf_quant)
        qc = {"quant_method": "modelopt", "quant_algo": q.get("quant_algo"), "kv_cache_quant_algo": q.get("kv_cache_quant_algo")}
        if "group_size" in q:  # its NVFP4 block size, checked as config.json's config_groups' is
            qc["config_groups"] = {"group_0": {"weights": {"group_size": q["group_size"]}}}
        where = f"{HF_QUANT_CONFIG} quantization"
    if qc is not None and not isinstance(qc, dict):
        raise LoadError(f"{root}/config.json: quantization_config must be a JSON object, got {type(qc).__name__} "
                        f"{qc!r:.60}; fix or restore the file (a quantizer writes an object with quant_method)")
    if not qc:
        raise LoadError(f"{root}: not a quantized checkpoint (config.json has no quantization_config); run it with "
                        "--backend bf16, or make a variant with `quantbench quantize --scheme nvfp4|fp8`")
    method = qc.get("quant_method")
    # ModelOpt writes its KV-cache quantization to config.json as compressed-tensors' `kv_cache_scheme` (its
    # hf_quant_config.json says kv_cache_quant_algo): such a checkpoint was refused for its k_scale / v_scale
    # tensors as "not matching its config"; it is named here, as the hf_quant_config.json form is.
    kv = qc.get("kv_cache_quant_algo") or qc.get("kv_cache_scheme")
    if kv:
        raise _unsupported(root, f"{'kv_cache_quant_algo' if qc.get('kv_cache_quant_algo') else 'kv_cache_scheme'} "
                           f"{kv!r}", "KV-cache quantization is not emulated: export without it", where)
    if method == "modelopt":
        return _modelopt_layout(root, qc, where)
    if method == "compressed-tensors":
        return _compressed_tensors_layout(root, qc)
    if method in ("auto-round", "auto_round", "intel/auto-round"):
        return _autoround_layout(root, qc)
    if method == "fp8":
        raise _unsupported(root, f"quant_method fp8 with weight_block_size {qc.get('weight_block_size')} (block-wise "
                           "`weight_scale_inv`)", "quantbench's fp8 backend reads per-tensor and per-channel FP8 "
                           "(ModelOpt FP8, compressed-tensors float-quantized)")
    raise _unsupported(root, f"quant_method {method!r} is not NVFP4 or FP8", "the int4 backend reads AutoRound and GPTQ int4; "
                       "nvfp4 / fp8 read ModelOpt, compressed-tensors and auto-round NVFP4 checkpoints")


def _obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one: a config field of another type reads as absent."""
    return value if isinstance(value, dict) else {}


def _hf_quant_config(file: Path) -> dict[str, Any]:
    """The `quantization` object of a ModelOpt hf_quant_config.json, or a LoadError naming the file and the fix."""
    fix = "fix or restore the file (ModelOpt writes {\"producer\": ..., \"quantization\": {\"quant_algo\": ...}})"
    data = json_file(file, fix)
    quantization = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(quantization, dict):
        got = f"a {type(data).__name__}" if not isinstance(data, dict) else \
            f"quantization {type(quantization).__name__}" if "quantization" in data else "no quantization"
        raise LoadError(f"{file}: must be a JSON object with a quantization object, got {got}; {fix}")
    return quantization


def _modelopt_layout(root: Path, qc: dict[str, Any], where: str) -> Layout:
    algo = qc.get("quant_algo")
    producer = _obj(qc.get("producer")).get("version", "")

    def made_by(*how: str) -> str:  # "modelopt 0.47.0", then what is particular to the algorithm
        return ", ".join([f"modelopt {producer}".strip(), *how])

    if algo in ("NVFP4", "W4A16_NVFP4"):  # W4A16_NVFP4: the same weights, 16-bit activations (no input_scale)
        group = _obj(_obj(_obj(qc.get("config_groups")).get("group_0")).get("weights")).get("group_size", 16)
        if group != 16:
            raise _unsupported(root, f"NVFP4 group_size {group}", "NVFP4 blocks are 16 elements", where)
        if algo == "W4A16_NVFP4":
            return Layout("nvfp4", "modelopt", "weight", "weight_scale_2", None, False, "none", made_by(algo))
        return Layout("nvfp4", "modelopt", "weight", "weight_scale_2", "input_scale", False, "static", made_by())
    if algo == "FP8":
        return Layout("fp8", "modelopt", "weight", None, "input_scale", False, "static", made_by())
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":  # a weight scale per output row, a per-token activation scale on the fly
        return Layout("fp8", "modelopt", "weight", None, "input_scale", False, "dynamic",
                      made_by("per-channel scales", "per-token activations"))
    raise _unsupported(root, f"ModelOpt quant_algo {algo!r}", "quantbench reads quant_algo NVFP4, W4A16_NVFP4, FP8 and "
                       "FP8_PER_CHANNEL_PER_TOKEN", where)


def _ct_groups(root: Path, qc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    groups = list((qc.get("config_groups") or {}).values())
    schemes = {json.dumps({k: g.get(k) for k in ("weights", "input_activations")}, sort_keys=True) for g in groups}
    if len(schemes) != 1:
        raise _unsupported(root, f"{len(groups)} config_groups with {len(schemes)} different schemes",
                           "quantbench reads checkpoints with one scheme for every quantized Linear")
    return groups[0].get("weights") or {}, groups[0].get("input_activations")


def _compressed_tensors_layout(root: Path, qc: dict[str, Any]) -> Layout:
    fmt = qc.get("format")
    weights, acts = _ct_groups(root, qc)
    if fmt == "nvfp4-pack-quantized":
        if weights.get("num_bits") != 4 or weights.get("type") != "float" or weights.get("group_size") != 16:
            raise _unsupported(root, f"nvfp4-pack-quantized weights {weights}", "expected 4-bit float, group_size 16")
        return Layout("nvfp4", "compressed-tensors", "weight_packed", "weight_global_scale", "input_global_scale",
                      True, "static" if acts else "none", "compressed-tensors nvfp4-pack-quantized")
    if fmt == "float-quantized":
        if weights.get("num_bits") != 8 or weights.get("type") != "float":
            raise _unsupported(root, f"float-quantized weights {weights}", "expected 8-bit float (E4M3)")
        if weights.get("strategy") not in ("tensor", "channel"):
            raise _unsupported(root, f"FP8 weight strategy {weights.get('strategy')!r}",
                               "quantbench reads per-tensor and per-channel FP8 weight scales")
        mode = "none" if not acts else "dynamic" if acts.get("dynamic") else "static"
        return Layout("fp8", "compressed-tensors", "weight", None, "input_scale", False, mode,
                      f"compressed-tensors float-quantized, {weights.get('strategy')} scales")
    raise _unsupported(root, f"compressed-tensors format {fmt!r}",
                       "quantbench reads nvfp4-pack-quantized (NVFP4) and float-quantized (FP8)")


def _autoround_layout(root: Path, qc: dict[str, Any]) -> Layout:
    data_type, bits = str(qc.get("data_type", "")), qc.get("bits")
    if data_type in ("nv_fp", "nv_fp4") and bits == 4 and qc.get("packing_format") == "auto_round:llm_compressor":
        if qc.get("group_size", 16) != 16:
            raise _unsupported(root, f"auto-round NVFP4 group_size {qc.get('group_size')}", "NVFP4 blocks are 16")
        acts = "static" if (qc.get("act_bits") or 16) <= 4 else "none"
        return Layout("nvfp4", "auto-round", "weight_packed", "weight_global_scale", "input_global_scale", True, acts,
                      f"auto-round {qc.get('autoround_version', '')} {qc.get('packing_format')}".strip())
    raise _unsupported(root, f"auto-round data_type {data_type!r}, bits {bits}, packing_format {qc.get('packing_format')!r}",
                       "for AutoRound int4 use --backend int4; nvfp4 reads data_type nv_fp, auto_round:llm_compressor")
