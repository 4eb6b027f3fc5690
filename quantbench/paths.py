"""Where quantbench keeps what it makes on this machine: `$QUANTBENCH_CACHE`, default ~/.cache/quantbench (the embedded
models and their variants, the omni suite, runs a store could not take). A module of its own at the bottom of the
package, importing nothing heavy, so that the CLI's checks, the model makers and the store read one definition."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTBENCH_CACHE") or Path.home() / ".cache" / "quantbench")
