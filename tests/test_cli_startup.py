"""What a command imports before it answers: `quantbench run` builds its flags from every installed backend's
Options, so a backend that imports torch at module level makes `run --help` and every refusal wait seconds for it
(5-8 s on a loaded 2-core VM, docs/BENCHMARKS.md). Asserted on the imports, not on a wall time."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "triton", "pandas")


def imported(argv: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m quantbench ARGV`; the top-level packages it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "quantbench", *argv], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})
    names = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    return done, names


def test_every_installed_backend_imports_without_torch():
    code = ("import sys\nfrom quantbench.run.spec import installed_backends, options_class\n"
            "installed = installed_backends()\nfor name in installed: options_class(name, installed)\n"
            f"print(sorted(installed), [m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['bf16', 'fp8', 'http', 'int4', 'nvfp4'] []"


@pytest.mark.parametrize("argv", [["run", "--help"], ["serve", "--help"], ["run", "--gpu", "cpu", "--db", "BAD"]],
                         ids=["run --help", "serve --help", "run refusing a bad --db"])
def test_run_parses_its_flags_and_refuses_a_bad_store_without_torch_or_pandas(tmp_path, argv):
    bad = tmp_path / "r.duckdb"
    bad.write_text("not a DuckDB file\n" * 100)
    done, names = imported([str(bad) if a == "BAD" else a for a in argv], tmp_path)
    if "BAD" in argv:
        assert done.returncode == 2 and "not a DuckDB store" in done.stderr
    else:
        assert done.returncode == 0 and "--nvfp4" in done.stdout  # the backends' flags are there
    assert "pydantic" in names  # the probe sees imports at all
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
