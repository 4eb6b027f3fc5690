"""What a quantized variant is made with: the recipe (every setting that changes its weights, and so its cache key)
and the libraries' versions a provenance file records. Apart from the package's __init__ so that the routes it
calls (multimodal.py) read them without importing their caller."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from quantbench.errors import ConfigError

SCHEMES = ("int4", "nvfp4", "fp8")
LIBRARIES = ("torch", "transformers", "auto-round", "nvidia-modelopt", "quantbench")


@dataclass(frozen=True)
class Recipe:
    """Everything that changes the quantized weights (and so the cache key)."""

    scheme: str
    iters: int = 0  # int4: 0 = RTN, 200 = SignRound
    nsamples: int = 128  # calibration samples of `seqlen` tokens each
    seqlen: int = 512
    group_size: int = 128  # int4 only
    experts_only: bool = True  # attention, router, embeddings, lm_head stay BF16
    seed: int = 0
    opt_rtn: bool = True  # int4, iters 0: auto-round's optimized RTN (its default) or plain round-to-nearest
    calibration_hash: str | None = None  # --calibration FILE: its bytes' and its media files' hash (None: train split)

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(f"--scheme {self.scheme!r}: use one of {', '.join(SCHEMES)}")
        for flag, value, least, what in (("--iters", self.iters, 0, "0 (RTN) or more (SignRound)"),
                                         ("--nsamples", self.nsamples, 1, "1 or more calibration samples"),
                                         ("--seqlen", self.seqlen, 8, "8 or more tokens")):
            if value < least:  # before: "recipe Recipe(scheme='int4', ...): iters must be >= 0, ...", no flag named
                raise ConfigError(f"{flag} {value}: give {what}")
        if not self.opt_rtn and (self.scheme != "int4" or self.iters):
            raise ConfigError("--plain-rtn: only for --scheme int4 with --iters 0 (SignRound has no RTN to choose)")
        if not self.opt_rtn and self.calibration_hash is not None:
            raise ConfigError("--calibration with --plain-rtn: plain round-to-nearest runs no calibration pass; drop "
                              "one of them")
        if self.group_size not in (32, 64, 128, 256, -1):
            raise ConfigError(f"--group-size {self.group_size}: use 32, 64, 128, 256 or -1 (one group per row)")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.opt_rtn:  # the default, left out: cache keys made before the choice existed stay valid
            del out["opt_rtn"]
        if self.calibration_hash is None:  # the same: the built-in train split
            del out["calibration_hash"]
        return out

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out
