"""The check that quantizing left everything but the MoE experts alone: every non-expert tensor of a variant
(attention, router `mlp.gate`, norms, embeddings, lm_head, a multimodal model's `visual.*` and `audio_tower.*`) has
the source's dtype, shape and bytes, and the variant has no non-expert tensor the source lacks or the other way
round. The reference card promises it for its BF16 head; `quantbench quantize` checks it after every
experts-only quantization and records the result in the variant's provenance.

Names are compared across key layouts through the family's `module_name` (a Qwen3-Omni-MoE source may be a full
checkpoint under `thinker.`, in hub names, while ModelOpt exports module names); the components a decision never
reads (the talker and code2wav of a full checkpoint) are not part of the variant and not compared. Bytes are read
straight from the safetensors files (the header gives each tensor's byte range), never converted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from quantbench.errors import QuantbenchError
from quantbench.models.checkpoint import read_config, safetensors_header, weight_files
from quantbench.models.families import family_of, has_key_layouts

_CHUNK = 16 << 20


class StoredTensor(NamedTuple):
    key: str  # the checkpoint's own key
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in `file`
    end: int


class ChangedTensor(QuantbenchError):
    """A non-expert tensor of a variant differs from its source's (or is missing on one side)."""


def is_expert_tensor(name: str) -> bool:
    """Whether a tensor belongs to the MoE experts (per expert `…experts.E.…`, or fused `…experts.gate_up_proj`)."""
    return ".experts." in f".{name}."


def checkpoint_names(root: Path) -> Callable[[str], str | None]:
    """The map from `root`'s checkpoint keys to one name per tensor: its family's `module_name` (None: a component
    never read) when the family has several key layouts, else the key itself."""
    config = read_config(root)
    family = family_of(config)
    if has_key_layouts(family):
        return lambda key: family.module_name(key, config)
    return lambda key: key


def non_expert_tensors(root: Path) -> dict[str, StoredTensor]:
    """Every non-expert tensor of the checkpoint at `root`, by its family's name for it, from the headers alone."""
    name_of = checkpoint_names(root)
    out: dict[str, StoredTensor] = {}
    scorer_files = weight_files(root)  # a checkpoint's own scorer head: copied and checked whole (models/scorer.py)
    for file in sorted(f for f in root.glob("*.safetensors") if f.name not in scorer_files):
        start, header = safetensors_header(file)
        for key, meta in header.items():
            name = name_of(key)
            if name is None or is_expert_tensor(name):
                continue
            begin, end = meta["data_offsets"]
            out[name] = StoredTensor(key, file, meta["dtype"], tuple(meta["shape"]), start + begin, start + end)
    return out


def _same_bytes(a: StoredTensor, b: StoredTensor) -> bool:
    if a.end - a.start != b.end - b.start:
        return False
    with open(a.file, "rb") as fa, open(b.file, "rb") as fb:
        fa.seek(a.start)
        fb.seek(b.start)
        left = a.end - a.start
        while left > 0:
            n = min(_CHUNK, left)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


def check_unchanged(source: Path, variant: Path) -> dict[str, Any]:
    """Compare every non-expert tensor of `variant` with `source`'s; a ChangedTensor naming the first (by name)
    that differs, is missing, or is new. Returns what was checked, for the provenance."""
    theirs, ours = non_expert_tensors(source), non_expert_tensors(variant)
    fix = "the quantizer changed what experts-only quantizing must leave alone (the libraries' log may say why)"
    for name in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(name), ours.get(name)
        if b is None:
            raise ChangedTensor(f"{variant}: the source's non-expert tensor {a.key} ({name}) is missing; {fix}")
        if a is None:
            raise ChangedTensor(f"{variant}: non-expert tensor {b.key} ({name}) is not in the source {source}; {fix}")
        where = f"{b.key} (source: {a.key})" if a.key != b.key else b.key
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            raise ChangedTensor(f"{variant}: non-expert tensor {where} is {b.dtype} {list(b.shape)}, the source's is "
                                f"{a.dtype} {list(a.shape)}; {fix}")
        if not _same_bytes(a, b):
            raise ChangedTensor(f"{variant}: non-expert tensor {where} differs from the source's bytes; {fix}")
    return {"result": "identical", "tensors": len(ours), "bytes": sum(t.end - t.start for t in ours.values()),
            "what": "every non-expert tensor (attention, router, norms, embeddings, lm_head, encoder towers): "
                    "dtype, shape and bytes against the source's, names mapped across key layouts"}


def restore_source_dtypes(source: Path, variant: Path) -> dict[str, Any]:
    """Store back in the source's dtype every non-expert tensor of `variant` that a library widened without
    changing its value: auto-round on a CPU without native bf16 computes in float32 and writes the tensors it
    leaves alone as float32 (twice the bytes; the config still says bfloat16). A tensor is restored only when it
    is exactly the source's tensor widened (every element equal, bit for bit), and then the source's tensor is
    stored; any other difference, however small, is left for check_unchanged to name. Returns what was restored, for the provenance."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    theirs, ours = non_expert_tensors(source), non_expert_tensors(variant)
    widened = {name: t for name, t in ours.items() if name in theirs and t.dtype != theirs[name].dtype
               and t.shape == theirs[name].shape}
    restored: dict[str, str] = {}
    saved = 0
    for file in sorted({t.file for t in widened.values()}):
        with safe_open(str(file), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        changed = False
        for name, t in widened.items():
            if t.file != file:
                continue
            src = theirs[name]
            with safe_open(str(src.file), framework="pt") as handle:
                original = handle.get_tensor(src.key)
            widened_here = tensors[t.key]
            exact = original.to(widened_here.dtype)  # the source's values, widened: the library's tensor must be it
            if torch.equal(exact.reshape(-1).view(torch.uint8), widened_here.reshape(-1).view(torch.uint8)):
                saved += widened_here.numel() * (widened_here.element_size() - original.element_size())
                tensors[t.key] = original
                restored[name] = f"{t.dtype} -> {src.dtype}"
                changed = True
        if changed:
            save_file(tensors, str(file), metadata=metadata)
    if not restored:
        return {}
    kinds = sorted(set(restored.values()))
    return {"tensors": len(restored), "dtypes": kinds, "bytes_saved": saved,
            "why": "the library wrote these non-expert tensors widened (auto-round computes in float32 on a CPU "
                   "without native bf16); their values are the source's exactly, stored back in its dtype"}
