"""A planted regression: a copy of a correct variant whose vision (or audio) tower alone is perturbed or
fake-quantized, so the per-modality verdict can be seen to catch what it is for (issue #25 part 5).

    plant(Path("int4"), Path("int4-planted"), tower="vision", mode="perturb", seed=0, scale=1.0)

It reproduces the kind of fault a serving engine once shipped on this family (its FP8 settings applied to the
BF16 vision and audio encoders: a red image answered "gray", text untouched). Every other tensor and file is
copied byte for byte; the tower's floating-point weights (tensors of two or more dimensions; norms and biases
are left alone) become:

- `perturb`: w + scale · std(w) · N(0, 1), the noise drawn from torch's generator seeded with `seed`, per tensor
  in name order;
- `quantize`: symmetric round-to-nearest at `bits` bits with one scale per output row (max |w| over the row),
  written back in the tensor's own dtype (fake quantization: the checkpoint's format does not change).

Honest provenance: `quantbench_planted.json` says what was done, to which tensors, from which checkpoint (its
hash), and that the result is a planted regression for testing the verdict, never a variant to use;
`quantbench_provenance.json`, if the source had one, is copied with the same note under `planted`, since its
record of unchanged tensors no longer holds for the tower; a source without one (a BF16 checkpoint) gets one
naming it as the copy's source model, so the copy's runs share its model id and pair with its BF16 reference. A run of the planted checkpoint is labelled
`<variant>+planted-<tower>` and carries the file in its `extra.planted` (quantbench.run.child), so neither the
report nor a reader can take it for a real variant.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError
from quantbench.models.checkpoint import PLANTED_FILE, PROVENANCE_FILE, check_safetensors_only, model_identity
from quantbench.models.lineage import canonical_tensor_name

TOWERS = {"vision": "visual.", "audio": "audio_tower."}  # the tower's canonical tensor-name prefix
MODES = ("perturb", "quantize")
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def tower_of(name: str, tower: str) -> bool:
    """Whether checkpoint tensor `name` belongs to `tower`, whichever layout wrote it (hub names `visual.…`, a
    full checkpoint's `thinker.visual.…`, ModelOpt's `model.visual.…`)."""
    canonical = canonical_tensor_name(name)
    return canonical is not None and canonical.startswith(TOWERS[tower])


def _check(src: Path, out: Path, tower: str, mode: str, scale: float, bits: int, overwrite: bool) -> None:
    if tower not in TOWERS:
        raise ConfigError(f"--tower {tower!r}: use {' or '.join(TOWERS)}")
    if mode not in MODES:
        raise ConfigError(f"--mode {mode!r}: use {' or '.join(MODES)}")
    if mode == "perturb" and not 0 < scale < float("inf"):
        raise ConfigError(f"--scale {scale}: give the noise's size relative to each weight's spread, above 0 (e.g. 1)")
    if mode == "quantize" and not 2 <= bits <= 8:
        raise ConfigError(f"--bits {bits}: give 2 to 8 bits for the tower's fake quantization (e.g. 2)")
    if not (src / "config.json").is_file():
        raise ConfigError(f"--from {src}: no config.json there; give a variant's checkpoint directory")
    check_safetensors_only(src)
    if (src / PLANTED_FILE).is_file():
        raise ConfigError(f"--from {src}: it is already a planted regression ({PLANTED_FILE}); plant from a real "
                          "variant")
    if out.resolve() == src.resolve():
        raise ConfigError(f"--out {out} is --from itself; give a new directory")
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} exists; give a new directory or --overwrite")


def _planted_tensor(t: Any, mode: str, scale: float, bits: int, generator: Any) -> Any:
    import torch

    w = t.to(torch.float32)
    if mode == "perturb":
        noise = torch.randn(w.shape, generator=generator, dtype=torch.float32)
        return (w + scale * w.std() * noise).to(t.dtype)
    rows = w.reshape(w.shape[0], -1)
    top = 2 ** (bits - 1) - 1  # levels -top-1 .. top, as a signed integer of `bits` bits
    step = rows.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / top
    q = torch.clamp(torch.round(rows / step), -top - 1, top)
    return (q * step).reshape(w.shape).to(t.dtype)


def plant(src: Path, out: Path, *, tower: str = "vision", mode: str = "perturb", seed: int = 0, scale: float = 1.0,
          bits: int = 2, overwrite: bool = False) -> dict[str, Any]:
    """Write the planted copy of checkpoint `src` to `out`; returns what `quantbench_planted.json` records."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    _check(src, out, tower, mode, scale, bits, overwrite)
    identity = model_identity(src)
    files = sorted(src.glob("*.safetensors"))
    changed: list[str] = []
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors", PLANTED_FILE))
    generator = torch.Generator().manual_seed(seed)
    n_bytes = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata()
            names = list(f.keys())
            tensors = {name: f.get_tensor(name) for name in names}
        for name in sorted(names):
            t = tensors[name]
            if tower_of(name, tower) and t.ndim >= 2 and str(t.dtype).removeprefix("torch.") in FLOAT_DTYPES:
                tensors[name] = _planted_tensor(t, mode, scale, bits, generator)
                changed.append(name)
                n_bytes += t.numel() * t.element_size()
        save_file(tensors, str(tmp / file.name), metadata=metadata)
    if not changed:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"--tower {tower}: {src} has no floating-point {tower} tower weights "
                          f"({TOWERS[tower]}… tensors of two or more dimensions); plant into a checkpoint with that "
                          "tower (a Qwen3-Omni thinker or one of its variants)")
    record = {
        "planted": True,
        "purpose": "a deliberately broken copy for testing quantbench's per-modality verdict; not a variant to use",
        "from": str(src.resolve()), "from_hash": identity["model_hash"], "model_id": identity["model_id"], "tower": tower, "mode": mode, "seed": seed,
        **({"scale": scale} if mode == "perturb" else {"bits": bits}),
        "what": (f"w + {scale:g} * std(w) * N(0,1) per tensor" if mode == "perturb" else
                 f"symmetric round-to-nearest, {bits} bits, one scale per output row, stored in the tensor's dtype"),
        "tensors_changed": len(changed), "bytes_changed": n_bytes, "first_tensors": changed[:5],
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (tmp / PLANTED_FILE).write_text(json.dumps(record, indent=2) + "\n")
    prov = tmp / PROVENANCE_FILE
    note = {k: record[k] for k in ("purpose", "tower", "mode", "tensors_changed")}
    if prov.is_file():  # its `unchanged` record no longer holds for the tower: say so where it is read
        data = {**json.loads(prov.read_text()), "planted": note}
    else:  # a BF16 source: the copy is of its model (model_id), so its runs pair with the source's reference
        data = {"source_model_id": identity["model_id"], "source_model_hash": identity["model_hash"],
                "source_model_path": identity["model_path"], "source_revision": identity["model_revision"],
                "weights": identity["weights"], "planted": note}
    prov.write_text(json.dumps(data, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return record
