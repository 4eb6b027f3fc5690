"""Wall time of `quantbench <command>` in a fresh process, per command, and which heavy libraries each one imports
(from `python -X importtime`): what a user waits for before a command answers or refuses.

    python benchmarks/cli_startup.py [--db results.duckdb] [--repeat 5] [--root CHECKOUT]

Works on a copy of the store (`--db`, default results.duckdb) in a temporary folder: `report` and `compare` read it,
`merge` merges an export of it into a store that already holds it (nothing new: the command's start-up and its
checks), `run` is refused at once for a store that is not a DuckDB file (tests/test_store.py's case). Prints one
markdown row per command: median / min / max of --repeat runs, the load average before and after, and the heavy
libraries the command imported. `--root` times another checkout of quantbench (e.g. main, for a before/after).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "triton", "pandas", "numpy", "scipy", "duckdb", "pyarrow", "streamlit", "plotly",
         "pydantic", "rich.table", "httpx", "fastapi")


def quantbench(args: list[str], env: dict[str, str], *, importtime: bool = False) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "quantbench", *args], capture_output=True, text=True,
                          cwd=env["PYTHONPATH"], env=env)


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    """The libraries of HEAVY that the command imported, with their cumulative import time in ms."""
    done = quantbench(args, env, importtime=True)
    cumulative: dict[str, int] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = line.split("|")
        name = name.strip()
        if name in HEAVY and cum.strip().isdigit():
            cumulative[name] = max(cumulative.get(name, 0), int(cum))
    return [f"{name} {cumulative[name] / 1000:.0f}" for name in HEAVY if name in cumulative]


def compare_run(db: Path) -> str:
    """A CPU int4 run of the embedded fixture (it has a BF16 reference in the store)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT CAST(run_id AS VARCHAR) FROM runs WHERE variant = 'int4' AND status = 'ok' AND "
                          "gpu_family = 'cpu' AND model_id LIKE 'quantbench-fixture-moe-%' "
                          "ORDER BY created_at DESC LIMIT 1").fetchone()
    finally:
        con.close()
    if row is None:
        sys.exit(f"{db}: no CPU int4 run of the embedded fixture to compare")
    return row[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=ROOT / "results.duckdb")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--root", type=Path, default=ROOT, help="the quantbench checkout to time")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve()), "QUANTBENCH_DB": "/nonexistent/unused.duckdb"}
    with tempfile.TemporaryDirectory(prefix="quantbench-cli-startup-") as tmp:
        tmp = Path(tmp)
        db = tmp / "results.duckdb"
        shutil.copy(args.db, db)
        exported = tmp / "results.parquet"
        done = quantbench(["export", "--out", str(exported), "--db", str(db)], env)
        if done.returncode:
            sys.exit(done.stderr)
        merged = tmp / "merged.duckdb"
        quantbench(["merge", str(exported), "--db", str(merged)], env)  # the timed merges then add nothing
        bad = tmp / "bad.duckdb"
        bad.write_text("not a DuckDB file\n" * 100)
        commands = {
            "--help": ["--help"],
            "run --help": ["run", "--help"],
            "run (a bad --db: refused)": ["run", "--gpu", "cpu", "--db", str(bad)],
            "report": ["report", "--db", str(db)],
            "compare RUN": ["compare", compare_run(db), "--db", str(db)],
            "merge (nothing new)": ["merge", str(exported), "--db", str(merged)],
            "runs": ["runs", "--db", str(db)],
        }
        load_before = os.getloadavg()
        print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", file=sys.stderr)
        print("| command | median s | min s | max s | exit | heavy imports (cumulative import ms) |")
        print("|---|---|---|---|---|---|")
        for label, argv in commands.items():
            times, code = [], None
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                code = quantbench(argv, env).returncode
                times.append(time.perf_counter() - t0)
            heavy = ", ".join(heavy_imports(argv, env)) or "none"
            print(f"| `{label}` | {statistics.median(times):.2f} | {min(times):.2f} | {max(times):.2f} | {code} | "
                  f"{heavy} |", flush=True)
        load_after = os.getloadavg()
        print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
