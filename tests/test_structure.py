"""The shape of the tree, checked: no import cycle anywhere (a package's __init__ and its children included, which
import-linter's sibling contract cannot see), no source file over 600 lines, and the contract that keeps what
measures from importing what makes models. Each check also runs on a copy of the tree with one violation injected,
to show that it catches one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("quantbench", "backends", "dashboard")
MAX_LINES = 600


def import_cycles(root: Path) -> list[list[str]]:
    """Every set of modules that import each other around a loop (strongly connected components of more than one
    module), imports under `if TYPE_CHECKING:` left out: they never run."""
    code = (
        "import grimp, json, sys\n"
        f"g = grimp.build_graph(*{PACKAGES!r}, exclude_type_checking_imports=True, cache_dir=None)\n"
        "json.dump({m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}, sys.stdout)\n")
    # A child process: grimp imports nothing, but the copy's packages must shadow the installed ones.
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                         capture_output=True, text=True, check=True).stdout
    edges: dict[str, list[str]] = json.loads(out)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(edges):  # Tarjan's algorithm, iterative (the tree is deep enough to matter)
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return sorted(cycles)


def long_files(root: Path) -> list[str]:
    """`path: lines` of every Python source file over MAX_LINES lines, tests and benchmarks included."""
    found = []
    for folder in (*PACKAGES, "tests", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {n}")
    return found


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, "--no-cache"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True)


def _copy_tree(tmp_path: Path) -> Path:
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def test_no_import_cycle_anywhere():
    assert import_cycles(ROOT) == []


def test_the_cycle_check_sees_a_package_init_and_its_child(tmp_path):
    copy = _copy_tree(tmp_path)
    # quantbench.store's __init__ imports quantbench.store.nested; nested importing its package closes a loop that
    # import-linter's acyclic_siblings contract does not report (parent and child are not siblings).
    _append(copy / "quantbench/store/nested.py", "import quantbench.store")
    assert import_cycles(copy) == [["quantbench.store", "quantbench.store.nested"]]


def test_no_source_file_over_600_lines():
    assert long_files(ROOT) == []


def test_the_length_check_catches_a_long_file(tmp_path):
    copy = _copy_tree(tmp_path)
    (copy / "tests").mkdir()
    (copy / "tests/test_long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (copy / "tests/test_edge.py").write_text("x = 1\n" * MAX_LINES)
    assert long_files(copy) == [f"tests/test_long.py: {MAX_LINES + 1}"]


def test_the_contracts_hold_on_the_tree():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module, line", [("backends/int4.py", "import quantbench.make.quantize"),
                                          ("quantbench/run/child.py", "from quantbench.make import plant")])
def test_importing_what_makes_models_from_what_measures_breaks_a_contract(tmp_path, module, line):
    copy = _copy_tree(tmp_path)
    _append(copy / module, line)
    result = lint_imports(copy)
    assert result.returncode == 1
    assert "what measures never imports what makes models (training, quantizing, planting) BROKEN" in result.stdout
    importer = module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> quantbench.make" in result.stdout
