"""Which BF16 model a variant was made from, and how that is known: the evidence a run records so the report can
pair a variant made elsewhere (an INT4 published by someone else, an NVFP4 made with ModelOpt directly) with the
BF16 run of its base, not only the variants `quantbench quantize` made.

A run records (`runs` columns, schema version 4):
  base_model           the base's model id (what a BF16 run of it records as model_id), or the id a model card
                       names (a Hugging Face id such as Qwen/Qwen3-30B-A3B);
  base_model_how       how that is known: `quantbench` (the provenance `quantbench quantize` writes), `given`
                       (`run --base-model DIR|ID`) or `model_card` (`base_model` in the checkpoint's README.md
                       front matter, as on the Hugging Face hub);
  shared_tensors_hash  sha256 over the tensors quantization leaves alone: the token embeddings, every norm and the
                       MoE router (`mlp.gate`). auto-round and ModelOpt both copy them byte for byte (checked on
                       checkpoints each made directly), so a variant and its base have the same hash. Attention
                       and lm_head are not part of it: auto-round's default quantizes attention, and some
                       quantizers quantize lm_head.

`pair_runs` (used by the report and by `compare`) pairs a run whose own model has no BF16 run with the BF16 run
of its base, in that order of evidence: the base named on the run, else identical shared tensors.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from quantbench.errors import ConfigError
from quantbench.models import hub
from quantbench.models.checkpoint import safetensors_header

HOWS = ("quantbench", "given", "model_card")  # recorded on the run; `tensors` is found at report time
SHARED_TENSOR = re.compile(r"(^|\.)embed_tokens\.weight$|norm\.weight$|(^|\.)mlp\.gate\.weight$")
_CHUNK = 16 << 20


def base_model_id(path: Path) -> str:
    """The model id a BF16 run of the checkpoint at `path` records (quantbench.models.checkpoint.model_identity's rule;
    only quantbench's own trained models are hashed, for the weights tag of their id)."""
    def read(name: str) -> dict[str, Any]:
        f = path / name
        return json.loads(f.read_text()) if f.is_file() else {}

    prov, synth, config = read("quantbench_provenance.json"), read("quantbench_synthetic.json"), read("config.json")
    snapshot = hub.snapshot_of(path)  # a hub cache snapshot: its repo id, as model_identity records it
    model_id = (prov.get("source_model_id") or synth.get("model_id") or config.get("quantbench_model_id")
                or (snapshot[0] if snapshot else None) or config.get("_name_or_path") or path.resolve().name)
    if config.get("quantbench_model_id") or prov.get("weights") == "trained":  # tagged with its weights' hash
        from quantbench.models.checkpoint import fingerprint, weights_model_id

        model_id = weights_model_id(model_id, prov.get("source_model_hash") or fingerprint(path))
    return model_id


def resolve_given_base(base: str) -> str:
    """`run --base-model DIR|ID`: a checkpoint directory becomes the model id its BF16 runs record; anything else
    is taken as a model id (a Hugging Face id, or the id `quantbench runs` shows). Checked in the parent, before a
    child is spawned."""
    text = base.strip()
    if not text:
        raise ConfigError("--base-model is empty: give the BF16 checkpoint's directory or its model id")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"--base-model {text}: the directory has no config.json; give the BF16 checkpoint's "
                              "directory (config.json + *.safetensors) or its model id")
        return base_model_id(path)
    if path.exists():
        raise ConfigError(f"--base-model {text}: a file, not a checkpoint directory; give the BF16 checkpoint's "
                          "directory or its model id")
    return text


def model_card_base(path: Path) -> str | None:
    """`base_model` from the YAML front matter of the checkpoint's README.md (the Hugging Face model card), or
    None. A list (a merge of several bases) gives its first entry."""
    card = path / "README.md"
    if not card.is_file():
        return None
    text = card.read_text(errors="replace")
    match = re.match(r"\A---\s*\n(.*?)\n---\s*(\n|\Z)", text, re.S)
    if not match:
        return None
    import yaml

    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None  # a card that does not parse is no evidence, not a failed run
    base = meta.get("base_model") if isinstance(meta, dict) else None
    if isinstance(base, list):
        base = base[0] if base else None
    text = str(base).strip() if base else ""
    return text or None


def canonical_tensor_name(name: str) -> str | None:
    """One name per tensor whichever layout wrote it, so that a variant pairs with its base: Qwen3-Omni's
    ModelOpt export uses module names (`model.language_model.…`, `model.visual.…`) where transformers and
    auto-round write hub names (`model.…`, `visual.…`), and a full checkpoint puts the thinker under `thinker.`.
    None for the talker and code2wav of a full checkpoint, which no decision reads."""
    if name.startswith(("talker.", "code2wav.")):
        return None
    name = name.removeprefix("thinker.")
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    if name.startswith(("model.visual.", "model.audio_tower.")):
        return name[len("model."):]
    return name


def shared_tensors_hash(path: Path) -> str | None:
    """sha256 over the name, dtype, shape and bytes of every tensor quantization leaves alone (see the module
    doc), read straight from the safetensors files (nothing is unpickled); a float32 tensor that holds bfloat16
    values exactly is hashed as bfloat16 (_bf16_exact). None when the checkpoint has no such tensor or its files
    cannot be read."""
    try:
        entries = []
        for file in sorted(path.glob("*.safetensors")):
            start, header = safetensors_header(file)
            named = ((canonical_tensor_name(name), meta) for name, meta in header.items())
            entries += [(name, file, start, meta) for name, meta in named if name and SHARED_TENSOR.search(name)]
        if not entries:
            return None
        h = hashlib.sha256()
        for name, file, start, meta in sorted(entries, key=lambda e: e[0]):
            begin, end = meta["data_offsets"]
            where = (file, start + begin, end - begin)
            narrowed = meta["dtype"] == "F32" and all(_bf16_exact(c) for c in _chunks(*where))
            h.update(f"{name}|{'BF16' if narrowed else meta['dtype']}|{meta['shape']}|".encode())
            for chunk in _chunks(*where):
                h.update(_bf16_bytes(chunk) if narrowed else chunk)
        return h.hexdigest()
    except (OSError, ValueError, KeyError, struct.error, _Truncated):
        return None


class _Truncated(Exception):
    """A safetensors file shorter than its header says: no evidence."""


def _chunks(file: Path, offset: int, size: int) -> Iterator[bytes]:
    with open(file, "rb") as fh:
        fh.seek(offset)
        while size > 0:
            chunk = fh.read(min(_CHUNK, size))
            if not chunk:
                raise _Truncated(file)
            size -= len(chunk)
            yield chunk


# auto-round writes the tensors it leaves alone as float32 on a CPU without bf16 instructions (seen 2026-12-02 on
# a VM without AVX512-BF16; with them it keeps bf16): the same values, widened. A float32 tensor whose every value
# is a bfloat16 (low 16 bits zero) is hashed as that bfloat16 tensor, so the widening does not hide a shared base.
# Hashes of bfloat16 checkpoints are unchanged (_CHUNK is a multiple of 4: a value never spans two chunks).
def _bf16_exact(chunk: bytes) -> bool:
    return not (np.frombuffer(chunk, dtype="<u4") & 0xFFFF).any()


def _bf16_bytes(chunk: bytes) -> bytes:
    return (np.frombuffer(chunk, dtype="<u4") >> 16).astype("<u2").tobytes()


def evidence(model_path: str | None, given_base: str | None) -> dict[str, Any]:
    """The run columns that say what the run's base is: `given_base` (already resolved by resolve_given_base)
    first, then the provenance of `quantbench quantize`, then the model card; and the shared tensors' hash."""
    out: dict[str, Any] = {"base_model": None, "base_model_how": None, "shared_tensors_hash": None}
    root = Path(model_path) if model_path else None
    local = root is not None and root.is_dir()
    if given_base:
        out.update(base_model=given_base, base_model_how="given")
    elif local and (root / "quantbench_provenance.json").is_file():
        prov = json.loads((root / "quantbench_provenance.json").read_text())
        if prov.get("source_model_id"):
            out.update(base_model=prov["source_model_id"], base_model_how="quantbench")
    if out["base_model"] is None and local:
        card = model_card_base(root)
        if card:
            out.update(base_model=card, base_model_how="model_card")
    if local:
        out["shared_tensors_hash"] = shared_tensors_hash(root)
    return out


# -- pairing at report time ------------------------------------------------------------------------------------
class StoredRunLike(Protocol):
    """What pairing reads of a stored run (quantbench.store.records.StoredRun, which this layer cannot import)."""

    run_id: str
    status: str
    backend: str
    role: str | None
    weights: str | None
    model_id: str | None
    model_path: str | None
    base_model: str | None
    base_model_how: str | None
    shared_tensors_hash: str | None
    created_at: Any


Run = TypeVar("Run", bound=StoredRunLike)


def _name(text: str) -> str:
    """The last component of a model id or path, lower case: `Qwen/Qwen3-30B-A3B` and a directory named
    `Qwen3-30B-A3B` name the same model."""
    return text.rstrip("/").rsplit("/", 1)[-1].strip().lower()


def names_base(base: str, bf16_run: StoredRunLike) -> bool:
    """Whether `base` (a run's base_model) names the model of `bf16_run`: its model id, or its checkpoint's
    directory, in full or by the last component."""
    names = {str(bf16_run.model_id or "")}
    if bf16_run.model_path:
        names.add(str(bf16_run.model_path))
    names.discard("")
    return base in names or _name(base) in {_name(n) for n in names}


def how_text(how: str, base: str | None) -> str:
    """How a pairing was made, in words, for the report's notes and `compare`."""
    return {
        "quantbench": f"made by `quantbench quantize` from {base}",
        "given": f"`run --base-model {base}`",
        "model_card": f"its model card's base_model ({base})",
        "tensors": "identical embeddings, norms and router weights (the tensors quantization leaves alone)",
    }.get(how, how)


def pair(run: StoredRunLike, bf16_runs: list[Run]) -> tuple[list[Run], str | None]:
    """The BF16 runs `run` pairs with and how: by the base named on the run, else by identical shared tensors.
    Runs of the bf16 backend and runs already sharing a model id with a BF16 run are not paired (their model id
    already says it)."""
    if run.backend == "bf16":
        return [], None
    base, how = run.base_model, run.base_model_how
    if base:
        named = [b for b in bf16_runs if names_base(str(base), b)]
        if named:
            return named, str(how or "given")
    digest = run.shared_tensors_hash
    if digest:
        same = [b for b in bf16_runs if b.shared_tensors_hash == digest]
        if same:
            return same, "tensors"
    return [], None


def pair_runs(runs: list[StoredRunLike]) -> dict[str, tuple[str, str]]:
    """run_id → (the BF16 model id it pairs with, how) for every run whose own model id has no successful BF16
    run among `runs` but whose evidence names or matches one (the newest such BF16 run's model id)."""
    bf16 = [r for r in runs if r.status == "ok" and r.backend == "bf16"
            and (r.role or "candidate") != "noise_floor" and r.weights != "synthetic"]
    have_reference = {r.model_id for r in bf16}
    out = {}
    for run in runs:
        if run.model_id in have_reference:
            continue
        matches, how = pair(run, bf16)
        if matches:
            newest = max(matches, key=lambda b: str(b.created_at))
            out[str(run.run_id)] = (str(newest.model_id), str(how))
    return out
