"""The grouped-MoE kernels compiled for Hopper (sm_90) without a GPU (benchmarks/compile_sm90.py): at a 512-token
decision the FP8 kernel's dots must stay on the FP8 tensor cores (wgmma; a tile with under 64 rows on the MMA's
M side makes Triton upcast both operands to fp16 mma.sync), and no kernel may spill or lose its pipelined loads."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    """benchmarks/compile_sm90.py as a module."""
    pytest.importorskip("triton")
    spec = importlib.util.spec_from_file_location("compile_sm90", ROOT / "benchmarks" / "compile_sm90.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["compile_sm90"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def compiled(tool):
    out = {}
    for fmt, proj, cfg, fn, types, consts, ints_by_16 in tool.kernels(512):
        cfg = dict(cfg)
        warps, stages, maxnreg = cfg.pop("num_warps"), cfg.pop("num_stages"), cfg.pop("maxnreg", None)
        out[fmt, proj] = dict(tool.compile_sm90(fn, types, {**consts, **cfg}, warps, stages, ints_by_16, maxnreg),
                              maxnreg=maxnreg)
    return out


def test_fp8_dots_run_on_the_fp8_tensor_cores(compiled):
    for proj in ("gate_up", "down"):
        r = compiled["fp8", proj]
        assert r["mma"] == "3" and r["wgmma"] > 0 and r["mma_sync"] == 0, (proj, r)


def test_no_kernel_spills_or_loses_its_pipelined_loads(compiled):
    for key, r in compiled.items():
        assert r["loop_spills"] == 0 and r["async_copies"] > 0, (key, r)
        # a register cap may leave a few bytes stored around a loop (the INT4 mid tile: 8), none without one
        assert r["spill_bytes"] <= (16 if r["maxnreg"] else 0), (key, r)
        assert r["registers"] and r["registers"] <= (r["maxnreg"] or 255), (key, r)


def test_the_gluon_kernels_keep_one_mma_in_flight(compiled):
    """The Gluon kernels' reason to exist: each slice's MMAs run while the next slice is unpacked (in the loop they
    wait for all but one), on wgmma. The Triton int4 kernel waits for every MMA (in flight 0)."""
    for kernel in ("int4 wgmma", "nvfp4 wgmma"):  # and the NVFP4 one, the same pipeline
        for proj in ("gate_up", "down"):
            r = compiled[kernel, proj]
            assert r["mma"] == "3" and r["wgmma"] > 0 and r["mma_sync"] == 0, (kernel, proj, r)
            assert r["in_flight"] == 1, (kernel, proj, r)


def test_the_grouped_kernels_wait_before_touching_memory(compiled):
    """Launched with PDL on Hopper (quantbench.engine.pdl), a kernel starts while the one before it still runs: its wait
    (SASS ACQBULK) must come before its first global load, store or atomic, and the next kernel's launch after."""
    for key, r in compiled.items():
        assert r["pdl"] == "first", (key, r["pdl"])


def _small_kernels():
    """The other kernels a decision runs (norms, rotary, routing, grouping, activation codes, dequantize), with
    pointer types and constexprs at the 30B shape."""
    from quantbench.engine.fused import ops as fused_ops
    from quantbench.engine.moe import align, fp8, int4_kernels, nvfp4, routing

    b16, i32, i64, f32 = "*bf16", "*i32", "*i64", "fp32"
    norm, rope = fused_ops._kernels()
    route, sum_slots, sum_slots_norm = routing._kernels()
    count, place, group = align._kernels()
    yield norm, dict(x_ptr=b16, r_ptr=b16, sum_ptr=b16, w_ptr=b16, y_ptr=b16, eps=f32), dict(
        H=1, N=2048, N_P2=2048, BLOCK_R=2, IS_BF16=True, RESIDUAL=True)
    yield rope, dict(q_ptr=b16, k_ptr=b16, cos_ptr=b16, sin_ptr=b16, qo_ptr=b16, ko_ptr=b16, qw_ptr=b16, kw_ptr=b16,
                     eps_q=f32, eps_k=f32), dict(HQ=32, HQ_P2=32, HK=4, HK_P2=4, HALF=64, IS_BF16=True, NORM=True)
    yield route, dict(logits_ptr=b16, value_ptr=b16, index_ptr=i64), dict(
        E=128, K=8, K_P2=8, NORM=True, LANES=32, ITERS=4, BLOCK_T=4, INTERPRET=False)
    yield sum_slots, dict(w_ptr=b16, r_ptr=b16, out_ptr=b16), dict(K=8, BLOCK_H=1024, RESIDUAL=True)
    yield sum_slots_norm, dict(w_ptr=b16, r_ptr=b16, out_ptr=b16, nw_ptr=b16, y_ptr=b16, eps=f32), dict(
        H=2048, H_P2=2048, K=8, BLOCK_T=2)
    yield count, dict(ids_ptr=i64, counts_ptr=i32), dict(BLOCK=1024)
    pairs = dict(ids_ptr=i64, w_ptr=b16, offs_ptr=i32, row_token_ptr=i32, row_scale_ptr=b16, row_pair_ptr=i32,
                 pair_row_ptr=i32)
    yield place, dict(pairs, counts_ptr=i32, cursor_ptr=i32), dict(TOP_K=8, BLOCK=1024)
    yield group, pairs, dict(E=128, E_P2=128, TOP_K=8, BLOCK=64, SCAN=1024, CHUNKS=4)
    yield nvfp4.nvfp4_act_quant_kernel, dict(x_ptr=b16, y_ptr=b16, gs_ptr="*fp32", offs_ptr=i32), dict(
        K=2048, PER_EXPERT=True, E=128, E_P2=128, BLOCK_R=16, BLOCK_C=128)
    yield fp8.fp8_codes_kernel, dict(x_ptr=b16, in_ptr="*fp32", y_ptr="*fp8e4nv"), dict(K=2048, BLOCK_R=16,
                                                                                        BLOCK_C=256)
    yield int4_kernels._dequant_kernel(), dict(qw_ptr=i32, s_ptr="*fp16", z_ptr="*u8", out_ptr=b16), dict(
        SUB=16, G=128, BLOCK_W=16, BLOCK_N=128)


def test_every_other_kernel_waits_before_touching_memory(tool):
    seen = 0
    for fn, types, consts in _small_kernels():
        assert "PDL" in fn.arg_names, fn.__name__
        r = tool.compile_sm90(fn, types, consts, 4, 1)
        assert r["pdl"] == "first", (fn.__name__, r["pdl"])
        seen += 1
    assert seen == 11


def test_the_w4a8_kernel_multiplies_integers(compiled):
    """W4A8's reason to exist: its MMAs take the int4 codes and the int8 activation codes as they are (wgmma
    s32.s8.s8, twice the bf16 rate), with no float MMA left."""
    for proj in ("gate_up", "down"):
        r = compiled["int4 w4a8", proj]
        assert r["int8_mma"] > 0 and r["int8_mma"] == r["wgmma"] and r["mma_sync"] == 0, (proj, r)


def test_the_nvfp4_scale_ring_frees_gate_ups_shared_memory_and_leaves_down_alone(tool):
    """nvfp4_wgmma's option RING: gate_up's scales in a ring of two blocks instead of its 32 KB table (two programs
    an SM at 80 KB with DRAIN; three fit at 52 KB), no spill, the same MMAs; down (a 16 KB table: three programs
    already) compiles to the same SASS with the option as without, and so does every plan that leaves it off."""
    from quantbench.engine.moe import nvfp4_wgmma

    def build(proj: str, **options) -> dict:
        n, k = tool.SHAPES[proj]
        consts = {**dict(K=k, **tool.FEATURES[proj], E=tool.E, E_P2=tool.E),
                  **tool.gluon_constexprs({"BLOCK_M": 64, "BLOCK_N": 128, "AHEAD": 1, "SMALL_M": 16, "MID_M": 32,
                                           "DRAIN": 1, **options}, "nvfp4")}
        types = dict(x_ptr="*bf16", pw_ptr="*i32", bs_ptr="*fp8e4nv", gs_ptr="*fp32", y_ptr="*bf16",
                     rowidx_ptr="*i32", rowscale_ptr="*bf16", rowdest_ptr="*i32", offs_ptr="*i32")
        return tool.compile_sm90(nvfp4_wgmma._kernel(), types, consts, 4, 1, ("N_OUT", "HALF"))

    plain, ring = build("gate_up"), build("gate_up", RING=2)
    assert plain["shared_kb"] == 80.0 and ring["shared_kb"] <= 56.0, (plain, ring)
    assert ring["loop_spills"] == 0 and ring["spill_bytes"] == 0 and ring["registers"] <= 170, ring
    assert (ring["wgmma"], ring["in_flight"], ring["async_copies"]) == (plain["wgmma"], 1, plain["async_copies"])
    assert build("down", RING=2)["sass_sha256"] == build("down")["sass_sha256"]
