"""Where quantbench keeps what it makes on this machine: `$QUANTBENCH_CACHE`, default ~/.cache/quantbench (the embedded
models and their variants, the omni suite, runs a store could not take). A module of its own at the bottom of the
package, importing nothing heavy, so that the CLI's checks, the model makers and the store read one definition;
and the clean-up of the folders a killed process left (`remove_dead_folders`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("QUANTBENCH_CACHE") or Path.home() / ".cache" / "quantbench")


def remove_dead_folders(folder: Path, prefix: str) -> None:
    """Remove the folders `{prefix}{pid}` or `{prefix}{pid}-…` in `folder` whose process is gone: what a SIGKILL
    left half made (a run's temporary folder, a variant being quantized: gigabytes for a real model), which nothing
    else would ever remove. This process's own, and another user's live ones, are left alone."""
    for left in folder.glob(f"{prefix}*") if folder.is_dir() else ():
        pid = left.name.removeprefix(prefix).split("-", 1)[0]
        if left.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive, not ours to judge
        pass
    return True
