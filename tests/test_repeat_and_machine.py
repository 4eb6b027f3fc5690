"""Figures made right (issue #35 items 3 and 6): `run --repeat N` stores N fresh runs of one group and the report
prints p50 ± its t interval; each run's peak memory is its own process's (VmHWM), never the launcher's inherited
high-water mark; a run records the machine beyond its host name and how busy it was while timed."""

import os
import re
import resource
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from quantbench import report
from quantbench.analysis import conditions, repeats
from quantbench.run import machine as M
from quantbench.store import Store, queries
from tests.stored import stored_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_repeat_3_stores_three_fresh_runs_their_own_peak_memory_and_a_latency_interval(tmp_path, monkeypatch):
    from quantbench.cli import app

    monkeypatch.setenv("PYTHONPATH", ROOT)  # the children import tests.tiny
    ballast = bytearray(1200 << 20)  # this process (the launcher) peaks past 1.2 GiB ...
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])
    launcher_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    db = tmp_path / "r.duckdb"
    done = CliRunner().invoke(app, ["run", "--backend", "tests.tiny:TinyBackend", "--gpu", "cpu", "--repeat", "3",
                                    "--limit", "3", "--warmup", "0", "--latency-min-decisions", "10",
                                    "--latency-min-seconds", "0", "--db", str(db)])
    assert done.exit_code == 0, done.output
    del ballast
    runs = queries.stored_runs(Store(db))
    assert len(runs) == 3 and len({r.repeat_id for r in runs}) == 1
    assert sorted(r.repeat_index for r in runs) == [1, 2, 3] and {r.repeat_count for r in runs} == {3}
    assert len({r.run_id for r in runs}) == 3  # three runs, each its own process and row
    # ... and every child's peak is its own: far under the launcher's, which ru_maxrss would have reported
    assert launcher_peak > 1200 << 20
    assert {r.host_rss_peak_source for r in runs} == {"vmhwm"}
    peaks = [r.host_rss_peak_bytes for r in runs]
    assert all(p < launcher_peak - (600 << 20) for p in peaks), peaks
    # the repeat's interval: printed at the end, and in the report's latency cell
    out = " ".join(done.output.split())
    assert re.search(r"latency p50 per decision: [\d.]+ ± [\d.]+ ms \(95% t, 3 runs, CV [\d.]+%\)", out), out
    assert "energy per decision: no interval" in out  # a CPU run has no energy counter
    fig = repeats.figures(runs[0].repeat_id, runs)
    assert fig.p50_ms.n == 3 and fig.p50_ms.lo <= fig.p50_ms.mean <= fig.p50_ms.hi
    md = report.report_text(str(db))
    assert re.search(r"\| [\d.,]+ ± [\d.,]+ / [\d.,]+ ms \(3 runs, CV [\d.]+%\)( ⚠ busy)? \|", md), md
    assert "± is the half-width of a 95% t interval over the runs of one `quantbench run --repeat N`" in md
    # the machine beyond its host name, and its load while the run was timed
    row = runs[-1]
    assert row.cpu_cores == os.cpu_count() and row.machine_id == M.machine_id()
    assert row.load_avg_1m >= 0 and 0 <= row.cpu_others_share <= 1 and 0 <= row.cpu_steal_share <= 1


def test_the_load_probe_separates_the_runs_own_cpu_from_other_processes():
    # /proc/stat's cpu line: user nice system idle iowait irq softirq steal (ticks); the run used 2 s = 200 ticks
    ticks = iter([[1000, 0, 200, 5000, 0, 0, 0, 0], [1500, 0, 300, 5300, 0, 0, 0, 100]])
    own = iter([10.0, 12.0])
    probe = M.LoadProbe(stat=lambda: next(ticks), own_cpu_s=lambda: next(own), loadavg=lambda: 3.5, ticks_per_s=100)
    probe.start()
    probe.stop()
    # of 1000 ticks: 300 idle, 100 steal, 600 busy, 200 of them this run's → others 400 / 1000
    assert probe.facts() == pytest.approx({"load_avg_1m": 3.5, "cpu_steal_share": 0.1, "cpu_others_share": 0.4})
    assert "other processes used 40% of the CPUs" in conditions.busy_note(stored_run(**probe.facts(), cpu_cores=2))
    assert "steal" in conditions.busy_note(stored_run(**probe.facts(), cpu_cores=2))
    quiet = stored_run(load_avg_1m=1.1, cpu_steal_share=0.0, cpu_others_share=0.05, cpu_cores=2)
    assert conditions.busy_note(quiet) is None
    assert conditions.busy_note(stored_run()) is None  # an older run recorded nothing: no warning made up


def test_the_machine_id_is_a_hash_of_the_file_never_the_id(tmp_path):
    f = tmp_path / "machine-id"
    f.write_text("0123456789abcdef0123456789abcdef\n")
    mid = M.machine_id((str(f),))
    assert mid and len(mid) == 16 and "0123456789" not in mid
    assert M.machine_id((str(tmp_path / "absent"),)) is None


def test_two_cpu_machines_of_one_host_name_are_two_tables():
    from quantbench.analysis import parity

    idle = stored_run(device="cpu", host="vm", cpu_model="Intel Xeon", cpu_cores=2, machine_id="aa" * 8)
    loaded = replace(idle, cpu_model="AMD EPYC", machine_id="bb" * 8)
    assert parity.gpu_key(idle) != parity.gpu_key(loaded)
    assert parity.gpu_label(idle) == "CPU (vm: Intel Xeon, 2 CPUs, machine aaaaaaaa)"
    older = stored_run(device="cpu", host="vm")  # a row from before: known by what it has
    assert parity.gpu_label(older) == "CPU (vm)"


def test_gpu_floors_from_the_spec_sheet():
    run = stored_run(device="cuda:0", gpu_name="NVIDIA H200")
    f = conditions.floors(run, weights_bytes=int(48e9), p50_ms=20.0, j_per_decision=10.0)
    assert f.latency_floor_ms == pytest.approx(10.0)  # 48 GB / 4.8 TB/s
    assert f.energy_floor_j == pytest.approx(7.0)  # 10 ms at 700 W
    assert (f.latency_fraction, f.energy_fraction) == pytest.approx((0.5, 0.7))
    assert "4.8 TB/s" in f.spec.source
    assert conditions.gpu_spec("NVIDIA H200 NVL").board_w == 600  # the most specific name wins
    assert conditions.floors(stored_run(device="cpu"), 10, 1.0, None) is None
    assert conditions.floors(stored_run(device="cuda:0", gpu_name="Some Future GPU"), 10, 1.0, None) is None
