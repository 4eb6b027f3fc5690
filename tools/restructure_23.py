import re, subprocess
from pathlib import Path
MOVES = {  # old dotted module -> new; a package entry covers its submodules (quantbench.moe.engine -> …engine.moe.engine)
 "quantbench.suite": "quantbench.protocol.suite", "quantbench.suitegen": "quantbench.protocol.suitegen",
 "quantbench.prompt": "quantbench.protocol.prompt",
 "quantbench.scoring": "quantbench.engine.scoring", "quantbench.cudagraph": "quantbench.engine.cudagraph",
 "quantbench.pdl": "quantbench.engine.pdl", "quantbench.fused_ops": "quantbench.engine.fused.ops",
 "quantbench.fused_layer": "quantbench.engine.fused.layer", "quantbench.moe": "quantbench.engine.moe",
 "quantbench.checkpoint": "quantbench.models.checkpoint", "quantbench.lineage": "quantbench.models.lineage",
 "quantbench.modelopt_loader": "quantbench.models.modelopt", "quantbench.loading": "quantbench.models.loading",
 "quantbench.fixture": "quantbench.models.fixture", "quantbench.quantize": "quantbench.models.quantize",
 "quantbench.backend": "quantbench.run.backend", "quantbench.runner": "quantbench.run.runner",
 "quantbench.child": "quantbench.run.child", "quantbench.machine": "quantbench.run.machine",
 "quantbench.memory": "quantbench.run.memory",
 "quantbench.analysis": "quantbench.analysis.stats", "quantbench.parity": "quantbench.analysis.parity"}
TO_INIT = ["protocol", "report", "server"]           # X.py -> X/__init__.py: dotted names stay valid
NEW_PKGS = ["engine", "engine/fused", "models", "run", "analysis"]
SKIP = {"quantbench/protocol/suitegen.py"}
def git(*a): return subprocess.run(["git", *a], check=True, capture_output=True, text=True).stdout
def path_of(mod, pkg=False): return mod.replace(".", "/") + ("" if pkg else ".py")
sg = git("hash-object", "quantbench/suitegen.py")
for d in ["protocol", "report", "server", "protocol/data", *NEW_PKGS]: Path("quantbench", d).mkdir(parents=True, exist_ok=True)
for n in TO_INIT: git("mv", f"quantbench/{n}.py", f"quantbench/{n}/__init__.py")
for f in git("ls-files", "quantbench/data").split(): git("mv", f, "quantbench/protocol/data/")
for old, new in MOVES.items():
    if Path(path_of(old)).is_file():                 # test the file first: quantbench/analysis/ already exists
        git("mv", path_of(old), path_of(new))
    else:                                            # a package, moved file by file, so a stale __pycache__ at the
        src, dst = path_of(old, True), path_of(new, True)   # target cannot make git nest it (moe/ -> engine/moe/moe/)
        for f in git("ls-files", src).split():
            t = Path(dst, Path(f).relative_to(src)); t.parent.mkdir(parents=True, exist_ok=True); git("mv", f, str(t))
for d in NEW_PKGS:
    init = Path("quantbench", d, "__init__.py")
    if not init.exists(): init.write_text(f'"""quantbench.{d.replace("/", ".")}."""\n'); git("add", str(init))
DOTTED = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(MOVES, key=len, reverse=True))) + r")(?!\w)")
FROM_PKG = re.compile(r"^(?P<ind>[ \t]*)from quantbench import (?P<names>\([^)]*\)|[^\n#]+?)(?P<tail>[ \t]*#[^\n]*)?$", re.M)
def from_pkg(m):                                      # `from quantbench import lineage, pdl` -> one line per moved name
    names = [n.strip() for n in m["names"].strip("()").replace("\n", " ").split(",") if n.strip()]
    out, keep = [], []
    for n in names:
        name, _, alias = (x.strip() for x in n.partition(" as "))
        new = MOVES.get(f"quantbench.{name}")
        if new is None: keep.append(n); continue
        parent, _, leaf = new.rpartition("."); alias = alias or name
        out.append(f"{m['ind']}from {parent} import {leaf}" + ("" if alias == leaf else f" as {alias}"))
    if not out: return m[0]
    if keep: out.insert(0, f"{m['ind']}from quantbench import {', '.join(keep)}")
    out[0] += m["tail"] or ""
    return "\n".join(out)
for pat in ("quantbench/**/*.py", "backends/*.py", "dashboard/*.py", "tests/*.py", "benchmarks/*.py",
            "examples/**/*", "docs/*.md", "README.md", "pyproject.toml"):
    for p in Path().glob(pat):
        if str(p) in SKIP or not p.is_file() or (p.name == "__init__.py" and str(p.parent)[11:] in NEW_PKGS): continue
        text = p.read_text()
        new = DOTTED.sub(lambda m: MOVES[m[1]], text)                 # 1st: never matches `from quantbench import`
        new = FROM_PKG.sub(from_pkg, new) if p.suffix == ".py" else new  # 2nd: its output is not re-scanned
        if new != text: p.write_text(new)
py = Path("pyproject.toml")
py.write_text(py.read_text().replace('quantbench = ["data/*.jsonl", "data/*.json"]',
                                     '"quantbench.protocol" = ["data/*.jsonl", "data/*.json"]'))
assert git("hash-object", "quantbench/protocol/suitegen.py") == sg, "suitegen.py changed: fixture_id would change"
