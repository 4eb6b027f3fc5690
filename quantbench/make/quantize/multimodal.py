"""Quantizing a model family that reads media (`supports_multimodal(family)`: today Qwen3-Omni-MoE, a full
checkpoint or its thinker alone) as the reference card did: only the MoE experts of the part a decision reads (the
thinker); attention, router, norms, embeddings, lm_head and the vision and audio towers stay BF16 (checked
byte-identical afterwards by quantize/unchanged.py). The variant is a checkpoint of that part alone (the family's
`standalone_config`): a decision reads the thinker alone, and what it never reads (the family's `unread_prefixes`:
the talker and code2wav) is dropped, its size recorded. What is Qwen3-Omni's below is named by its family, not here.

The libraries' own omni paths do not work with the pinned versions (../shared/reference/qwen3-omni.md §5, §6), so:

  int4   auto-round on a thinker-only BF16 copy in hub names (the source's thinker tensors renamed, bytes
         untouched), loaded by transformers, with `processor=tokenizer` (its multimodal compressor requires one)
         and every non-expert Linear pinned to 16 bits in checkpoint names (`model.layers.N…`, `visual.…`,
         `audio_tower.…`). On a full checkpoint auto-round's own handler looks for `thinker.model.layers`, finds no
         blocks on transformers 5.24, and exits "successfully" writing a config and no weights; on a thinker loaded
         from a full checkpoint it copies the talker and code2wav, RTN-quantizing code2wav's MLPs.
  nvfp4  ModelOpt on the thinker as quantbench's loader reads it (any layout; the talker never read: ModelOpt
  fp8    cannot export the full model, which has no `forward`), experts on the `eager` path, the quantizers of
         `*audio_tower*`, `*visual*` and every non-expert Linear disabled (quantize/modelopt.py).

Each library runs in a child process (`python -m quantbench.make.quantize.multimodal`): importing auto-round changes
how transformers loads MoE checkpoints, and ModelOpt patches module classes, in the process that does it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.models.checkpoint import read_config, unread_tensors
from quantbench.models.families import family_of, has_key_layouts

# The files a thinker-only variant keeps from its source besides the weights and config: tokenizer and processor
# (the media a decision carries is prepared by the checkpoint's own processor files).
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
              "added_tokens.json", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
              "video_preprocessor_config.json", "processor_config.json")


def quantize_multimodal(source: Path, out: Path, recipe: Any, log: Path, *, progress: bool = True,
                        calibration: Path | None = None) -> dict[str, Any]:
    """Quantize the part a decision reads of the checkpoint `source` (a family that reads media) into `out` (a
    checkpoint of that part alone); returns the provenance details: the route taken, what was dropped, what the
    library step reported (with `calibration`, a calibration file: what it fed, media records through the towers)."""
    from quantbench.make.quantize.recipe import library_versions
    from quantbench.term import stderr_console

    config = read_config(source)
    family = family_of(config)
    if not recipe.experts_only:
        raise ConfigError(f"--all: {family.title} checkpoints are quantized experts only (the card's recipe; quantbench "
                          "runs this family with quantized experts and everything else BF16); drop --all")
    say = stderr_console()
    versions = library_versions()
    details: dict[str, Any] = {"family": family.name, "source_model_type": config.get("model_type")}
    unread = family.unread_prefixes(config) if has_key_layouts(family) else ()
    if unread:
        dropped = unread_tensors(source, unread)
        details["dropped"] = {**dropped, "why": "a decision reads the thinker alone; the variant is thinker-only"}
        say.print(f"{recipe.scheme}: the thinker only: talker + code2wav dropped ({dropped['tensors']} tensors, "
                  f"{dropped['bytes']:,} bytes)", highlight=False)
    work = out.with_name(f".{out.name}.thinker-bf16")
    shutil.rmtree(work, ignore_errors=True)
    try:
        if recipe.scheme == "int4":
            made = thinker_copy(source, work)
            quantized_from = work if made else source
            if made:
                details["thinker_copy"] = made
                say.print(f"int4: thinker-only BF16 copy written ({made['tensors']} tensors, {made['bytes']:,} "
                          "bytes); auto-round quantizes that", highlight=False)
            details["route"] = (
                f"auto-round {versions.get('auto-round')} on "
                + ("a thinker-only BF16 copy in hub names" if made else "the thinker-only source as it is")
                + f" (its own omni handler finds no blocks on transformers {versions.get('transformers')} and "
                "exits writing no weights), processor=tokenizer, every non-expert Linear incl. visual / "
                "audio_tower pinned to 16 bits in checkpoint names; experts unfused and stored per expert")
        else:
            quantized_from = source
            details["route"] = (
                f"nvidia-modelopt {versions.get('nvidia-modelopt')} on the thinker as quantbench's loader reads it "
                "(talker and code2wav never read: ModelOpt cannot export the full model, which has no forward), "
                "experts on transformers' eager path; the quantizers of *audio_tower*, *visual* and every "
                "non-expert Linear disabled before calibration")
        say.print(f"{recipe.scheme}: the library runs in a child process (its output: {log})", highlight=False)
        file = {"calibration": calibration} if calibration is not None else {}  # run_child's signature as it was
        details.update(run_child(recipe, quantized_from, out, progress=progress, **file))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    copy_side_files(source, out)
    return details


def thinker_copy(source: Path, dst: Path) -> dict[str, Any] | None:
    """A thinker-only BF16 checkpoint at `dst` in hub names (`model.layers.N…`, `visual.…`, `audio_tower.…`,
    `lm_head.…`), shard by shard, each tensor's bytes untouched; None when `source` is one already. The config is
    the thinker's own (its family's `standalone_config`)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from quantbench.models.lineage import canonical_tensor_name

    config = read_config(source)
    standalone = family_of(config).standalone_config(config)
    files = sorted(source.glob("*.safetensors"))
    keys = {f: list(safe_open(str(f), framework="pt").keys()) for f in files}
    if standalone.get("model_type") == config.get("model_type") and all(canonical_tensor_name(k) == k
                                                                         for ks in keys.values() for k in ks):
        return None
    dst.mkdir(parents=True)
    shards = [f for f in files if any(canonical_tensor_name(k) is not None for k in keys[f])]
    weight_map: dict[str, str] = {}
    nbytes = 0
    for i, f in enumerate(shards, 1):
        handle = safe_open(str(f), framework="pt")
        shard = {name: handle.get_tensor(key) for key in keys[f] if (name := canonical_tensor_name(key)) is not None}
        file = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(dst / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
        nbytes += sum(t.numel() * t.element_size() for t in shard.values())
    if len(shards) > 1:
        index = {"metadata": {"total_size": nbytes}, "weight_map": dict(sorted(weight_map.items()))}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (dst / "config.json").write_text(json.dumps(standalone, indent=2) + "\n")
    copy_side_files(source, dst)
    return {"tensors": len(weight_map), "bytes": nbytes}


def copy_side_files(source: Path, out: Path) -> list[str]:
    """The source's tokenizer and processor files (SIDE_FILES) that `out` does not have yet, copied."""
    copied = []
    for name in SIDE_FILES:
        if (source / name).is_file() and not (out / name).exists():
            shutil.copy2(source / name, out / name)
            copied.append(name)
    return copied


def run_child(recipe: Any, source: Path, out: Path, *, progress: bool, calibration: Path | None = None) -> dict[str, Any]:
    """The library step in a child process; its details come back through a file in `out`'s parent, and so
    does an expected error (a calibration record the model cannot read), raised here with its message."""
    answer = out.with_name(f".{out.name}.details.json")
    answer.unlink(missing_ok=True)
    job = {"recipe": recipe.to_dict(), "source": str(source), "out": str(out), "progress": progress,
           "answer": str(answer), "calibration": str(calibration) if calibration is not None else None}
    root = str(Path(__file__).resolve().parents[3])  # the directory that holds the quantbench package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-m", __name__, json.dumps(job)], env=env, check=False)
    try:
        told = json.loads(answer.read_text()) if answer.is_file() else {}
        if "error" in told:
            raise (ConfigError if told["kind"] == "ConfigError" else QuantbenchError)(told["error"])
        if done.returncode != 0 or not answer.is_file():
            raise QuantbenchError(f"{recipe.scheme}: the {'auto-round' if recipe.scheme == 'int4' else 'ModelOpt'} "
                                  f"child process failed (exit {done.returncode}); its error is at the end of the "
                                  "libraries' log")
        return told
    finally:
        answer.unlink(missing_ok=True)


def calibration_batches(model: Any, tokenizer: Any, checkpoint: Path, recipe: Any, calibration: str | None,
                        batch: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """In the child: the calibration batches (dicts of forward inputs; text rows `batch` to a dict) and, for a
    calibration file, its provenance. Default: the train split's packed texts. With a file: its text records
    packed, and each question of a media record through the engine's media path (calibration.media_sampler)."""
    from quantbench.models.calibration import (
        calibration_inputs,
        calibration_texts,
        file_samples,
        load_calibration,
        media_sampler,
    )

    if calibration is None:
        texts = calibration_texts(tokenizer, recipe.nsamples, recipe.seqlen, recipe.seed)
        return calibration_inputs(tokenizer, texts, recipe.seqlen, batch=batch), None
    cal = load_calibration(calibration)
    if cal.hash != recipe.calibration_hash:
        raise ConfigError(f"--calibration {cal.path} changed while quantizing (its hash is not the recipe's); run again")
    samples, made = file_samples(cal, tokenizer, recipe.nsamples, recipe.seqlen,
                                 media_sampler(model, tokenizer, checkpoint, cal))
    texts = [s for s in samples if isinstance(s, str)]
    return calibration_inputs(tokenizer, texts, recipe.seqlen, batch=batch) + [s for s in samples if isinstance(s, dict)], made


def autoround_thinker(source: Path, out: Path, recipe: Any, progress: bool, calibration: str | None) -> dict[str, Any]:
    """In the child: auto-round W4A16 on the thinker-only BF16 checkpoint `source` (hub names). Its MLLM
    calibrator feeds each sample dict to the thinker's forward whole (`model(**sample)`: media inputs included),
    one sample per batch (samples differ in length; auto-round does the same for media calibration, accumulating
    gradients over 8 instead), and the forwards are counted against the samples (quantize/watch.py)."""
    import torch

    from quantbench.make.quantize.autoround import quantize_autoround
    from quantbench.make.quantize.source import source_tokenizer
    from quantbench.make.quantize.watch import CalibrationWatch
    from quantbench.models.checkpoint import load_causal_lm
    from quantbench.models.lineage import canonical_tensor_name

    # loaded before auto_round is imported (it changes transformers' MoE loading), refused unless filled exactly
    model = load_causal_lm(source, dtype=torch.bfloat16, device="cpu",
                           model_class=family_of(read_config(source)).model_class())
    tokenizer = source_tokenizer(source)
    samples, made = calibration_batches(model, tokenizer, source, recipe, calibration, batch=1)
    with CalibrationWatch(model) as watch:
        details = quantize_autoround(source, out, recipe, progress=progress, model=model, tokenizer=tokenizer,
                                     dataset=samples, checkpoint_name=canonical_tensor_name, processor=tokenizer,
                                     batch_size=1, **({"gradient_accumulate_steps": min(8, len(samples))}
                                                      if recipe.iters else {}))  # SignRound's alone
    if recipe.opt_rtn or recipe.iters:  # plain RTN runs no calibration pass
        details["calibration_forwards"] = watch.check(samples, "auto-round")
    return {**details, **({"calibration": made} if made else {})}


def modelopt_thinker(source: Path, out: Path, recipe: Any, progress: bool, calibration: str | None) -> dict[str, Any]:
    """In the child: ModelOpt on the thinker of `source` (any omni layout)."""
    from quantbench.make.quantize.modelopt import quantize_modelopt

    seen: dict[str, Any] = {}
    made: dict[str, Any] = {}

    def batches_for(model: Any, tokenizer: Any) -> list[dict[str, Any]]:
        batches, made["calibration"] = calibration_batches(model, tokenizer, source, recipe, calibration, batch=8)
        return batches

    quantize_modelopt(source, recipe.scheme, out, nsamples=recipe.nsamples, seqlen=recipe.seqlen,
                      experts_only=recipe.experts_only, progress=progress, seen=seen, batches_for=batches_for)
    return {"modelopt_calibration": seen, **({"calibration": made["calibration"]} if made.get("calibration") else {})}


def main() -> None:
    from quantbench.make.quantize.recipe import Recipe

    job = json.loads(sys.argv[1])
    recipe = Recipe(**job["recipe"])
    step = autoround_thinker if recipe.scheme == "int4" else modelopt_thinker
    try:
        details = step(Path(job["source"]), Path(job["out"]), recipe, job["progress"], job.get("calibration"))
    except QuantbenchError as e:  # a message meant for a person: the parent raises it as it is
        Path(job["answer"]).write_text(json.dumps({"error": str(e), "kind": type(e).__name__}))
        raise SystemExit(2) from None
    Path(job["answer"]).write_text(json.dumps(details))


if __name__ == "__main__":
    main()
