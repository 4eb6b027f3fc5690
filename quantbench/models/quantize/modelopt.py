"""NVFP4 and FP8 with NVIDIA ModelOpt: `mtq.quantize(model, NVFP4_DEFAULT_CFG | FP8_DEFAULT_CFG, forward_loop)` over
rendered decision records, then `export_hf_checkpoint` (a `quant_method: modelopt` checkpoint, which
quantbench.models.modelopt reads). Runs on the CPU as well as on a GPU: calibration only collects each
quantizer's amax, and the export packs the weights in plain torch.

Experts only by default, matching the reference card: every nn.Linear outside the MoE experts (attention, dense
MLPs, lm_head) has its quantizers switched off, and ModelOpt's defaults already keep the router `mlp.gate` and
the embeddings in BF16. ModelOpt intercepts the fused transformers-5 experts only on the `eager` experts path,
so the model is loaded with that implementation for calibration.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.models.calibration import calibration_texts
from quantbench.models.checkpoint import load_causal_lm

CONFIGS = {"nvfp4": "NVFP4_DEFAULT_CFG", "fp8": "FP8_DEFAULT_CFG"}


def modelopt_config(scheme: str, model: torch.nn.Module, experts_only: bool) -> dict[str, Any]:
    """ModelOpt's default config for `scheme`, plus one `enable: False` entry per non-expert Linear when
    experts_only (later entries win in ModelOpt's quant_cfg list)."""
    import modelopt.torch.quantization as mtq

    from quantbench.models.quantize.autoround import non_expert_linears

    if scheme not in CONFIGS:
        raise ConfigError(f"--scheme {scheme!r}: ModelOpt makes {', '.join(CONFIGS)}")
    cfg = copy.deepcopy(getattr(mtq, CONFIGS[scheme]))
    if experts_only:
        cfg["quant_cfg"] += [{"quantizer_name": f"{name}.*", "enable": False} for name in non_expert_linears(model)]
    return cfg


def calibration_batches(tokenizer: Any, texts: list[str], seqlen: int, batch: int = 8) -> list[torch.Tensor]:
    """The texts' token ids cut to seqlen, in batches of up to `batch` rows of equal length (the texts are packed
    to at least seqlen tokens, so nearly all are full rows): fewer passes through the eager experts loop."""
    by_length: dict[int, list[list[int]]] = {}
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False, truncation=True, max_length=seqlen)["input_ids"]
        by_length.setdefault(len(ids), []).append(ids)
    return [torch.tensor(rows[i : i + batch]) for rows in by_length.values() for i in range(0, len(rows), batch)]


def _progress(total: int, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from quantbench.term import LineProgress, stderr_console

    return LineProgress(TextColumn("ModelOpt: calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=stderr_console(), disable=not enabled, transient=False)


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
) -> Path:
    """Quantize the BF16 checkpoint `source_dir` to `scheme` (nvfp4 | fp8) into `out_dir`; returns `out_dir`.
    `texts`: calibration texts (default: quantbench.models.calibration.calibration_texts, the train split rendered)."""
    from transformers import AutoTokenizer

    source, out = Path(source_dir), Path(out_dir)
    if scheme not in CONFIGS:
        raise ConfigError(f"--scheme {scheme!r}: ModelOpt makes {', '.join(CONFIGS)}")
    tokenizer = AutoTokenizer.from_pretrained(source)
    if texts is None:
        texts = calibration_texts(tokenizer, nsamples, seqlen)
    batches = calibration_batches(tokenizer, texts[:nsamples], seqlen)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_causal_lm(source, dtype=torch.bfloat16, device=device, experts_implementation="eager")

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not tested with current version of modelopt.*")
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

    cfg = modelopt_config(scheme, model, experts_only)

    def forward_loop(m: torch.nn.Module) -> None:
        with _progress(len(batches), progress) as bar, torch.inference_mode():
            task = bar.add_task("calibrate", total=len(batches))
            for ids in batches:
                m(input_ids=ids.to(device), use_cache=False)
                bar.advance(task)

    mtq.quantize(model, cfg, forward_loop)
    if progress:
        from quantbench.term import stderr_console

        stderr_console().print(f"ModelOpt: {scheme} quantizers calibrated on {sum(len(b) for b in batches)} samples; "
                               "exporting", highlight=False)
    out.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=out)
    tokenizer.save_pretrained(out)
    if not list(out.glob("*.safetensors")):
        raise QuantbenchError(f"ModelOpt wrote no *.safetensors into {out}; the export failed")
    return out
