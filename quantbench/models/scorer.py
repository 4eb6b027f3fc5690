"""A checkpoint's own scorer: code shipped with a checkpoint that answers decisions itself, usually through a small
BF16 head of its own (the reference card's `systemone()` in `joint_schema_model.py`). This module finds it, checks
its files, hashes them, loads it (only when the run allows the checkpoint's code) and carries it, byte for byte,
into the variants `quantbench quantize` makes. quantbench.run.scorer answers through it.

A checkpoint names its scorer in config.json:

    "quantbench_scorer": {"class": "joint_schema_model.JointScorer",
                          "files": ["decision_head.safetensors"]}

`class` is `module.Class`: the module is `module.py` beside config.json (with any module it imports relatively,
as transformers' `auto_map` code); it is imported through transformers' own dynamic-module loader
(`get_class_from_dynamic_module`, local files only), never exec'd here. `files` are the head's weights: paths
inside the checkpoint, `.safetensors` only (never pickle), read by quantbench and given to the scorer as tensors
of the dtype stored (a BF16 head stays BF16). The parent checks all this before any child starts; the code runs
only with --trust-remote-code.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError, LoadError, QuantbenchError
from quantbench.models.checkpoint import SCORER_KEY, check_safetensors_header, read_config

_CLASS_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


class ScorerError(LoadError):
    """The checkpoint's scorer answered something that is not per-option probabilities (the checkpoint's code is
    at fault, so a run that meets it is a `load_error`)."""


@dataclass(frozen=True)
class ScorerFiles:
    """The scorer a checkpoint names: where it is and which files make it (paths relative to `root`)."""

    root: Path
    class_ref: str  # module.Class
    files: tuple[str, ...]  # the head's weights (*.safetensors)

    @property
    def module_file(self) -> Path:
        return self.root / f"{self.class_ref.split('.')[0]}.py"

    def entry(self) -> dict[str, Any]:
        """The config.json entry that names it."""
        return {"class": self.class_ref, "files": list(self.files)}

    def code_files(self) -> list[str]:
        """The module and every module it imports relatively, as transformers finds and copies them."""
        from transformers.dynamic_module_utils import (
            get_relative_import_files,  # lazy: the parent never needs it
        )

        found = [self.module_file, *map(Path, get_relative_import_files(self.module_file))]
        return sorted({str(f.resolve().relative_to(self.root.resolve())) for f in found})

    def hashes(self) -> dict[str, str]:
        """sha256 of each file (code and head), by relative path."""
        return {name: _sha256(self.root / name) for name in sorted({*self.code_files(), *self.files})}

    def record(self) -> dict[str, Any]:
        """What a run or a variant's provenance records: the class, each file's sha256 and one digest of them."""
        hashes = self.hashes()
        digest = hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()
        head = sum((self.root / f).stat().st_size for f in self.files)
        return {"class": self.class_ref, "sha256": digest, "files": hashes, "head_bytes": head}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def describe(root: str | Path, config: dict[str, Any] | None = None) -> ScorerFiles | None:
    """The scorer `root`'s config.json names, checked without running anything (milliseconds: file names and
    safetensors headers), or None when it names none. A malformed entry or a missing, pickled, outside or cut-short
    file is a LoadError naming config.json and the fix."""
    root = Path(root)
    config = read_config(root) if config is None else config
    entry = config.get(SCORER_KEY)
    if entry is None:
        return None
    where = f"{root / 'config.json'}: {SCORER_KEY}"
    shape = ('give {"class": "module.Class", "files": ["head.safetensors", ...]}, the module a .py file beside '
             "config.json")
    if not isinstance(entry, dict) or set(entry) - {"class", "files"} or not isinstance(entry.get("class"), str):
        raise LoadError(f"{where}: must be an object with `class` (and `files`); {shape}")
    class_ref, files = entry["class"], entry.get("files", [])
    if not _CLASS_REF.fullmatch(class_ref):  # also refuses `repo--module.Class`: code from another repository
        raise LoadError(f"{where}.class {class_ref!r} is not module.Class; {shape}")
    if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
        raise LoadError(f"{where}.files must be a list of paths; {shape}")
    found = ScorerFiles(root, class_ref, tuple(files))
    if not found.module_file.is_file():
        raise LoadError(f"{where}.class {class_ref!r}: {found.module_file.name} is not in {root}; restore the "
                        "checkpoint's scorer code (or remove the entry)")
    for name in files:
        target = (root / name).resolve()
        if not target.is_relative_to(root.resolve()):
            raise LoadError(f"{where}.files: {name!r} is outside the checkpoint; keep the head's files inside it")
        if not name.endswith(".safetensors"):
            raise LoadError(f"{where}.files: {name!r} is not a .safetensors file; a scorer's weights are read as "
                            "safetensors only (never pickle): convert it")
        if not target.is_file():
            raise LoadError(f"{where}.files: {name!r} is not in {root}; restore the checkpoint's head files")
        check_safetensors_header(target)
    return found


def require_trust(found: ScorerFiles | None, trusted: bool, flag: str = "--trust-remote-code") -> None:
    """The refusal of a checkpoint that names a scorer when its code may not run (`flag` says how to allow it)."""
    if found is not None and not trusted:
        raise ConfigError(f"{found.root / 'config.json'} names its own scorer, {found.module_file} (class "
                          f"{found.class_ref}): the checkpoint's code runs only with {flag}; read that file, then "
                          f"pass {flag} to score through it")


def load(found: ScorerFiles, *, model: Any, tokenizer: Any, processor: Any, device: Any) -> Any:
    """The scorer object: its class imported through transformers' dynamic-module loader (local files only), built
    with the loaded model (quantized experts and all), the tokenizer / processor, the checkpoint directory, the
    device, and its head's weights read from safetensors as stored. Call only when the run allows the code."""
    from safetensors.torch import load_file
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    try:
        cls = get_class_from_dynamic_module(found.class_ref, str(found.root), local_files_only=True)
    except ImportError as e:  # transformers' check_imports: a package the code needs is not installed
        raise LoadError(f"the checkpoint's scorer {found.module_file}: {e}") from e
    except AttributeError as e:
        raise LoadError(f"the checkpoint's scorer {found.module_file} has no class {found.class_ref.split('.')[1]}: "
                        f"fix {SCORER_KEY}.class in {found.root / 'config.json'}") from e
    weights: dict[str, Any] = {}
    for name in found.files:
        for key, tensor in load_file(str(found.root / name), device=str(device)).items():
            if key in weights:
                raise LoadError(f"{found.root}: tensor {key} of the scorer's head is in two of its files; "
                                "give each tensor once")
            weights[key] = tensor
    return cls(model=model, tokenizer=tokenizer, processor=processor, checkpoint=found.root, device=device,
               weights=weights)


def carry_over(source: str | Path | None, out: str | Path) -> dict[str, Any]:
    """Copy the scorer `source` names into the variant `out` unchanged (code and head files, and its config
    entry), then check every file is byte-identical (sha256). Returns the provenance's `scorer` entry ({} when
    `source` names none). Nothing is run: copying needs no --trust-remote-code."""
    found = describe(source) if source is not None else None
    if found is None:
        return {}
    out = Path(out)
    want = found.hashes()
    for name in want:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found.root / name, out / name)
    config_file = out / "config.json"
    config = json.loads(config_file.read_text())
    if config.get(SCORER_KEY) != found.entry():
        config[SCORER_KEY] = found.entry()
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    copied = describe(out)
    got = copied.hashes() if copied is not None else {}
    if got != want:
        differ = sorted(n for n in {*want, *got} if want.get(n) != got.get(n))
        raise QuantbenchError(f"{out}: the scorer's files {', '.join(differ)} are not byte-identical to "
                              f"{found.root}'s after copying; the variant is not usable: quantize again")
    return {"scorer": {**found.record(), "byte_identical": True, "copied_from": str(found.root.resolve())}}
