"""INT4 W4A16 with Intel AutoRound: `AutoRound(model, tokenizer, scheme="W4A16", iters=..., dataset=texts)` then
`quantize_and_save(format="auto_round")`, the same calls as the reference card's recipe.

iters=0 is RTN (seconds), iters=200 SignRound (the card's recipe; minutes to hours). Experts only by default:
every Linear outside the MoE experts (attention, dense MLPs, lm_head) is pinned to 16 bits, and AutoRound itself
keeps the router `mlp.gate` in 16 bits. AutoRound writes into a subfolder of the output directory
(`out/<name>-w4g128/`); its files are moved up so `out` is the checkpoint.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from quantbench.errors import QuantbenchError
from quantbench.models.calibration import calibration_texts
from quantbench.models.checkpoint import load_causal_lm, safetensors_header


class _RichBar:
    """Stands in for the tqdm bar AutoRound's block loop drives: the same calls, drawn by rich on stderr."""

    def __init__(self, iterable: Any = None, total: int | None = None, **_: Any):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from quantbench.term import LineProgress, stderr_console

        total = total if total is not None else (len(iterable) if iterable is not None else None)
        self._iterable = iterable
        self._progress = LineProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("left at this pace"), TimeRemainingColumn(),
                                      console=stderr_console(), transient=False)
        self._task = self._progress.add_task("AutoRound: quantizing layers", total=total)
        self._progress.start()

    def __iter__(self):
        yield from self._iterable or []

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self._progress.update(self._task, description=f"AutoRound: {desc}")

    def update(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)

    def refresh(self) -> None:
        self._progress.refresh()

    def close(self) -> None:
        task = self._progress.tasks[0]
        if task.total is not None:
            self._progress.update(self._task, completed=task.total)
        self._progress.stop()


def non_expert_linears(model: torch.nn.Module) -> list[str]:
    """Every nn.Linear outside the MoE experts: what experts-only quantization keeps in 16 bits."""
    return [name for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".experts." not in f".{name}."]


def expert_projections(model: torch.nn.Module) -> int:
    """How many expert projections (gate, up, down of every expert of every MoE block) an experts-only export of
    `model` must hold in int4, counted before AutoRound unfuses the experts."""
    from quantbench.models.families import moe_layout

    layout = moe_layout(model)
    experts = int(model.config.get_text_config().num_experts)
    return len(layout.blocks) * experts * 3


def check_export(out: Path, expected: int) -> int:
    """The int4 expert projections (`…experts.E.{gate,up,down}_proj.qweight`) AutoRound wrote into `out`, from the
    safetensors headers; a QuantbenchError when fewer than `expected`. AutoRound can report success having written
    a config and no weights (0.16.1 does on a full Qwen3-Omni-MoE checkpoint, whose blocks it does not find)."""
    found = 0
    for f in sorted(out.glob("*.safetensors")):
        found += sum(1 for key in safetensors_header(f)[1] if _EXPERT_QWEIGHT.search(key))
    if found < expected:
        raise QuantbenchError(f"AutoRound reported success but {out} holds {found} of the {expected} int4 expert "
                              "projections (…experts.E.{gate,up,down}_proj.qweight); nothing usable was written. "
                              "Its log says why (e.g. 'could not find blocks')")
    return found


_EXPERT_QWEIGHT = re.compile(r"\.experts\.\d+\.(gate|up|down)_proj\.qweight$")


def quantize_autoround(source: Path | None, out: Path, recipe: Any, *, progress: bool = True, model: Any = None,
                       tokenizer: Any = None, dataset: list[Any] | None = None,
                       checkpoint_name: Callable[[str], str] = str, **library: Any) -> dict[str, Any]:
    """Quantize `source` (or `model` with `tokenizer`, already in memory) with AutoRound W4A16 into `out` (a
    checkpoint directory). Returns provenance details.

    `dataset`: calibration samples as AutoRound takes them (default: the rendered train-split texts);
    `checkpoint_name` maps a module name to the name its weights have in the checkpoint (AutoRound's layer_config
    matches those); `library`: further AutoRound arguments (a multimodal model's `processor`, `batch_size`)."""
    if model is None:
        from quantbench.make.quantize.source import source_tokenizer

        # Load before importing auto_round: once imported, it patches transformers' MoE blocks and a plain BF16
        # MoE checkpoint would load with random experts (load_causal_lm refuses that anyway).
        model = load_causal_lm(source, dtype=torch.bfloat16, device="cpu")
        tokenizer = source_tokenizer(source)
    if dataset is None:
        dataset = calibration_texts(tokenizer, recipe.nsamples, recipe.seqlen, recipe.seed)
    nsamples = min(recipe.nsamples, len(dataset))  # a calibration file may make fewer samples than asked
    options = {"batch_size": min(8, nsamples), **library}
    layer_config = ({checkpoint_name(name): {"bits": 16} for name in non_expert_linears(model)}
                    if recipe.experts_only else None)
    expected = expert_projections(model) if recipe.experts_only else 0

    from auto_round import AutoRound
    from auto_round.compressors import orchestrator

    bar = orchestrator.tqdm
    if progress:
        orchestrator.tqdm = _RichBar
    try:
        rounder = AutoRound(
            model, tokenizer, scheme="W4A16", group_size=recipe.group_size, iters=recipe.iters,
            dataset=dataset, nsamples=nsamples, seqlen=recipe.seqlen, seed=recipe.seed,
            layer_config=layer_config,
            **({} if recipe.opt_rtn else {"disable_opt_rtn": True}),  # --plain-rtn: no search, no calibration pass
            **options,
        )
        staging = out / ".autoround"
        _, folders = rounder.quantize_and_save(str(staging), format="auto_round")
    finally:
        orchestrator.tqdm = bar
    made = Path(folders[0] if isinstance(folders, list | tuple) else folders)
    if not (made / "config.json").is_file():
        raise QuantbenchError(f"AutoRound reported {made} but wrote no config.json there")
    for item in made.iterdir():
        shutil.move(str(item), out / item.name)
    shutil.rmtree(staging, ignore_errors=True)
    details = {"autoround_subfolder": made.name, "calibration_texts": len(dataset)}
    if expected:
        details["int4_expert_projections"] = check_export(out, expected)
    return details
