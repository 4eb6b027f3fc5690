"""Test-only backends (loaded by import path, `tests.suite_fault_backends:HangInForwardBackend`) for
tests/test_suite_faults.py: one that hangs after its model loaded (a run stopped mid-suite), one whose engine
honours --truncate and --max-tokens as the real backends' do (TransformersEngine.for_spec)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from quantbench.engine.scoring import TransformersEngine
from quantbench.run.spec import EngineOptions
from tests.tiny import TinyBackend, tiny_tokenizer


class HangInForwardBackend(TinyBackend):
    """Loads, then writes its pid to $QUANTBENCH_TEST_PIDFILE at its first decision and hangs there: the run is
    stopped with its variant known."""

    def load(self, spec, machine):
        loaded = super().load(spec, machine)

        def hang(prepared):
            Path(os.environ["QUANTBENCH_TEST_PIDFILE"]).write_text(str(os.getpid()))
            time.sleep(3600)

        loaded.engine.forward = hang
        return loaded


class SpecEngineBackend(TinyBackend):
    """TinyBackend whose engine is built from the spec (truncation, --max-tokens), as every real backend's is."""

    Options = EngineOptions

    def load(self, spec, machine):
        loaded = super().load(spec, machine)
        loaded.engine = TransformersEngine.for_spec(loaded.model, tiny_tokenizer(), spec)
        return loaded
