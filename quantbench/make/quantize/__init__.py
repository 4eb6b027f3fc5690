"""`quantbench quantize`: make a quantized variant of a BF16 checkpoint, with a provenance file beside it.

    quantize(source_dir, "int4", out_dir, iters=0, nsamples=128, group_size=128, experts_only=True) -> Path

int4 wraps AutoRound (quantbench.make.quantize.autoround); nvfp4 and fp8 wrap ModelOpt (quantbench.make.quantize.modelopt,
called as `quantize_modelopt(source_dir, scheme, out_dir, texts=..., nsamples=..., seqlen=..., experts_only=...,
progress=...)`). Both calibrate on decision records from the suite generator's *train* split, rendered exactly
as the runner renders them (prompt + answer) — never a hub dataset — or, with `calibration=FILE.jsonl`, on the
user's own records (quantbench.models.calibration; the recipe then carries the file's hash, and the provenance
its path, sha256, the records used and how many carry image / audio / video). `out_dir` ends up a normal checkpoint
directory (config.json + *.safetensors + tokenizer) with `quantbench_provenance.json`: the source model's hash,
the recipe, library versions and the time taken.

A checkpoint of a family that reads media (a Qwen3-Omni-MoE one) takes its own route
(quantbench.make.quantize.multimodal: the thinker's experts only, a thinker-only variant, each library in a child
process). After every experts-only quantization of a checkpoint, every non-expert tensor of the variant is checked
byte-identical to the source's and the check is recorded (quantbench.make.quantize.unchanged); a variant that fails
it is removed.

`default_variant(scheme)` is the embedded default model's variant (`default_variant(scheme, "omni")`: the omni
default model's), made once and cached under `$QUANTBENCH_CACHE` (default ~/.cache/quantbench) in
`variants/<source-hash>-<recipe-hash>/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.make.quantize.recipe import SCHEMES, Recipe, library_versions
from quantbench.make.quantize.source import check_source, source_tokenizer
from quantbench.models import hub, scorer
from quantbench.models.calibration import CalibrationFile, calibration_texts, file_samples, load_calibration
from quantbench.models.checkpoint import PROVENANCE_FILE, fingerprint, model_identity, read_config
from quantbench.paths import cache_dir, remove_dead_folders
from quantbench.term import libraries_to, load_note, stderr_console

__all__ = ["SCHEMES", "Recipe", "cached_variant", "default_model_dir", "default_variant", "library_log",
           "library_versions", "quantize", "write_provenance"]


# -- the verb ---------------------------------------------------------------------------------------------------
def quantize(
    source_dir: str | Path | None,
    scheme: str,
    out_dir: str | Path,
    *,
    iters: int = 0,
    nsamples: int = 128,
    seqlen: int = 512,
    group_size: int = 128,
    experts_only: bool = True,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    shape: str | None = None,
    layers: int | None = None,
    weights_seed: int = 0,
    opt_rtn: bool = True,
    log: str | Path | None = None,
    calibration: str | Path | None = None,
) -> Path:
    """Quantize the BF16 checkpoint `source_dir` with `scheme` into `out_dir`; returns the checkpoint directory.
    What `quantbench quantize --model --scheme --iters --nsamples --group-size --experts-only/--all --out` does.

    With `shape` instead of `source_dir` (int4): the synthetic real-shape model of `quantbench run --shape` (the
    same seeded weights, `layers` and `weights_seed`: built on the GPU when there is one, as the runs build it) is
    quantized from memory, so no BF16 checkpoint is written first (the 30B one is 61 GB).

    With `calibration` (a JSONL file of decision records, suite lines) calibration reads those records instead
    of the built-in train split (quantbench.models.calibration.file_samples); records with media reach a
    Qwen3-Omni thinker's towers, and a text-only model refuses them naming the record and field.

    What the libraries print (auto-round's and ModelOpt's logging, transformers' bars, warnings) goes to `log`
    (default: OUT.quantize.log beside the checkpoint); the terminal gets one line per step and the progress bar."""
    cal = load_calibration(calibration) if calibration is not None else None
    recipe = Recipe(scheme, iters, nsamples, seqlen, group_size, experts_only, seed, opt_rtn,
                    cal.hash if cal is not None else None)
    if (source_dir is None) == (shape is None):
        raise ConfigError("give --model (a BF16 checkpoint directory) or --shape (a synthetic model built in memory)")
    if shape is not None and scheme != "int4":
        raise ConfigError(f"--shape with --scheme {scheme}: only int4 is quantized from memory here; a synthetic "
                          f"{scheme} variant is made in memory by `quantbench run --backend {scheme} --shape {shape}`")
    out = Path(out_dir)
    source = None if source_dir is None else Path(source_dir)
    if source_dir is not None and hub.is_hub_id(str(source_dir)):
        source = hub.resolve(str(source_dir)).path  # its snapshot in the Hugging Face cache (the origin records it)
    if source is not None and not (source / "config.json").is_file():
        raise ConfigError(f"--model {source}: no config.json; give a BF16 checkpoint directory")
    if source is not None:
        check_source(source, out)  # before --overwrite removes anything
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: a file, not a directory; give a new directory for the variant")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"--out {out} is not empty; give a new directory (or remove it)")
    log = Path(log) if log is not None else library_log(out)
    _check_writable(out, log)
    remove_dead_folders(out.parent, f".{out.name}.partial-")  # a killed quantize's staging folders
    say = stderr_console()
    library = "auto-round" if scheme == "int4" else "nvidia-modelopt"
    method = "calibrated" if scheme != "int4" else f"SignRound, {iters} iterations" if iters else \
        "optimized RTN" if opt_rtn else "plain RTN"
    from quantbench.models.families import family_of, supports_multimodal

    # a family that reads media takes its own route (quantize/multimodal.py: the part a decision reads, experts only)
    multimodal = source is not None and supports_multimodal(family_of(read_config(source)))
    if cal is not None and not multimodal:
        cal.refuse_media(frozenset())  # a text-only model: before anything loads
    what = f"{nsamples} samples of {seqlen} tokens" + (f" from {cal.path}" if cal is not None else "")
    busy = load_note()
    say.print(f"{scheme}: quantizing {source or shape} with {library} {library_versions().get(library) or ''} "
              f"({method}, {what}); the libraries' own log: {log}" + (f"; {busy}" if busy else ""), highlight=False)
    started = time.perf_counter()
    # A variant is whole or absent: it is made in a folder of this process's beside --out and moved into place
    # only once its checks and provenance are written. Before, it was made in --out itself: a SIGTERM (`timeout`, a
    # scheduler), a closed terminal or a SIGKILL left a checkpoint without its provenance or its checks that `run`
    # loaded as the variant, and --overwrite removed the old variant before the new one was made.
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        _make(source, shape, scheme, staging, recipe, cal, log, say, started, progress=progress, layers=layers,
              weights_seed=weights_seed, multimodal=multimodal, experts_only=experts_only, final=out)
        from quantbench.make.fixture import replace_with

        replace_with(out, staging)
        return out
    except BaseException as e:
        # an interrupted or failed quantization (Ctrl-C, a full disk, a library's error)
        shutil.rmtree(staging, ignore_errors=True)
        say.print(f"{scheme}: quantizing failed; the libraries' own log: {log}; what it had written of the variant "
                  "was removed", highlight=False)
        if isinstance(e, QuantbenchError) and e.args and isinstance(e.args[0], str):
            # the checks name the folder they read: the user's --out, not this process's staging folder
            e.args = (e.args[0].replace(str(staging), str(out)), *e.args[1:])
        raise


def _check_writable(out: Path, log: Path) -> None:
    """ConfigError naming --out when its folder or the libraries' log beside it cannot be written (a read-only
    disk, no permission), before minutes of calibration: before, an OSError's traceback."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a"):
            pass
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write there ({e.strerror}: {e.filename}); give a directory on a "
                          "writable disk") from None


def _make(source: Path | None, shape: str | None, scheme: str, out: Path, recipe: Recipe, cal: CalibrationFile | None,
          log: Path, say: Any, started: float, *, progress: bool, layers: int | None, weights_seed: int,
          multimodal: bool, experts_only: bool, final: Path) -> Path:
    """quantize()'s work once its arguments are checked: the library's run into `out`, then the checks and the
    provenance (which names `final`, where quantize() moves `out` once it is whole)."""
    nsamples, seqlen, seed = recipe.nsamples, recipe.seqlen, recipe.seed
    calibrated: dict[str, Any] = {}  # a calibration file's provenance, for a text model (a multimodal child reports its own)
    with libraries_to(log):
        if shape is not None:
            model, tokenizer, origin = _synthetic_source(shape, layers, weights_seed)
            from quantbench.make.quantize.autoround import quantize_autoround

            texts = _file_texts(cal, tokenizer, recipe, calibrated)
            details = quantize_autoround(None, out, recipe, progress=progress, model=model, tokenizer=tokenizer,
                                         dataset=texts)
        else:
            ident = model_identity(source)
            origin = {**ident, "path": str(source.resolve()), "hash": ident["model_hash"]}
            if multimodal:
                from quantbench.make.quantize.multimodal import quantize_multimodal

                details = quantize_multimodal(source, out, recipe, log, progress=progress,
                                              calibration=cal.path if cal is not None else None)
            elif scheme == "int4":
                from quantbench.make.quantize.autoround import quantize_autoround

                texts = _file_texts(cal, source_tokenizer(source), recipe, calibrated)
                file = {"dataset": texts} if texts is not None else {}  # else its default, the train split
                details = quantize_autoround(source, out, recipe, progress=progress, **file)
            else:
                from quantbench.make.quantize.modelopt import quantize_modelopt

                tokenizer = source_tokenizer(source)
                texts = _file_texts(cal, tokenizer, recipe, calibrated) or calibration_texts(
                    tokenizer, nsamples, seqlen, seed)
                made = quantize_modelopt(source, scheme, out, texts=texts, nsamples=len(texts), seqlen=seqlen,
                                         experts_only=experts_only, progress=progress)
                details = {"checkpoint": str(final)} if made is not None else {}
        details.update(calibrated)
    restored = {}
    if source is not None and scheme == "int4":
        from quantbench.make.quantize.unchanged import restore_source_dtypes

        restored = restore_source_dtypes(source, out)
    details["tokenizer"] = _tokenizer_as_source(source, out)
    if source is not None and experts_only:
        details["unchanged"] = _check_unchanged(source, out, scheme, say)
        if restored:
            details["unchanged"]["restored"] = restored
    seconds = time.perf_counter() - started
    details = {**details, **scorer.carry_over(source, out)}  # a checkpoint's own scorer, byte-identical (models/scorer.py)
    write_provenance(out, origin, recipe, seconds, details)
    say.print(f"{scheme}: quantized in {seconds:.1f} s", highlight=False)
    return out


# A quantizer never changes tokenization, but the libraries save the tokenizer they calibrated with: a fast
# tokenizer called with truncation keeps it in its state, so the variant's tokenizer.json came out with
# `truncation: max_length = seqlen` (256 in the demo's variants, 64 in a short calibration), which the source lacks.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _tokenizer_as_source(source: Path | None, out: Path) -> str:
    """Put the source's tokenizer files back over the ones the library saved (a synthetic source, none on disk:
    the saved tokenizer.json loses the truncation and padding calibration left in it). Says what it did."""
    copied = [name for name in TOKENIZER_FILES if source is not None and (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, out / name)
    if copied:
        return f"copied from the source: {', '.join(copied)}"
    saved = out / "tokenizer.json"
    if not saved.is_file():
        return "none saved"
    data = json.loads(saved.read_text())
    cleared = [key for key in ("truncation", "padding") if data.get(key) is not None]
    for key in cleared:
        data[key] = None
    saved.write_text(json.dumps(data, ensure_ascii=False, indent=2))
    return f"tokenizer.json as saved, {' and '.join(cleared)} cleared" if cleared else "tokenizer.json as saved"


def _file_texts(cal: CalibrationFile | None, tokenizer: Any, recipe: Recipe,
                provenance: dict[str, Any]) -> list[str] | None:
    """A text model's calibration texts from the calibration file (None without one: the library's default, the
    train split); what they are goes into `provenance["calibration"]`."""
    if cal is None:
        return None
    texts, provenance["calibration"] = file_samples(cal, tokenizer, recipe.nsamples, recipe.seqlen)
    return [t for t in texts if isinstance(t, str)]  # file_samples refuses media records for a text model


def _check_unchanged(source: Path, out: Path, scheme: str, say: Any) -> dict[str, Any]:
    """quantize/unchanged.py's check of every non-expert tensor against the source; a variant that fails it is
    removed (it is not the experts-only variant it claims to be) and the error names the first differing tensor."""
    from quantbench.make.quantize.unchanged import ChangedTensor, check_unchanged

    started = time.perf_counter()
    try:
        checked = check_unchanged(source, out)
    except ChangedTensor as e:
        shutil.rmtree(out, ignore_errors=True)
        raise ChangedTensor(f"{e} ({out} was removed)") from None
    checked["seconds"] = round(time.perf_counter() - started, 3)
    say.print(f"{scheme}: {checked['tensors']} non-expert tensors ({checked['bytes']:,} bytes) byte-identical to the "
              "source", highlight=False)
    return checked


def library_log(out: str | Path) -> Path:
    """Where the libraries' own output of quantizing into `out` goes: beside it, outside the checkpoint (whose
    fingerprint would otherwise change with every log line)."""
    out = Path(out)
    return out.with_name(f"{out.name}.quantize.log")


def _synthetic_source(shape: str, layers: int | None, weights_seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The synthetic model `quantbench run --shape` builds (on the GPU when there is one: the seeded weights are
    that device's generator's), in host memory, and its identity: no files, so its hash is the recipe's."""
    import torch

    from quantbench.models.families import shape_family, supports_multimodal, synthetic_shapes
    from quantbench.models.synthetic import build_synthetic, synthetic_id

    shapes = synthetic_shapes()
    if shape not in shapes:
        raise ConfigError(f"--shape {shape!r}: use one of {', '.join(sorted(shapes))}")
    if supports_multimodal(shape_family(shape)):  # the multimodal route wants a checkpoint with a processor
        raise ConfigError(f"--shape {shape}: a synthetic model that reads media is not quantized to a checkpoint; "
                          f"`quantbench run --shape {shape} --backend int4|nvfp4|fp8` quantizes it in memory, "
                          "layer by layer")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = build_synthetic(shape, layers=layers, device=device, seed=weights_seed)
    if device != "cpu":  # AutoRound takes the model from host memory, as from a checkpoint, and moves each block
        model.to("cpu")
        torch.cuda.empty_cache()
    model_id = synthetic_id(shape, layers, weights_seed)
    made_by = {"shape": shape, "layers": model.config.num_hidden_layers, "seed": weights_seed, "device": device,
               "dims": shapes[shape]}
    digest = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()
    return model, tokenizer, {"path": f"synthetic:{model_id} (built in memory on {device})", "hash": f"synthetic:{digest}",
                              "model_id": model_id, "model_revision": None, "weights": "synthetic"}


def write_provenance(out: Path, origin: dict[str, Any], recipe: Recipe, seconds: float,
                     details: dict[str, Any] | None = None) -> Path:
    """`origin`: the source's path (or what built it), hash, model_id, model_revision and weights kind."""
    prov = {
        "scheme": recipe.scheme,
        "source_model_path": origin["path"],
        "source_model_hash": origin["hash"],
        "source_model_id": origin["model_id"],
        "source_revision": origin.get("model_revision"),
        "weights": origin["weights"],
        "recipe": recipe.to_dict(),
        "recipe_hash": recipe.hash,
        "calibration": "quantbench.protocol.suitegen train split, rendered by quantbench.protocol.prompt (prompt + gold answer)",
        "libraries": library_versions(),
        "seconds": round(seconds, 3),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **(details or {}),
    }
    path = out / PROVENANCE_FILE
    path.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return path


# -- the cache of the embedded default model's variants ---------------------------------------------------------


def variant_dir(source_dir: str | Path, recipe: Recipe) -> Path:
    return cache_dir() / "variants" / f"{fingerprint(source_dir)[:16]}-{recipe.hash[:16]}"


def cached_variant(source_dir: str | Path, scheme: str, **opts: Any) -> Path:
    """The variant of `source_dir` for this recipe, quantized on first use. The quantization runs in a child
    process: once auto_round is imported, transformers mis-loads plain MoE checkpoints in that process."""
    recipe = Recipe(scheme, **opts)
    target = variant_dir(source_dir, recipe)
    if (target / PROVENANCE_FILE).is_file():
        return target
    from quantbench.make import fixture

    # Two processes wanting the same variant (two runs, two test workers) quantize it once: the second waits.
    with fixture._locked(target.parent / f".{target.name}.lock", f"quantizing {target.name} to {scheme}"):
        if (target / PROVENANCE_FILE).is_file():
            return target
        return _quantize_into(target, source_dir, scheme, recipe)


# Ctrl-C reaches this child too (it shares the terminal's process group): it exits quietly, as `quantbench` does,
# instead of printing a KeyboardInterrupt traceback from deep in transformers under the run's own message.
QUANTIZE_CHILD = """
import json, sys
from quantbench.make.quantize import quantize
try:
    quantize(**json.loads(sys.argv[1]))
except KeyboardInterrupt:
    sys.exit(130)
"""


def _quantize_into(target: Path, source_dir: str | Path, scheme: str, recipe: Recipe) -> Path:
    staging = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    remove_dead_folders(target.parent, f"{target.name}.tmp-")  # a parent killed while quantizing (this lock is ours)
    shutil.rmtree(staging, ignore_errors=True)
    log = library_log(target)  # beside the variant's final place: the staging folder's name is never shown
    log.unlink(missing_ok=True)
    args = {"source_dir": str(source_dir), "out_dir": str(staging), "log": str(log), **recipe.to_dict()}
    try:
        # subprocess.run kills the child when this process is stopped (Ctrl-C, runner's stop signal)
        done = subprocess.run([sys.executable, "-c", QUANTIZE_CHILD, json.dumps(args)], stdout=sys.stderr, check=False)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if done.returncode != 0 or not (staging / PROVENANCE_FILE).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise QuantbenchError(f"quantizing {source_dir} to {scheme} failed (exit {done.returncode}); see the lines "
                              f"above and the libraries' own log, {log}")
    try:
        staging.rename(target)  # atomic: a reader never sees half a variant
    except OSError:  # another host on a shared cache (where the lock may not hold) finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target


# The embedded model's default variants: RTN, whose weights do not depend on the calibration texts (AutoRound only
# runs them through the model to cache block inputs), so a few short samples keep the first run quick.
DEFAULT_VARIANT_RECIPE = {"iters": 0, "nsamples": 16, "seqlen": 256}


def default_variant(scheme: str, family: str = "text", **opts: Any) -> Path:
    """The embedded default model's `scheme` variant (RTN unless `opts` say otherwise), cached; `family` "omni":
    the omni default model's (quantbench.make.omni_fixture; its thinker's experts, quantize/multimodal.py)."""
    return cached_variant(default_model_dir(family), scheme, **{**DEFAULT_VARIANT_RECIPE, **opts})


FAMILIES = ("text", "omni")  # the embedded default models: `--family`


def default_model_dir(family: str = "text") -> Path:
    """The embedded default model of `family` (built and cached on first use)."""
    if family == "omni":
        from quantbench.make.omni_fixture import omni_default_model_dir

        return omni_default_model_dir()
    if family != "text":
        raise ConfigError(f"--family {family!r}: use one of {', '.join(FAMILIES)}")
    from quantbench.make.fixture import default_model_dir as text_model_dir

    return text_model_dir()
