"""`quantbench plant`: a planted regression, a variant's copy with one tower broken (quantbench.make.plant)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantbench.cli.common import _fail, out
from quantbench.errors import QuantbenchError


def plant(
    source: Annotated[Path, typer.Option("--from", help="The variant to copy (a checkpoint directory, e.g. an INT4 "
                                         "of a Qwen3-Omni thinker)")] = ...,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the planted copy goes (a new directory)")] = ...,
    tower: Annotated[str, typer.Option(help="vision | audio: the only tower whose weights change")] = "vision",
    mode: Annotated[str, typer.Option(help="perturb (Gaussian noise) | quantize (round-to-nearest fake quant)")] = "perturb",
    seed: Annotated[int, typer.Option(help="perturb: the noise's seed")] = 0,
    scale: Annotated[float, typer.Option(help="perturb: the noise's size, times each weight tensor's std")] = 1.0,
    bits: Annotated[int, typer.Option(help="quantize: bits per weight (2-8), one scale per output row")] = 2,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists")] = False,
) -> None:
    """Plant a regression for the per-modality verdict to catch: copy a variant and break only its vision (or
    audio) tower. The copy says it is planted (quantbench_planted.json); its runs are labelled
    VARIANT+planted-TOWER. Not a variant to use."""
    from quantbench.make.plant import plant as do_plant  # lazy: a fast --help

    try:
        record = do_plant(source, out_dir, tower=tower, mode=mode, seed=seed, scale=scale, bits=bits,
                          overwrite=overwrite)
    except QuantbenchError as e:
        _fail(e)
    out.print(f"planted {out_dir}: {record['tower']} tower of {source}, {record['what']} "
              f"({record['tensors_changed']} tensors, {record['bytes_changed'] / 2**20:.1f} MiB); every other tensor "
              "copied byte for byte. Run it like its source (e.g. `quantbench run --backend int4 --model "
              f"{out_dir}`): its runs are labelled +planted-{record['tower']}.")
