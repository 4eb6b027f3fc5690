"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they bite: an upward import fails them."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess:
    # From the repo root with the root on the path: dashboard/ is not an installed package. --no-cache keeps
    # .import_linter_cache/ out of the tree.
    return subprocess.run([LINT, "--no-cache"], cwd=root, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("tree")
    for name in ("quantbench", "backends", "dashboard"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst)
    return dst


def test_the_tree_keeps_every_contract():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_an_upward_import_breaks_the_layers(copy):
    pdl = copy / "quantbench" / "engine" / "pdl.py"
    pdl.write_text(pdl.read_text() + "\nfrom quantbench.cli import app  # noqa\n")
    out = lint(copy)
    assert out.returncode != 0
    assert "quantbench.engine.pdl -> quantbench.cli" in out.stdout


def test_a_backend_importing_another_breaks_independence(copy):
    bf16 = copy / "backends" / "bf16.py"
    bf16.write_text(bf16.read_text() + "\nimport backends.int4  # noqa\n")
    out = lint(copy)
    assert out.returncode != 0
    assert "backends.bf16 -> backends.int4" in out.stdout


def test_duckdb_outside_the_store_breaks_its_contract(copy):
    stats = copy / "quantbench" / "analysis" / "stats.py"
    stats.write_text(stats.read_text() + "\nimport duckdb  # noqa\n")
    out = lint(copy)
    assert out.returncode != 0
    assert "quantbench.analysis.stats -> duckdb" in out.stdout
