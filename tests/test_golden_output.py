"""What `quantbench report` and `quantbench runs` print, byte for byte, on a small store built here: CPU and GPU
tables, a noise floor, a variant paired with its base by lineage, a batched run, a repeat group, a busy machine,
an older run without its own peak memory, failed runs (one before its model was known) and a second store read
beside it (the composite reader). The outputs are compared with tests/golden/; a change to what users see must
be deliberate: `QUANTBENCH_UPDATE_GOLDEN=1 pytest tests/test_golden_output.py` rewrites the files, and the diff
shows in review."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.run.record import RunResult
from quantbench.store import Store
from tests.test_report import Lab

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("QUANTBENCH_UPDATE_GOLDEN") == "1"
T0 = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)
MB, GIB = 1_000_000, 1 << 30
H200 = dict(device="cuda:0", gpu_name="NVIDIA H200", gpu_family="hopper", host="gpu-box", gpu_cc="9.0",
            model_tensor_bytes=None, host_rss_peak_bytes=None, host_rss_peak_source=None)


class FixedLab(Lab):
    """Lab with run ids and times fixed by the order of the runs, so every output is the same on every run."""

    def run(self, answers=None, ms=10.0, batch=1, **fields):
        n = self.t + 1
        fields.setdefault("run_id", f"01a2{n:04d}-0000-7000-8000-{n:012d}")
        return super().run(answers, ms, batch, **fields)


def _energy(j: float, w: float, idle: float) -> dict:
    return dict(energy_j_per_decision=j, energy_mean_w=w, energy_phase_s=2.5, energy_decisions=int(2.5 * w / j),
                energy_idle_w=idle)


def build(tmp: Path) -> tuple[Path, Path]:
    """(the store, a second store to read beside it)."""
    lab = FixedLab(tmp / "golden.duckdb", n=40)
    cpu = dict(cpu_model="AMD EPYC 7B13", cpu_cores=2, machine_id="3d1219c7aa55bb66", load_avg_1m=0.4,
               cpu_steal_share=0.0, cpu_others_share=0.02)
    lab.run(ms=14, role="reference", **cpu)
    lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor", variant="float32",
            weight_format="float32", **cpu)
    lab.run(lab.answers(noise=0.04, seed=5), ms=30, backend="int4", variant="int4", weight_format="int4 w4a16 g128",
            kernel_path="quantbench grouped-moe triton-fused-int4", native="native", model_tensor_bytes=20 * MB,
            host_rss_peak_bytes=400 * MB, **{**cpu, "cpu_others_share": 0.4, "load_avg_1m": 3.1})
    lab.run(lab.answers(flatten=0.5), ms=40, backend="nvfp4", variant="nvfp4-packed", weight_format="nvfp4 w4a4 g16",
            kernel_path="quantbench grouped-moe triton-fused-nvfp4", native="emulated", model_tensor_bytes=25 * MB,
            host_rss_peak_bytes=500 * MB, host_rss_peak_source=None, **cpu)
    lab.run(lab.answers(noise=0.02, seed=7), ms=25, backend="fp8", variant="fp8", weight_format="fp8 e4m3",
            kernel_path="quantbench grouped-moe triton-fp8", model_id="acme/tiny-moe-fp8", base_model="tiny-moe",
            base_model_how="model_card", model_tensor_bytes=30 * MB, **cpu)
    lab.run(status="failed", failure="load_error", backend="nvfp4", variant=None, model_id=None, suite_id=None,
            suite_hash=None, error="LoadError: /models/nope: no config.json\n\nTraceback ...")
    gpu = dict(H200, mem_weights_bytes=int(1.2 * GIB), mem_peak_reserved_bytes=int(2 * GIB))
    lab.run(ms=12.5, mem_nvml_peak_bytes=int(2.5 * GIB), **_energy(10.3, 420.0, 130.0), **gpu)
    lab.run(lab.answers(noise=0.05), ms=13, kernel_path="transformers experts=eager", role="noise_floor",
            variant="bf16", **gpu)
    for i in (1, 2):
        lab.run(lab.answers(noise=0.04, seed=5), ms=8 + i, backend="int4", variant="int4",
                weight_format="int4 w4a16 g128", kernel_path="quantbench grouped-moe gluon-wgmma-int4 +cuda-graph",
                native="native", repeat_id="rep-0001", repeat_index=i, repeat_count=2,
                **_energy(7.2 + 0.1 * i, 380.0, 130.0), **{**gpu, "mem_weights_bytes": int(0.4 * GIB)})
    lab.run(lab.answers(noise=0.04, seed=5), ms=40, batch=8, backend="int4", variant="int4",
            weight_format="int4 w4a16 g128", kernel_path="quantbench grouped-moe gluon-wgmma-int4 +cuda-graph",
            native="native", **_energy(6.1, 500.0, 130.0), **{**gpu, "mem_weights_bytes": int(0.4 * GIB)})
    lab.run(status="failed", failure="oom", backend="nvfp4", variant="nvfp4-unpacked", weight_format="nvfp4 w4a4 g16",
            error="torch.OutOfMemoryError: CUDA out of memory", **gpu)

    beside = Store(tmp / "shipped.duckdb")
    beside.write_run(RunResult(dict(
        run_id="01a20099-0000-7000-8000-000000000099", status="ok", created_at=T0 + dt.timedelta(hours=5),
        backend="bf16", variant="bf16", weight_format="bfloat16", kernel_path="transformers experts=grouped_mm",
        model_id="tiny-moe", weights="trained", suite_id="builtin", suite_hash="s1", tokenizer_hash="t1",
        device="cpu", gpu_family="cpu", host="lab2", role="candidate", model_tensor_bytes=50 * MB,
        host_rss_peak_bytes=800 * MB, host_rss_peak_source="vmhwm"), lab.answers(), []))
    return lab.store.path, beside.path


COMMANDS = {
    "report.md": ["report", "--db", "{db}", "--gpu", "all"],
    "report.json": ["report", "--db", "{db}", "--gpu", "all", "--format", "json"],
    "report.csv": ["report", "--db", "{db}", "--gpu", "all", "--format", "csv"],
    "report-all-priced.md": ["report", "--db", "{db}", "--gpu", "all", "--all", "--price-per-gpu-hour", "3.5",
                             "--margin", "mlperf99"],
    "report-shared.md": ["report", "--db", "{db}", "--gpu", "cpu", "--shared"],
    "runs.txt": ["runs", "--db", "{db}", "--last", "0"],
    "runs.json": ["runs", "--db", "{db}", "--format", "json"],
    "runs.csv": ["runs", "--db", "{db}", "--format", "csv"],
    "runs-shared.txt": ["runs", "--db", "{db}", "--shared", "--status", "ok"],
    "runs-shared.json": ["runs", "--db", "{db}", "--shared", "--format", "json", "--gpu", "cpu"],
}


@pytest.fixture(scope="module")
def stores():
    """The stores, in a folder whose path has the same length on every machine and pytest-xdist worker: the runs
    table pads its title (which names the store) to the table's width, so a longer path changes the padding."""
    folder = Path(tempfile.mkdtemp(prefix="qb-golden-", dir="/tmp"))  # /tmp/qb-golden-XXXXXXXX
    yield build(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_report_and_runs_print_what_they_printed_before(name, stores, tmp_path, monkeypatch):
    db, shipped = stores
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))  # empty: no pulled bundles
    monkeypatch.setenv("QUANTBENCH_SHIPPED", str(shipped))
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    done = CliRunner().invoke(app, [a.format(db=db) for a in COMMANDS[name]])
    assert done.exit_code == 0, done.output
    text = done.stdout.replace(str(db.parent), "<tmp>")
    golden = GOLDEN / name
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert same_output(name, text, golden.read_text()), \
        f"{name}: the output changed (QUANTBENCH_UPDATE_GOLDEN=1 rewrites it)"


def same_output(name: str, text: str, golden: str) -> bool:
    """Byte for byte, except the full-precision floats of the JSON and CSV formats, which may move in their last
    bits with the numerical libraries' versions (numpy 2.4.6's percentiles and sums differ from 2.3's in the 16th
    digit): those compare as numbers, within 1e-12 relative; everything else in them (keys, order, strings,
    integers, the rounded figures of the tables) must be the same."""
    if text == golden:
        return True
    if name.endswith(".json"):
        return _close(json.loads(text), json.loads(golden))
    if name.endswith(".csv"):
        return _close(list(csv.reader(io.StringIO(text))), list(csv.reader(io.StringIO(golden))))
    return False


def _close(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str) and a != b:
        try:
            a, b = float(a), float(b)
        except ValueError:
            return False
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_same_output_forgives_the_last_bits_of_a_float_and_nothing_else():
    assert same_output("r.json", '{"a": 0.030293524968714666}', '{"a": 0.030293524968714673}')
    assert not same_output("r.json", '{"a": 0.0302935}', '{"a": 0.0302936}')
    assert not same_output("r.json", '{"a": 1, "b": 2}', '{"b": 2, "a": 1}')  # the order is output too
    assert not same_output("r.json", '{"a": 1}', '{"a": 1.0}')  # an int that became a float
    assert same_output("r.csv", "x,y\nint4,0.0310286919115315\n", "x,y\nint4,0.031028691911531514\n")
    assert not same_output("r.csv", "x,y\nint4,0.03\n", "x,y\nfp8,0.03\n")
    assert not same_output("r.txt", "0.030293524968714666", "0.030293524968714673")
