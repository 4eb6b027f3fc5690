"""NVFP4 and FP8 with NVIDIA ModelOpt: `mtq.quantize(model, NVFP4_DEFAULT_CFG | FP8_DEFAULT_CFG, forward_loop)` over
rendered decision records, then `export_hf_checkpoint` (a `quant_method: modelopt` checkpoint, which
quantbench.models.modelopt reads). Runs on the CPU as well as on a GPU: calibration only collects each
quantizer's amax, and the export packs the weights in plain torch.

Experts only by default, matching the reference card: every nn.Linear outside the MoE experts (attention, dense
MLPs, lm_head) has its quantizers switched off, and ModelOpt's defaults already keep the router `mlp.gate` and
the embeddings in BF16. ModelOpt intercepts the fused transformers-5 experts only on the `eager` experts path,
so the model is loaded with that implementation for calibration.

A Qwen3-Omni-MoE checkpoint is calibrated as its thinker, read by quantbench's loader (the talker and code2wav are
never read; ModelOpt cannot export the full model, which has no `forward`). Its vision and audio towers have
quantizers besides their Linears (convolutions, LayerNorm inputs): `*audio_tower*` and `*visual*` are switched off
whole. Before the first calibration forward, every quantizer still enabled must sit under the MoE experts, or
quantizing stops naming it: nothing outside the experts ever fake-quantizes during calibration.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.make.quantize.watch import CalibrationWatch
from quantbench.models.calibration import calibration_inputs, calibration_texts
from quantbench.models.checkpoint import read_config
from quantbench.models.families import family_of

CONFIGS = {"nvfp4": "NVFP4_DEFAULT_CFG", "fp8": "FP8_DEFAULT_CFG"}


def modelopt_config(scheme: str, model: torch.nn.Module, experts_only: bool) -> dict[str, Any]:
    """ModelOpt's default config for `scheme`, plus one `enable: False` entry per non-expert Linear when
    experts_only (later entries win in ModelOpt's quant_cfg list)."""
    import modelopt.torch.quantization as mtq

    from quantbench.make.quantize.autoround import non_expert_linears

    if scheme not in CONFIGS:
        raise ConfigError(f"--scheme {scheme!r}: ModelOpt makes {', '.join(CONFIGS)}")
    cfg = copy.deepcopy(getattr(mtq, CONFIGS[scheme]))
    if experts_only:
        cfg["quant_cfg"] += [{"quantizer_name": f"{name}.*", "enable": False} for name in non_expert_linears(model)]
        cfg["quant_cfg"] += [{"quantizer_name": f"*{tower}*", "enable": False} for tower in encoder_towers(model)]
    return cfg


def encoder_towers(model: torch.nn.Module) -> list[str]:
    """The encoder towers `model` has (by module name, at any depth): those its family declares (a family that
    reads media: Qwen3-Omni's thinker's `audio_tower` and `visual`), kept BF16 whole."""
    from quantbench.models.families import family_of_model, supports_multimodal

    family = family_of_model(model)
    declared = sorted(family.towers.values()) if supports_multimodal(family) else []
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    return [tower for tower in declared if tower in names]


def quantizers_by_part(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """How many of the model's ModelOpt quantizers are enabled / disabled, by part: `experts`, each encoder
    tower, and `other` (attention, router, norms, embeddings, lm_head, ...)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    towers = encoder_towers(model)
    parts: dict[str, dict[str, int]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, TensorQuantizer):
            continue
        part = "experts" if ".experts." in f".{name}." else next(
            (t for t in towers if f".{t}." in f".{name}."), "other")
        counts = parts.setdefault(part, {"enabled": 0, "disabled": 0})
        counts["enabled" if module.is_enabled else "disabled"] += 1
    return parts


def check_experts_only(model: torch.nn.Module) -> None:
    """Refuse to calibrate when a quantizer outside the MoE experts is enabled (it would fake-quantize)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    stray = [name for name, m in model.named_modules()
             if isinstance(m, TensorQuantizer) and m.is_enabled and ".experts." not in f".{name}."]
    if stray:
        raise QuantbenchError(f"ModelOpt: {len(stray)} quantizers outside the MoE experts are enabled (first: "
                              f"{stray[0]}); experts-only quantizing would fake-quantize them during calibration. "
                              "Their modules need an `enable: False` entry in quantbench.make.quantize.modelopt")


def plain_disabled_convs(model: torch.nn.Module) -> int:
    """ModelOpt 0.47 sends an nn.Conv3d whose quantizers are configured NVFP4 to its CUDA implicit-GEMM kernel
    even when they are disabled (`_QuantConv3d._should_use_implicit_gemm` checks the format, not `is_enabled`):
    on the CPU a calibration forward with a picture or a video raises ("CUDA is not available"), and on a GPU the
    vision tower's patch embedding would run ModelOpt's kernel rather than the conv a decision runs. Every such
    module with no quantizer enabled takes ModelOpt's plain path (its quantizers off: the conv as it is); returns
    how many."""
    from modelopt.torch.quantization.nn import TensorQuantizer
    from modelopt.torch.quantization.nn.modules import quant_conv

    conv3d = getattr(quant_conv, "_QuantConv3d", None)
    if conv3d is None or not hasattr(conv3d, "_should_use_implicit_gemm"):
        return 0
    changed = 0
    for module in model.modules():
        quantizers = [q for q in module.children() if isinstance(q, TensorQuantizer)]
        if isinstance(module, conv3d) and not any(q.is_enabled for q in quantizers):
            module._should_use_implicit_gemm = lambda: False  # the instance's own: others keep ModelOpt's choice
            changed += 1
    return changed


def load_for_calibration(source: str | Path, device: str) -> torch.nn.Module:
    """The BF16 model on transformers' `eager` experts path (where ModelOpt intercepts fused experts), as its
    family loads it for calibration: a causal LM, or a Qwen3-Omni-MoE checkpoint's thinker as quantbench's loader
    reads it (full or thinker-only, any key layout; the talker and code2wav never read)."""
    source = Path(source)
    return family_of(read_config(source)).load_for_calibration(source, device)


def _progress(total: int, enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from quantbench.term import LineProgress, stderr_console

    return LineProgress(TextColumn("ModelOpt: calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("left at this pace"), TimeRemainingColumn(), console=stderr_console(),
                        disable=not enabled, transient=False)


def quantize_modelopt(
    source_dir: str | Path,
    scheme: str,
    out_dir: str | Path,
    *,
    texts: list[str] | None = None,
    nsamples: int = 128,
    seqlen: int = 512,
    experts_only: bool = True,
    progress: bool = True,
    device: str | None = None,
    seen: dict[str, Any] | None = None,
    batches_for: Callable[[torch.nn.Module, Any], list[dict[str, Any]]] | None = None,
) -> Path:
    """Quantize the BF16 checkpoint `source_dir` to `scheme` (nvfp4 | fp8) into `out_dir`; returns `out_dir`.
    `texts`: calibration texts (default: quantbench.models.calibration.calibration_texts, the train split rendered).
    `batches_for(model, tokenizer)`, when given, makes the calibration batches instead (dicts of forward inputs: a
    Qwen3-Omni thinker's media samples), once the model is loaded.
    `seen`, when given, receives what calibration ran with: `quantizers` (quantizers_by_part, as the first
    calibration forward found them), `disabled` (what experts-only switched off beyond ModelOpt's defaults),
    `samples`, and `forwards` (quantize/watch.py: the forwards run, the towers' calls, checked against the
    batches)."""
    from quantbench.make.quantize.source import source_tokenizer

    source, out = Path(source_dir), Path(out_dir)
    if scheme not in CONFIGS:
        raise ConfigError(f"--scheme {scheme!r}: ModelOpt makes {', '.join(CONFIGS)}")
    tokenizer = source_tokenizer(source)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_for_calibration(source, device)
    if batches_for is not None:
        batches = batches_for(model, tokenizer)
    else:
        if texts is None:
            texts = calibration_texts(tokenizer, nsamples, seqlen)
        batches = calibration_inputs(tokenizer, texts[:nsamples], seqlen)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not tested with current version of modelopt.*")
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

    cfg = modelopt_config(scheme, model, experts_only)
    if seen is not None and experts_only:
        from quantbench.make.quantize.autoround import non_expert_linears

        seen["disabled"] = {"non_expert_linears": len(non_expert_linears(model)),
                            "towers": [f"*{t}*" for t in encoder_towers(model)]}

    watches: list[CalibrationWatch] = []

    def forward_loop(m: torch.nn.Module) -> None:
        if experts_only:
            check_experts_only(m)
        plain = plain_disabled_convs(m)
        if seen is not None:
            seen["quantizers"] = quantizers_by_part(m)
            seen["plain_disabled_conv3d"] = plain
        watches[:] = [CalibrationWatch(m)]  # per call: a library calling the loop twice sees two whole passes
        with _progress(len(batches), progress) as bar, torch.inference_mode(), watches[0]:
            task = bar.add_task("calibrate", total=len(batches))
            for inputs in batches:
                m(**{k: v.to(device) for k, v in inputs.items()}, use_cache=False)
                bar.advance(task)

    mtq.quantize(model, cfg, forward_loop)
    samples = sum(len(b["input_ids"]) for b in batches)
    if seen is not None:
        seen["samples"] = samples
        seen["forwards"] = watches[0].check(batches, "ModelOpt")
    if progress:
        from quantbench.term import stderr_console

        stderr_console().print(f"ModelOpt: {scheme} quantizers calibrated on {samples} samples; exporting",
                               highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=out)
    tokenizer.save_pretrained(out)
    if not list(out.glob("*.safetensors")):
        raise QuantbenchError(f"ModelOpt wrote no *.safetensors into {out}; the export failed")
    return out
