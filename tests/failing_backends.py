"""Test-only backends (loaded by import path, `tests.failing_backends:KilledBackend`) for the failure kinds
`tests.tiny` does not cover: a child killed by SIGKILL (what the kernel's OOM killer does), an out-of-memory
error, an unsupported variant."""

from __future__ import annotations

import os
import signal

from quantbench.errors import UnsupportedError
from tests.tiny import TinyBackend


class KilledBackend(TinyBackend):
    def load(self, spec, machine):
        os.kill(os.getpid(), signal.SIGKILL)


class OutOfMemoryBackend(TinyBackend):
    def load(self, spec, machine):
        raise MemoryError("could not allocate 56.9 GiB for the experts")


class UnsupportedBackend(TinyBackend):
    def load(self, spec, machine):
        raise UnsupportedError("nvfp4 packed needs compute capability 10.0 here; use --nvfp4 unpacked")


def model_less_load_error(spec, machine):
    """The row an older quantbench (before `run` checked --model in the parent) stored for a missing checkpoint:
    the child's load_error, with the machine and no model id. Stores made then still hold such rows."""
    from quantbench.sweep.executor import failed_result

    result = failed_result(spec, "load_error", f"LoadError: {spec.model}: no config.json (not a checkpoint)")
    result.run = result.run.model_copy(update=machine.as_row())
    return result


class NanWeightsBackend(TinyBackend):
    """The tiny model with a final norm of NaN, as a checkpoint holding NaN weights loads: every probability NaN."""

    def load(self, spec, machine):
        loaded = super().load(spec, machine)
        loaded.model.model.norm.weight.data.fill_(float("nan"))
        return loaded
