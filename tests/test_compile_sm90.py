"""The grouped-MoE kernels compiled for Hopper (sm_90) without a GPU (benchmarks/compile_sm90.py): at a 512-token
decision the FP8 kernel's dots must stay on the FP8 tensor cores (wgmma; a tile with under 64 rows on the MMA's
M side makes Triton upcast both operands to fp16 mma.sync), and no kernel may spill or lose its pipelined loads."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compiled():
    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("compile_sm90", ROOT / "benchmarks" / "compile_sm90.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compile_sm90"] = mod
    spec.loader.exec_module(mod)
    out = {}
    for fmt, proj, cfg, fn, types, consts, ints_by_16 in mod.kernels(512):
        cfg = dict(cfg)
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        out[fmt, proj] = mod.compile_sm90(fn, types, {**consts, **cfg}, warps, stages, ints_by_16)
    return out


def test_fp8_dots_run_on_the_fp8_tensor_cores(compiled):
    for proj in ("gate_up", "down"):
        r = compiled["fp8", proj]
        assert r["mma"] == "3" and r["wgmma"] > 0 and r["mma_sync"] == 0, (proj, r)


def test_no_kernel_spills_or_loses_its_pipelined_loads(compiled):
    for key, r in compiled.items():
        assert r["spill_bytes"] == 0 and r["async_copies"] > 0, (key, r)
        assert r["registers"] and r["registers"] <= 255, (key, r)


def test_the_gluon_kernels_keep_one_mma_in_flight(compiled):
    """The Gluon kernels' reason to exist: each slice's MMAs run while the next slice is unpacked (in the loop they
    wait for all but one), on wgmma. The Triton int4 kernel waits for every MMA (in flight 0)."""
    for kernel in ("int4 wgmma", "nvfp4 wgmma"):  # and the NVFP4 one, the same pipeline
        for proj in ("gate_up", "down"):
            r = compiled[kernel, proj]
            assert r["mma"] == "3" and r["wgmma"] > 0 and r["mma_sync"] == 0, (kernel, proj, r)
            assert r["in_flight"] == 1, (kernel, proj, r)
