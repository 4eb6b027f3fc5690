"""Loading checkpoints strictly, and naming them.

transformers fills any weight it did not find with random values and only *reports* MISSING / UNEXPECTED keys;
a run on such a model would be silently wrong. `load_causal_lm` turns every such report into a LoadError.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantbench.errors import LoadError, is_out_of_memory
from quantbench.models import hub

if TYPE_CHECKING:  # only annotations: the parent checks checkpoints (runner.preflight) without importing torch
    import torch

PROVENANCE_FILE = "quantbench_provenance.json"  # written by `quantbench quantize` next to a variant
SYNTHETIC_FILE = "quantbench_synthetic.json"  # written beside a saved random-weight real-shape model
PLANTED_FILE = "quantbench_planted.json"  # written by `quantbench plant` into a planted regression
FULL_HASH_LIMIT = 2 << 30  # above this, fingerprint (sizes + head and tail of each file) instead of full sha256
_CHUNK = 16 << 20


def fingerprint(path: str | Path) -> str:
    """Content hash of a checkpoint directory: sha256 over every file's name and bytes. For checkpoints over
    2 GiB, over each file's name, size and first/last 16 MiB ("fp:" prefix), so a 60 GB model hashes in seconds."""
    root = Path(path)
    files = sorted(f for f in root.rglob("*") if f.is_file() and not f.name.startswith("."))
    total = sum(f.stat().st_size for f in files)
    full = total <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        size = f.stat().st_size
        h.update(size.to_bytes(8, "little"))
        with open(f, "rb") as fh:
            if full:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
            else:
                h.update(fh.read(_CHUNK))
                if size > 2 * _CHUNK:
                    fh.seek(size - _CHUNK)
                    h.update(fh.read(_CHUNK))
    return ("" if full else "fp:") + h.hexdigest()


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


WEIGHTS_TAG = "-w"


def weights_model_id(model_id: str, weights_hash: str) -> str:
    """`quantbench-fixture-moe-9af210da-w1a2b3c4d`: a trained model's recipe id and the first 8 hex digits of its
    checkpoint's content hash (a variant: its BF16 source's, from its provenance). The same recipe trained by
    another torch or CPU gives other weights, which answer differently: they get another id, so their runs never
    sit in one table. Idempotent: an id that already ends in this hash's tag keeps it."""
    tag = f"{WEIGHTS_TAG}{weights_hash.removeprefix('fp:')[:8]}"
    return model_id if model_id.endswith(tag) else f"{model_id}{tag}"


def model_identity(path: str | Path) -> dict[str, Any]:
    """model_id (shared by every variant of one model), model_hash (this checkpoint), weights kind."""
    root = Path(path)
    prov = read_json(root / PROVENANCE_FILE) or {}
    synth = read_json(root / SYNTHETIC_FILE)
    config = read_json(root / "config.json") or {}
    model_id = prov.get("source_model_id") or (synth or {}).get("model_id") or config.get("quantbench_model_id")
    revision = prov.get("source_revision") or config.get("quantbench_revision")
    if not model_id and (snapshot := hub.snapshot_of(root)):  # a hub cache snapshot: its repo id and commit
        model_id, revision = snapshot
    if not model_id:
        model_id = config.get("_name_or_path") or root.name
    weights = "synthetic" if synth or prov.get("weights") == "synthetic" else "checkpoint"
    if config.get("quantbench_model_id") or prov.get("weights") == "trained":
        weights = "trained"
    model_hash = fingerprint(root)
    if weights == "trained":  # quantbench's own trained models: the id names the weights, not only the recipe
        model_id = weights_model_id(model_id, prov.get("source_model_hash") or model_hash)
    return {
        "model_id": model_id,
        "model_path": str(root.resolve()),
        "model_hash": model_hash,
        "model_revision": revision,
        "weights": weights,
        "source_model_hash": prov.get("source_model_hash"),
    }


SCORER_KEY = "quantbench_scorer"  # config.json's entry naming a checkpoint's own scorer (models/scorer.py)


def weight_files(root: Path) -> set[str]:
    """Names of the scorer's head files at the top of `root` (quantbench's strict model loader leaves them to the
    scorer instead of calling them stray tensors of the model)."""
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return set()
    entry = config.get(SCORER_KEY) if isinstance(config, dict) else None
    files = entry.get("files") if isinstance(entry, dict) else None
    return {Path(f).name for f in files if isinstance(f, str) and "/" not in f} if isinstance(files, list) else set()


def refuse_code_only_architecture(root: Path, config: dict[str, Any], fix: str) -> None:
    """LoadError when config.json names the checkpoint's own code (auto_map) for a model_type transformers does not
    have: there is no built-in class to load instead of that code. `fix`: what the caller offers (the flag that
    runs the code, or that it never runs it)."""
    if not config.get("auto_map"):
        return
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,  # lazy: only for an auto_map (rare)
    )

    if config.get("model_type") not in CONFIG_MAPPING:
        raise LoadError(f"{root / 'config.json'}: model_type {config.get('model_type')!r} is not built into "
                        f"transformers and its auto_map names the checkpoint's own Python code{fix}")


def check_safetensors_only(path: Path) -> None:
    """Refuse a checkpoint without safetensors weights, or with a weights file that is cut short or not
    safetensors (each file's header is read and checked against the file's size: milliseconds, no tensor read)."""
    if not list(path.glob("*.safetensors")):
        pickled = [f.name for f in path.glob("*.bin")] + [f.name for f in path.glob("*.pt")]
        hint = f" (found {', '.join(pickled)}: pickled weights are never loaded)" if pickled else ""
        raise LoadError(f"{path}: no *.safetensors weights{hint}; convert the checkpoint to safetensors")
    for f in sorted(path.glob("*.safetensors")):
        check_safetensors_header(f)
    check_shard_index(path)


def json_file(file: Path, fix: str) -> Any:
    """A checkpoint's JSON file, parsed, or a LoadError naming it and `fix`."""
    try:
        return json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{file}: not valid JSON ({e}); {fix}") from None


# The JSON files transformers reads beside config.json to build a tokenizer (and a processor); one that does not
# parse crashed the run's child with a bare JSONDecodeError naming no file.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json", "chat_template.json", "preprocessor_config.json", "processor_config.json")


def check_tokenizer_json(path: Path) -> None:
    """Refuse a checkpoint whose tokenizer (or processor) JSON files do not parse, naming the file."""
    for name in TOKENIZER_JSON:
        if (path / name).is_file():
            json_file(path / name, "restore it (copy it from the model the checkpoint was made from)")


def load_tokenizer(path: Path, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer.from_pretrained, or a LoadError naming the tokenizer files when they parse but do not make a
    tokenizer (a tokenizer.json of another schema crashed the run's child with a bare KeyError 'added_tokens').
    A refusal to run the checkpoint's own code is passed on as transformers raised it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # tokenizers and transformers raise KeyError, ValueError, TypeError or their own
        if "trust_remote_code" in str(e):
            raise
        files = ", ".join(f for f in TOKENIZER_JSON[:4] if (path / f).is_file()) or "no tokenizer files"
        raise LoadError(f"{path}: its tokenizer cannot be built from its files ({files}): {type(e).__name__}: "
                        f"{e}; copy them from the model the checkpoint was made from") from e


SHARD_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's map of tensor name -> shard file


def check_shard_index(path: Path) -> None:
    """A sharded checkpoint's index names every shard it needs: one that is not there (an interrupted download or
    copy) is refused naming it, before transformers' "No such file or directory" inside the run's child."""
    index = path / SHARD_INDEX
    if not index.is_file():
        return
    fix = "copy or download the checkpoint again"
    data = json_file(index, fix)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
        raise LoadError(f"{index}: has no weight_map of tensor names to shard files; {fix}")
    shards = sorted(set(weight_map.values()))
    missing = [f for f in shards if not (path / f).is_file()]
    if missing:
        shown = ", ".join(missing[:4]) + (f" … (+{len(missing) - 4} more)" if len(missing) > 4 else "")
        raise LoadError(f"{path}: {len(missing)} of the {len(shards)} shards its {SHARD_INDEX} names "
                        f"{'is' if len(missing) == 1 else 'are'} not there ({shown}); a partial checkpoint never "
                        f"runs: {fix}")
    # transformers reads the shards the index names and nothing else, while quantbench's own readers (the strict
    # nvfp4 / fp8 loader, the experts check, the unchanged check of quantize) read every *.safetensors: a stray
    # file (a shard of another download, a model.safetensors beside the index) loaded with "tensors the model has
    # no place for" or failed quantizing after calibration, blaming the quantizer.
    stray = sorted(f.name for f in path.glob("*.safetensors") if f.name not in set(shards) | weight_files(path))
    if stray:
        raise LoadError(f"{path}: {', '.join(stray)} {'is' if len(stray) == 1 else 'are'} not named in its "
                        f"{SHARD_INDEX} (left over from another copy or download?); remove what is not the "
                        "checkpoint's, so that every reader reads the same tensors")
    # transformers reads every tensor of every shard, a later shard's copy silently replacing an earlier one, and
    # never asks the index which is meant: a tensor in two shards ran with whichever came last
    found: dict[str, str] = {}
    for shard in shards:
        for key in safetensors_header(path / shard)[1]:
            if key in found:
                raise LoadError(f"{path}: tensor {key} is in both {found[key]} and {shard} (its {SHARD_INDEX} names "
                                f"{weight_map.get(key, 'neither')}); the shards are of different copies: {fix}")
            found[key] = shard


def safetensors_header(file: Path) -> tuple[int, dict[str, Any]]:
    """A safetensors file's tensors by name (dtype, shape, data_offsets), from its header alone, and the offset of
    its data in the file (data_offsets count from there). The one reader of the format's header; a file whose
    header may be damaged goes through check_safetensors_header first."""
    with open(file, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def check_safetensors_header(file: Path) -> None:
    """A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte range, then the
    bytes: a file shorter than its header says was cut short (an interrupted copy or download)."""
    fix = "copy or download it again"
    size = file.stat().st_size
    with open(file, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > size - 8:
            raise LoadError(f"{file}: not a complete safetensors file ({size:,} bytes, too short for its "
                            f"header); {fix}")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise LoadError(f"{file}: its safetensors header is not valid JSON ({e}); {fix}") from None
    if not isinstance(header, dict):
        raise LoadError(f"{file}: its safetensors header is not a JSON object; {fix}")
    ends = [t["data_offsets"][1] for k, t in header.items()
            if k != "__metadata__" and isinstance(t, dict) and len(t.get("data_offsets") or ()) == 2]
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise LoadError(f"{file}: truncated: {size:,} bytes, its header describes {need:,}; {fix}")


def unread_tensors(root: Path, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """The tensors under `prefixes` that a load leaves unread, from the safetensors headers alone (no tensor
    read): {"components", "tensors", "bytes", "total_bytes"}."""
    tensors = nbytes = total = 0
    for f in sorted(root.glob("*.safetensors")):
        for key, t in safetensors_header(f)[1].items():
            size = t["data_offsets"][1] - t["data_offsets"][0]
            total += size
            if key.startswith(prefixes):
                tensors += 1
                nbytes += size
    return {"components": [p.rstrip(".") for p in prefixes], "tensors": tensors, "bytes": nbytes,
            "total_bytes": total}


def planted_info(model_path: str | Path | None) -> dict[str, Any] | None:
    """`quantbench_planted.json` of a checkpoint directory, or None (not planted, or not a local directory)."""
    if not model_path:
        return None
    file = Path(model_path) / PLANTED_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def read_config(root: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory, or a LoadError that names the file and the fix."""
    file = root / "config.json"
    if not file.is_file():
        raise LoadError(f"{root}: no config.json; --model must be a checkpoint directory (config.json + *.safetensors)")
    try:
        config = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{file}: not valid JSON ({e}); fix or restore the file") from None
    if not isinstance(config, dict):
        raise LoadError(f"{file}: must be a JSON object, got {type(config).__name__}; fix or restore the file")
    return config


def load_causal_lm(path: str | Path, *, dtype: torch.dtype, device: str, trust_remote_code: bool = False,
                   model_class: Any = None, **kwargs: Any):
    """AutoModelForCausalLM.from_pretrained (or `model_class`'s, for a family with no causal-LM class), refusing
    any checkpoint that does not fill the model exactly."""
    from transformers import AutoModelForCausalLM

    root = Path(path)
    quant = read_config(root).get("quantization_config") or {}
    check_safetensors_only(root)
    if isinstance(quant, dict) and quant.get("quant_method") == "gptq":
        kwargs = {**_gptq_through_autoround(root, trust_remote_code), **kwargs}
    with warnings.catch_warnings():
        # the GPTQ path hands over an AutoRoundConfig by design; transformers warns that the file's config wins
        warnings.filterwarnings("ignore", message="You passed `quantization_config`")
        try:
            model, info = (model_class or AutoModelForCausalLM).from_pretrained(
                root,
                dtype=dtype,
                device_map=device,
                use_safetensors=True,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                # Let transformers report shape mismatches (named, below) instead of raising without the names.
                ignore_mismatched_sizes=True,
                **kwargs,
            )
        except (ValueError, RuntimeError, OSError) as e:
            if is_out_of_memory(e):  # the machine, not the checkpoint: labelled oom by the child
                raise
            if "trust_remote_code" in str(e):
                raise LoadError(f"{root}: the checkpoint needs its own Python code; pass --trust-remote-code to allow it") from e
            # transformers raises on tensor shapes that differ from the config (for MoE checkpoints: an expert short).
            raise LoadError(f"{root}: the checkpoint does not match the model's config ({e})") from e
    problems = []
    if isinstance(quant, dict) and info.get("unexpected_keys"):
        info["unexpected_keys"] = unread_trivial_g_idx(root, info["unexpected_keys"], quant.get("group_size"))
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs", "conversion_errors"):
        items = sorted((info.get(kind) or []), key=str)  # sorted: the same checkpoint gives the same message
        if items:
            shown = ", ".join(str(i) for i in items[:6])
            if len(items) > 6:  # which tensors, by their last name, so that a long list still says what is off
                names = Counter(str(i[0] if isinstance(i, tuple) else i).rsplit(".", 1)[-1] for i in items)
                shown += f" … (+{len(items) - 6} more; all {len(items)} by name: " + ", ".join(
                    f"{name} {n}" for name, n in sorted(names.items())) + ")"
            problems.append(f"{kind.replace('_', ' ')}: {shown}")
    if problems:
        raise LoadError(
            f"{root}: the checkpoint does not match the model exactly ({'; '.join(problems)}). "
            "transformers would fill the gaps with random weights, so the run is refused"
        )
    return model.eval()


def _gptq_through_autoround(root: Path, trust_remote_code: bool) -> dict[str, Any]:
    """from_pretrained's arguments for a GPTQ (v1) checkpoint, auto-round's own `format="auto_gptq"` export among
    them: transformers runs `quant_method: gptq` through gptqmodel (not a dependency), while auto-round reads the
    same packing (auto_gptq's) with its own kernels when asked with an AutoRoundConfig. GPTQModel's `meta` (the
    quantizer's name and version) makes transformers refuse that conversion; it says nothing about the tensors,
    so it is dropped from the config handed over (the file is untouched)."""
    from transformers import AutoConfig, AutoRoundConfig

    config = AutoConfig.from_pretrained(root, trust_remote_code=trust_remote_code)
    config.quantization_config = {k: v for k, v in dict(config.quantization_config).items() if k != "meta"}
    return {"config": config, "quantization_config": AutoRoundConfig()}


def unread_trivial_g_idx(root: Path, unexpected: list[Any], group_size: Any) -> list[Any]:
    """`unexpected` without the GPTQ `g_idx` tensors that hold only the default group order (input i in group
    i // group_size, written by every GPTQ export without act-order): auto-round's QuantLinears have no place for
    them and lose nothing. An act-order g_idx stays unexpected, so the load is refused rather than run with its
    inputs in the wrong groups."""
    import torch
    from safetensors import safe_open

    g_idx = [k for k in unexpected if isinstance(k, str) and k.endswith(".g_idx")]
    if not g_idx or not isinstance(group_size, int) or group_size <= 0:
        return unexpected
    trivial = set()
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as handle:
            for key in set(g_idx) & set(handle.keys()):
                t = handle.get_tensor(key)
                if t.dim() == 1 and torch.equal(t.long(), torch.arange(t.numel()) // group_size):
                    trivial.add(key)
    return [k for k in unexpected if k not in trivial]


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of every distinct tensor storage a module holds (parameters and buffers), on any device."""
    seen: set[int] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = t.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def experts_tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of the MoE expert weights (parameters and buffers under any `experts` submodule)."""
    total = 0
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if ".experts." in f".{name}":
            total += t.numel() * t.element_size()
    return total
