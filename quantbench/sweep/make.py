"""Making the quantized variants a sweep's runs need, once each, before those runs.

A `Make` of the plan is either a checkpoint model's variant under variants_dir (`quantize_missing = true`), made
by `quantbench quantize` in a fresh child interpreter, or the embedded fixture's cached variant. Quantizing never
happens in the driver's process: auto-round and ModelOpt patch transformers on import. A variant that cannot be
made turns every run that needed it into a failed row saying why; the sweep goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from quantbench.errors import QuantbenchError
from quantbench.run.resolve import prepared_model_dir
from quantbench.sweep.planning import Make, PlannedRun
from quantbench.sweep.spec import checkpoint_ready


def _quantize(source: str, scheme: str, out: str, options: dict[str, Any]) -> None:
    """In a fresh process: quantize into a staging dir, then rename it into place (a crash leaves no half
    checkpoint that a later sweep would take for a finished one)."""
    import shutil

    from quantbench.make.quantize import quantize

    target = Path(out)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        quantize(source, scheme, staging, progress=False, **options)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make(make: Make) -> None:
    if make.source is None:
        prepared_model_dir(make.scheme)  # cached; quantizes in its own child process on first use
        return
    # A plain child interpreter, not a multiprocessing spawn: spawn re-runs whatever `__main__` is (under
    # Streamlit's AppTest or an embedding app that is not importable), and auto-round must not touch this process.
    args = json.dumps([str(make.source), make.scheme, str(make.out), dict(make.options)])
    code = "import json, sys; from quantbench.sweep.make import _quantize; _quantize(*json.loads(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise QuantbenchError(f"quantize exited with status {done.returncode}: {tail[0]}")
    if not checkpoint_ready(make.out):
        raise QuantbenchError(f"quantize finished but {make.out} holds no checkpoint")


def make_missing(runs: list[PlannedRun], console: Console) -> dict[Make, str]:
    """Make each missing quantized checkpoint once, before the runs that need it, each quantization in a fresh
    process (auto-round and ModelOpt patch transformers on import). Returns why each failed one failed."""
    failed: dict[Make, str] = {}
    for make in dict.fromkeys(r.make for r in runs if r.make is not None):
        if make.out is not None and checkpoint_ready(make.out):
            continue
        what = f"the {make.scheme} variant of {make.model}" + (f" → {make.out}" if make.out else " (cached)")
        with console.status(f"quantbench quantize: {escape(what)} …"):
            try:
                _make(make)
                console.print(f"[green]ready:[/] {escape(what)}")
            except Exception as e:  # every run that needed it becomes a failed row saying why
                failed[make] = f"could not make {what} with quantbench quantize: {type(e).__name__}: {e}"
                console.print(f"[red]{escape(failed[make])}[/]")
    return failed
