"""What the command line prints to a file or a pipe: whole table rows, one per line; and `backends` stays quick."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store, transfer

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ("quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope+qkv+residual+qknorm+nextnorm +cuda-graph "
          "(partly eager)")


def quantbench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`quantbench ARGS` with stdout and stderr to pipes, as `quantbench ... | tee log` would see it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "quantbench", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def store_with_long_rows(path: Path) -> Store:
    store = Store(path)
    t0 = dt.datetime(2026, 12, 2, 4, tzinfo=dt.UTC)
    store.write_run(RunResult(run=dict(
        run_id=str(uuid7()), status="ok", created_at=t0, backend="int4", variant="int4", model_id="tiny-moe",
        kernel_path=KERNEL, device="cuda:0", gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        gpu_family="blackwell", host="lab", role="candidate", mem_weights_bytes=17 * 2**30, load_s=13.0)))
    store.write_run(RunResult(run=dict(
        run_id=str(uuid7()), status="failed", failure="load_error", created_at=t0 + dt.timedelta(minutes=1),
        backend="nvfp4", variant="nvfp4-unpacked", device="cpu", host="lab", role="candidate",
        error="LoadError: /nonexistent: no config.json")))
    return store


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_runs_to_a_pipe_prints_every_row_whole_on_one_line(tmp_path):
    store_with_long_rows(tmp_path / "r.duckdb")
    done = quantbench("runs", "--db", str(tmp_path / "r.duckdb"))
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert len(rows) == 2 and "…" not in done.stdout  # one line per run: nothing cut, nothing wrapped
    assert KERNEL in rows[0] and "NVIDIA RTX PRO 6000 Blackwell Server Edition" in rows[0]
    assert "failed: load_error" in rows[1] and "nvfp4-unpacked" in rows[1]


def test_merge_to_a_pipe_prints_each_source_on_one_line(tmp_path):
    deep = tmp_path / "exports from the lab machine" / "2026-12-02"
    deep.mkdir(parents=True)
    transfer.export(store_with_long_rows(tmp_path / "r.duckdb"), deep / "quantbench-lab-20261202-040000.parquet")
    done = quantbench("merge", str(deep), "--db", str(tmp_path / "local.duckdb"))
    assert done.returncode == 0, done.stderr
    assert any(str(deep / "quantbench-lab-20261202-040000.parquet") in row for row in table_rows(done.stdout))
    assert any("NVIDIA RTX PRO 6000 Blackwell Server Edition (lab)" in row for row in table_rows(done.stdout))


def test_backends_answers_without_importing_the_quantization_libraries():
    """Whether auto-round / modelopt are installed is a lookup, not an import (importing auto-round took 9-14 s)."""
    code = ("import sys\nfrom quantbench.cli import app\ntry:\n    app(['backends'], standalone_mode=False)\n"
            "finally:\n    print('IMPORTED', sorted(m for m in ('auto_round', 'modelopt', 'transformers') "
            "if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED []" in done.stdout
    int4 = next(row for row in table_rows(done.stdout) if row.startswith("│ int4"))
    assert "│ yes " in int4 and "native" in int4


def test_compare_to_a_pipe_prints_each_statistic_on_one_line(tmp_path):
    from tests import dashboard_store as ds

    store = ds.build(tmp_path / "r.duckdb")
    int4 = store.read("SELECT CAST(run_id AS VARCHAR) AS id FROM runs WHERE variant = 'int4' AND gpu_family = "
                      "'blackwell'").id.iloc[0]
    done = quantbench("compare", int4[:13], "--db", str(store.path))
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    agreement = next(r for r in rows if "Top-answer agreement (95% Wilson)" in r)
    assert f"({ds.N_QUESTIONS - 13}/{ds.N_QUESTIONS})" in agreement  # 13 flips: the whole cell, same line
    assert any("Flips on gold (ref right → cand wrong / reverse)" in r for r in rows)


def test_a_sweeps_summary_to_a_pipe_prints_every_run_whole(tmp_path, capsys):
    from quantbench.sweep.driver import SweepOutcome, print_summary

    store = store_with_long_rows(tmp_path / "r.duckdb")
    ids = store.read("SELECT CAST(run_id AS VARCHAR) AS id FROM runs ORDER BY created_at").id.tolist()
    print_summary(store, SweepOutcome(planned=2, run_ids=ids, ok=1, failed=1))
    rows = table_rows(capsys.readouterr().out)
    assert KERNEL in rows[0] and "failed: load_error" in rows[1] and "nvfp4-unpacked" in rows[1]
