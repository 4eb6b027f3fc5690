"""The commands that make models: `fixture` (the embedded model, or a synthetic real shape) and `quantize`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantbench.cli.common import _fail, err, out
from quantbench.errors import ConfigError, QuantbenchError


def fixture(
    rebuild: Annotated[bool, typer.Option(help="Build again even if cached")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write the checkpoint here instead of the cache")] = None,
    shape: Annotated[str | None, typer.Option(help="Instead: the same family at a real shape (qwen3-30b-a3b | qwen3-omni-30b-a3b) with "
                                                   "seeded random weights, written to --out (weights: synthetic)")] = None,
    layers: Annotated[int | None, typer.Option(help="--shape: number of layers (default: the real model's)")] = None,
    seed: Annotated[int, typer.Option(help="--shape: the random weights' seed")] = 0,
    family: Annotated[str, typer.Option(help="text: the Qwen3-MoE default model | omni: the Qwen3-Omni thinker "
                                             "default model (vision and audio towers), scored on quantbench-omni-v1")] = "text",
) -> None:
    """Build (or show) the embedded default model: a small trained Qwen3-MoE with its own tokenizer (--family omni:
    a small trained Qwen3-Omni thinker that also reads images, audio and video)."""
    from quantbench.make.fixture import find_or_build  # lazy: a fast --help
    from quantbench.make.synthetic import save_synthetic
    from quantbench.models.families import synthetic_shapes
    from quantbench.models.synthetic import synthetic_id

    try:
        if family not in ("text", "omni"):
            raise ConfigError(f"--family {family!r}: use text or omni")
        if shape is None:
            if layers is not None:
                raise ConfigError("--layers applies to --shape only: the embedded model's layers are part of its recipe")
            if family == "omni":
                from quantbench.make.omni_fixture import find_or_build_omni  # lazy: a fast --help

                info = find_or_build_omni(rebuild, out_dir)
            else:
                info = find_or_build(rebuild, out_dir)
            from quantbench.models.checkpoint import model_identity

            # the id its runs record: the recipe's, tagged with the weights' hash (another build, another id)
            out.print(f"fixture [bold]{model_identity(info.path)['model_id']}[/] at {info.path}")
            how = f"built in {info.train_seconds:.0f} s of training" if info.train_seconds is not None else "cached"
            out.print(f"{how}; {info.parameters / 1e6:.1f} M parameters, {info.size_bytes / 2**20:.1f} MiB "
                      "(bf16 safetensors)")
            suite = "quantbench-omni-v1" if family == "omni" else "built-in suite"
            table = Table("family", "held-out accuracy", title=f"{suite} (never trained on)")
            for family, acc in info.accuracy.items():
                table.add_row(family, f"{acc:.1%}")
            table.add_row("[bold]accuracy (mean over families)[/]", f"[bold]{info.overall:.1%}[/]")
            out.print(table)
            return
        if family != "text":
            raise ConfigError("--family omni builds the trained omni default model; --shape builds a random-weight "
                              "model of a real shape: give one of them")
        if shape not in synthetic_shapes():
            raise ConfigError(f"--shape {shape!r}: use one of {', '.join(sorted(synthetic_shapes()))}")
        if out_dir is None:
            raise ConfigError("--shape writes a checkpoint (61 GB at 48 layers): give --out DIR")
        if layers is not None and layers < 1:
            raise ConfigError(f"--layers {layers}: give at least 1")
        with err.status(f"building {synthetic_id(shape, layers, seed)} …"):
            path = save_synthetic(shape, out_dir, layers=layers, seed=seed)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        out.print(f"{synthetic_id(shape, layers, seed)} (random weights: speed and memory only) at {path}, "
                  f"{size / 1e9:.2f} GB")
    except QuantbenchError as e:
        _fail(e)


def quantize(
    model: Annotated[str | None, typer.Option(help="BF16 checkpoint dir or hub id org/name[@revision]. Default: the embedded fixture")] = None,
    scheme: Annotated[str, typer.Option(help="int4 (AutoRound W4A16) | nvfp4 (ModelOpt) | fp8 (ModelOpt)")] = "int4",
    out_dir: Annotated[Path, typer.Option("--out", help="Where the quantized checkpoint goes (a new dir)")] = ...,
    iters: Annotated[int, typer.Option(help="int4: 0 = RTN (fast), 200 = SignRound")] = 0,
    nsamples: Annotated[int, typer.Option(help="Calibration samples (rendered decision records)")] = 128,
    seqlen: Annotated[int, typer.Option(help="Calibration sequence length (tokens)")] = 512,
    group_size: Annotated[int, typer.Option(help="int4 group size")] = 128,
    experts_only: Annotated[bool, typer.Option("--experts-only/--all", help="Quantize only the MoE experts (as the card)")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists")] = False,
    shape: Annotated[str | None, typer.Option(help="int4: quantize the synthetic model of `run --shape` (e.g. "
                                              "qwen3-30b-a3b) from memory instead of a checkpoint")] = None,
    layers: Annotated[int | None, typer.Option(help="--shape: its number of layers (default: the real one)")] = None,
    seed: Annotated[int, typer.Option(help="--shape: the seed of its random weights (as `run --seed`)")] = 0,
    opt_rtn: Annotated[bool, typer.Option("--opt-rtn/--plain-rtn", help="int4 with --iters 0: auto-round's "
                                          "optimized RTN (its default: a search per group, which it skips for MoE "
                                          "experts) or plain round-to-nearest (its disable_opt_rtn: no "
                                          "calibration pass)")] = True,
    calibration: Annotated[Path | None, typer.Option(help="Calibrate on these decision records (a JSONL suite "
                                                     "file; gold answers used when present) instead of the built-in "
                                                     "train split; records with media run a Qwen3-Omni thinker's "
                                                     "vision / audio towers")] = None,
) -> None:
    """Make a quantized variant with the library that owns the format (auto-round, nvidia-modelopt)."""
    from quantbench.make.quantize import quantize as do_quantize  # lazy: a fast --help

    try:
        if model is not None and shape is not None:
            raise ConfigError("give --model or --shape, not both")
        ignored = [f"{flag} {value}" for flag, value, default in (("--group-size", group_size, 128), ("--iters", iters, 0))
                   if scheme in ("nvfp4", "fp8") and value != default]
        if ignored:  # before: accepted, recorded in the recipe and its hash, and without effect on the weights
            raise ConfigError(f"{' and '.join(ignored)} with --scheme {scheme}: auto-round's int4 settings; ModelOpt's "
                              f"{scheme} has fixed blocks (NVFP4: 16 elements, FP8: a scale per tensor) and "
                              "calibrates in one pass; drop them, or use --scheme int4")
        if model is None and shape is None:
            from quantbench.make.fixture import default_model_dir  # lazy: a fast --help

            model = str(default_model_dir())
        path = do_quantize(model, scheme, out_dir, iters=iters, nsamples=nsamples, seqlen=seqlen,
                           group_size=group_size, experts_only=experts_only, overwrite=overwrite, shape=shape,
                           layers=layers, weights_seed=seed, opt_rtn=opt_rtn, calibration=calibration)
        out.print(f"[green]quantized[/] {model or shape} → [bold]{path}[/] ({scheme}); run it with "
                  f"`quantbench run --backend {scheme} --model {path}`")
    except QuantbenchError as e:
        _fail(e)
