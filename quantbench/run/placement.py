"""Where and in what precision a spec runs, as torch objects: the child's side of RunSpec's `device` and `dtype`.
Apart from run/backend.py because it imports torch, which the runner's parent does not."""

from __future__ import annotations

import torch

from quantbench.errors import ConfigError
from quantbench.run.spec import RunSpec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def device_of(spec: RunSpec) -> str:
    return spec.device or ("cuda:0" if torch.cuda.is_available() else "cpu")


def dtype_of(spec: RunSpec) -> torch.dtype:
    if spec.dtype not in DTYPES:
        raise ConfigError(f"--dtype {spec.dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[spec.dtype]
