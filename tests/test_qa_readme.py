"""What README.md and `--help` tell a new user matches what the commands do."""

from __future__ import annotations

import typer.main

import quantbench.cli as cli
from quantbench.cli.run import noise_floor_kernel


def _help(command: str, param: str) -> str:
    click_command = typer.main.get_command(cli.app).commands[command]
    return next(p.help for p in click_command.params if p.name == param)


def test_noise_floor_help_says_what_a_cpu_runs():
    # Before: "under the second kernel (eager)", while on a CPU the floor is grouped_mm in float32 (the two experts
    # kernels answer bit-identically there): the help named a kernel the run does not use.
    assert noise_floor_kernel("cpu") == ("grouped_mm", "float32")
    text = _help("run", "noise_floor")
    assert "float32" in text and "CPU" in text
    assert "second kernel (eager)" not in text


def test_fixture_shape_help_names_every_shape_it_builds():
    # Before: "a real shape (qwen3-30b-a3b)", while `fixture --shape qwen3-omni-30b-a3b --out DIR` builds too (README).
    from quantbench.models.families import synthetic_shapes

    text = _help("fixture", "shape")
    assert "qwen3-omni-30b-a3b" in synthetic_shapes()
    for shape in synthetic_shapes():
        assert shape in text
