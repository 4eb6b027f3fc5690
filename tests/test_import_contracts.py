"""Contracts import-linter cannot see, because it sees modules and not names or strings: SQL lives only in
quantbench/store, and the dashboard uses only quantbench's public names. Each check runs on the tree, and on a
copy of it with one violation injected, to show that it catches one."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQL = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE|CREATE|ALTER)\b", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants: prose ("Update the store …"), not SQL."""
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, nodes) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _string_starts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal as written: a plain string, or the text an f-string starts with.
    The pieces of an f-string after a placeholder (`f"{x} with options"`) do not start a string."""
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    docs = _docstrings(tree)
    starts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            starts.append((node.lineno, str(node.values[0].value)))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings
              and id(node) not in docs):
            starts.append((node.lineno, node.value))
    return starts


def sql_outside_store(root: Path) -> list[str]:
    """`path:line` of every string literal that starts like SQL in quantbench/, backends/ or dashboard/, outside
    quantbench/store/."""
    files = [*root.glob("quantbench/**/*.py"), *root.glob("backends/*.py"), *root.glob("dashboard/*.py")]
    store = root / "quantbench" / "store"
    found = []
    for path in sorted(files):
        if store in path.parents:
            continue
        for line, text in _string_starts(ast.parse(path.read_text(), str(path))):
            if SQL.match(text):
                found.append(f"{path.relative_to(root)}:{line}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dashboard_private_uses(root: Path) -> list[str]:
    """`path:line name` of every private quantbench name the dashboard imports or reaches through a module or
    class it imported from quantbench (`parity._records`), and every import from quantbench.store.schema (the
    store's SCHEMA_VERSION comes from quantbench.store)."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(root.glob("dashboard/*.py")):
        tree = ast.parse(path.read_text(), str(path))
        bound: set[str] = set()  # local names bound to a quantbench module, class or function
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "quantbench":
                module = node.module or ""
                if module == "quantbench.store.schema" or any(_private(p) for p in module.split(".")):
                    found.append((path.name, node.lineno, module))
                for alias in node.names:
                    if _private(alias.name):
                        found.append((path.name, node.lineno, f"{module}.{alias.name}"))
                    bound.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "quantbench":
                        if any(_private(p) for p in alias.name.split(".")):
                            found.append((path.name, node.lineno, alias.name))
                        bound.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                root_name = node.value
                while isinstance(root_name, ast.Attribute | ast.Call | ast.Subscript):
                    root_name = root_name.func if isinstance(root_name, ast.Call) else root_name.value
                if isinstance(root_name, ast.Name) and root_name.id in bound:
                    found.append((path.name, node.lineno, ast.unparse(node)))
    return [f"{name}:{line} {what}" for name, line, what in sorted(found)]


def _copy_tree(tmp_path: Path) -> Path:
    for folder in ("quantbench", "backends", "dashboard"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return tmp_path


def _append(path: Path, text: str) -> int:
    """Append `text` to a file; returns the line number it starts on."""
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n" + text + "\n")
    return len(lines) + 1


def test_sql_lives_only_in_the_store():
    assert sql_outside_store(ROOT) == []


def test_the_sql_check_catches_a_query_outside_the_store(tmp_path):
    copy = _copy_tree(tmp_path)
    line = _append(copy / "quantbench/report/render.py", 'NEWEST = "select * from runs ORDER BY created_at"')
    fline = _append(copy / "dashboard/store_cache.py",
                    'def n(store, t):\n    return store.read(f"  WITH x AS (SELECT 1) SELECT * FROM {t}")')
    _append(copy / "quantbench/store/queries.py", 'ALL_RUNS = "SELECT * FROM runs"')  # the store may
    _append(copy / "backends/http.py", 'NOTE = f"answered {1} with options"')  # prose after a placeholder
    assert sql_outside_store(copy) == [f"dashboard/store_cache.py:{fline + 1}", f"quantbench/report/render.py:{line}"]


def test_the_dashboard_uses_only_public_names():
    assert dashboard_private_uses(ROOT) == []


def test_the_public_names_check_catches_private_imports_and_attributes(tmp_path):
    copy = _copy_tree(tmp_path)
    page = copy / "dashboard/store_cache.py"
    a = _append(page, "rows = parity._records")
    b = _append(page, "from quantbench.analysis.recommend import _pick_rows")
    c = _append(page, "from quantbench.store.schema import SCHEMA_VERSION as V")
    d = _append(page, "import quantbench.report.render as qr\nx = qr._md_escape('|')")
    e = _append(page, "y = Rules()._private_state")
    _append(page, "z = st.session_state._internal, Rules.__name__")  # not quantbench's, and a dunder
    assert dashboard_private_uses(copy) == [
        f"store_cache.py:{a} parity._records", f"store_cache.py:{b} quantbench.analysis.recommend._pick_rows",
        f"store_cache.py:{c} quantbench.store.schema", f"store_cache.py:{d + 1} qr._md_escape",
        f"store_cache.py:{e} Rules()._private_state"]
