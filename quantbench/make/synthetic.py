"""A synthetic real-shape model written to disk (`quantbench fixture --shape`): the model quantbench.models.synthetic
builds from its seed, saved as a loadable checkpoint with the files its family ships and a marker saying what it is."""

from __future__ import annotations

import json
from pathlib import Path

from quantbench.models.checkpoint import SYNTHETIC_FILE
from quantbench.models.families import shape_family
from quantbench.models.synthetic import build_synthetic, synthetic_id


def save_synthetic(shape: str, out_dir: Path, *, layers: int | None = None, seed: int = 0) -> Path:
    """Write a loadable synthetic checkpoint (safetensors + tokenizer + the synthetic marker file, and the files
    a real checkpoint of its family ships: a Qwen3-Omni one's processor settings, so media reads as from that one)."""
    out_dir = Path(out_dir)
    model, tokenizer = build_synthetic(shape, layers=layers, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    for name, text in shape_family(shape).synthetic_files().items():
        (out_dir / name).write_text(text)
    marker = {"model_id": synthetic_id(shape, layers, seed), "shape": shape,
              "layers": model.config.get_text_config().num_hidden_layers, "seed": seed}
    (out_dir / SYNTHETIC_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    return out_dir
