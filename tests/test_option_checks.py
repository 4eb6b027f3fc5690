"""Every option error of `quantbench run` is refused in the parent, in one line naming the flag, before a child
starts or the store is touched (it used to be a failed run, stored after 11-17 s on this machine)."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.run import machine as machine_mod
from quantbench.run import runner

ONE_H200 = dict(device="cuda:0", gpu_name="NVIDIA H200", gpu_family="hopper", gpu_uuid="GPU-1", gpu_cc="9.0",
                gpu_sm_count=None, gpu_memory_bytes=150 << 30, driver_version="580", cuda_version="13.0")


@pytest.fixture
def no_child(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(runner.subprocess, "Popen", refuse)


@pytest.fixture
def cpu_machine(monkeypatch):
    here = machine_mod.detect()
    cpu = dataclasses.replace(here, device="cpu", gpu_name=None, gpu_family="cpu", gpu_uuid=None, gpu_cc=None,
                              gpu_memory_bytes=None, driver_version=None, cuda_version=None)
    monkeypatch.setattr(machine_mod, "detect", lambda with_torch=False: cpu)
    return cpu


@pytest.fixture
def h200_machine(monkeypatch):
    h200 = dataclasses.replace(machine_mod.detect(), **ONE_H200)
    monkeypatch.setattr(machine_mod, "detect", lambda with_torch=False: h200)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    return h200


def refused(args, tmp_path) -> str:
    db = tmp_path / "r.duckdb"
    done = CliRunner().invoke(app, ["run", *args, "--db", str(db)], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    assert not db.exists(), "nothing is stored for an option error"
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("args, says", [
    (["--device", "cuda:0"], "--device cuda:0: this machine has no GPU that NVML can see"),
    (["--device", "mps"], "--device 'mps': use cpu, cuda or cuda:N"),
    (["--backend", "http"], "--backend http needs --endpoint"),
    (["--backend", "http", "--endpoint", "ftp://x"], "--endpoint 'ftp://x' must start with http:// or https://"),
    (["--dtype", "fp16"], "--dtype 'fp16': use one of bfloat16, float16, float32"),
    (["--method", "logits"], "--method 'logits': use auto or continuation"),
    (["--concurrency", "0"], "--concurrency 0: give 1 or more"),
    (["--limit", "0"], "--limit 0: give 1 or more"),
    (["--warmup", "-1"], "--warmup -1: give 0 or more"),
    (["--latency-min-seconds", "-2"], "--latency-min-seconds -2: give 0 or more seconds"),
    (["--layers", "4"], "--layers sets the layer count of a synthetic --shape model; give --shape too"),
    (["--gpu", "hopper"], "--gpu hopper: this machine has no GPU that NVML can see"),
    (["--timeout", "0"], "--timeout 0: give a positive number of seconds"),
    (["--family", "video"], "--family 'video': use one of text, omni"),
])
def test_an_option_error_on_a_cpu_machine_is_one_line_and_no_run(args, says, tmp_path, no_child, cpu_machine):
    assert says in refused(args, tmp_path)


@pytest.mark.parametrize("args, says", [
    (["--device", "cuda:1"], "--device cuda:1: this machine has 1 GPU visible (cuda:0); give one of them"),
    (["--device", "cpu", "--gpu", "hopper"], "--device cpu with --gpu hopper: the run would be labelled hopper"),
    (["--device", "cuda", "--gpu", "cpu"], "--device cuda with --gpu cpu: the run would be labelled CPU"),
    (["--gpu", "blackwell"], "--gpu blackwell: this machine's GPU is NVIDIA H200 (hopper"),
])
def test_device_and_gpu_are_checked_against_the_gpus_here(args, says, tmp_path, no_child, h200_machine):
    assert says in refused(args, tmp_path)


def test_an_unknown_shape_is_named_with_the_known_ones(tmp_path, no_child, cpu_machine):
    line = refused(["--shape", "qwen3-31b-a3b"], tmp_path)
    assert "--shape 'qwen3-31b-a3b': use one of" in line and "qwen3-30b-a3b" in line


def test_demo_refuses_a_backend_it_does_not_run(tmp_path, no_child):
    done = CliRunner().invoke(app, ["demo", "--only", "int5", "--db", str(tmp_path / "r.duckdb")],
                              env={"COLUMNS": "400"})
    assert done.exit_code == 2 and "--only int5: not a backend of the demo; use bf16, int4, nvfp4, fp8" in done.output
    assert not (tmp_path / "r.duckdb").exists()


@pytest.mark.parametrize("limit", ["0", "-2"])
def test_demo_refuses_a_limit_run_refuses(tmp_path, no_child, limit):
    # before: --limit 0 ran every variant on the whole suite, --limit -2 on all but its last 2 records
    done = CliRunner().invoke(app, ["demo", "--limit", limit, "--db", str(tmp_path / "r.duckdb")],
                              env={"COLUMNS": "400"})
    assert done.exit_code == 2 and f"--limit {limit}: give 1 or more" in done.output, done.output
    assert not (tmp_path / "r.duckdb").exists()
