"""NVFP4 expert weights, exactly as NVIDIA ModelOpt defines them, stacked per layer.

NVFP4 is W4A4: weights and activations are both FP4 E2M1 values in blocks of 16 along K, each block with an FP8
E4M3 scale, times one FP32 scale per tensor (the two-level scale). For one projection of E experts with K inputs
and N outputs (gate_up: gate rows then up rows, as transformers fuses them):

    packed       uint8   [E, N, K/2]   two E2M1 codes per byte: element 2j in the low nibble, 2j+1 in the high
    block_scale  float8  [E, N, K/16]  E4M3, one per 16 elements
    global_scale float32 [E, N]        ModelOpt's `weight_scale_2`, one per row (gate and up may differ)
    input_scale  float32 [E]           the activation's per-tensor scale (amax / (6 · 448)), or absent

    code = sign << 3 | idx,  idx -> {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    W[e, n, k] = e2m1(code) · (block_scale[e, n, k // 16] · global_scale[e, n])     (in float32, then cast)

The number format itself (codes, scales, `quantize`, `dequantize`, `fake_quantize_activations`, all ModelOpt's
bit for bit) is quantbench.engine.moe.nvfp4_numbers; this file holds the weight format built on it and its kernels.
On CUDA, `grouped_mm` is a grouped GEMM that decodes the codes in registers inside the K loop (Gluon on sm_90,
nvfp4_wgmma.py; Triton elsewhere): the experts stay packed in memory (4.5 bits per weight) and no BF16 copy of them
is ever written. For the Gluon kernel the codes are rewritten in place, once, at its first call, into the order it
reads (`nvfp4_wgmma.repack`; `Nvfp4Experts.layout` says which, and `dequantize` reads either).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from quantbench.engine import pdl
from quantbench.engine.moe import gluon_common, nvfp4_wgmma
from quantbench.engine.moe.engine import DenseExperts, ExpertsBase, stored_nbytes
from quantbench.engine.moe.nvfp4_numbers import BLOCK, dequantize, fake_quantize_activations, quantize
from quantbench.engine.triton_common import (
    expert_of_rows,
    launch_grouped,
    rows_bucket,
    tl,
    triton,
    triton_available,
)
from quantbench.errors import LoadError

if triton is not None:  # the jitted helpers this file's kernels call (Triton resolves them in these globals)
    from quantbench.engine.triton_common import (
        accumulator,
        expert_tile,
        fused_epilogue,
        mma_nt,
        pdl_open,
        round_bf16,
        tile_rows,
    )

FUSED_KERNEL = "triton-fused-nvfp4"
_DEQUANT_CHUNK = 1 << 24  # elements per dequantize chunk: bounds the float32 scratch to 64 MiB


def quantize_input_rows(x: Tensor, offsets: Tensor | None, input_scale: Tensor) -> Tensor:
    """Fake-quantize rows sorted by expert with their expert's input scale (one scale for all when they are
    equal). On CUDA (compute capability >= 8.9) one fused Triton pass, elsewhere the torch definition."""
    per_expert = input_scale.numel() > 1
    if fused_act_quant_ok(x):
        return fake_quantize_activations_fused(x, input_scale, offsets if per_expert else None)
    if not per_expert:
        return fake_quantize_activations(x, input_scale)
    return fake_quantize_activations(x, input_scale[expert_of_rows(offsets, x.shape[0])])


# -- the ExpertWeights format -----------------------------------------------------------------------------------------
class Nvfp4Experts(ExpertsBase):
    """One projection of all E experts of a layer in packed NVFP4, as buffers (see the module docstring)."""

    fused_kernel = FUSED_KERNEL
    fused_features = frozenset({"gather", "swiglu", "row_scale", "scatter"})

    def __init__(self, packed: Tensor, block_scale: Tensor, global_scale: Tensor, input_scale: Tensor | None = None,
                 *, activations: bool = True, name: str = ""):
        super().__init__()
        e, n, k2 = packed.shape
        k = 2 * k2
        checks = (("packed", packed, torch.uint8, (e, n, k2)),
                  ("block_scale", block_scale, torch.float8_e4m3fn, (e, n, k // BLOCK)),
                  ("global_scale", global_scale, torch.float32, (e, n)))
        for tname, t, dtype, shape in checks:
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise LoadError(f"{name}.{tname}: {t.dtype} {tuple(t.shape)}, expected {dtype} {shape} for NVFP4 "
                                f"weights of {e} experts x [{n}, {k}] (K must be a multiple of {BLOCK})")
        self.register_buffer("packed", packed.contiguous())
        self.register_buffer("block_scale", block_scale.contiguous())
        self.register_buffer("global_scale", global_scale.contiguous())
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(-1).contiguous())
        self.num_experts, self.out_features, self.in_features = e, n, k
        self.activations = activations and input_scale is not None
        self.format = "nvfp4"
        self.ran_kernel: str | None = None  # the kernel the last grouped_mm ran (nvfp4_wgmma or this file's)
        # "modelopt" (as stored) or "wgmma": repacked in place for the Gluon kernel at its first call
        self.layout = "modelopt"

    @classmethod
    def from_weights(cls, weight: Tensor, *, input_scale: Tensor | None = None, activations: bool = True) -> Nvfp4Experts:
        """Quantize stacked weights [E, N, K] as ModelOpt would (one global scale per expert)."""
        packed, block_scale, gs = quantize(weight)
        return cls(packed, block_scale, gs.reshape(-1, 1).expand(-1, weight.shape[1]).contiguous(), input_scale,
                   activations=activations)

    # -- the ExpertWeights contract ------------------------------------------------------------------------------
    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None) -> Tensor:
        packed, bs, gs = self.packed, self.block_scale, self.global_scale
        if experts is not None:
            packed, bs, gs = packed[experts], bs[experts], gs[experts]
        out = torch.empty(packed.shape[0], self.out_features, self.in_features, dtype=dtype, device=packed.device)
        step = max(1, _DEQUANT_CHUNK // max(1, self.out_features * self.in_features))
        for i in range(0, packed.shape[0], step):
            chunk = packed[i : i + step]
            chunk = nvfp4_wgmma.unpack(chunk) if self.layout == "wgmma" else chunk
            out[i : i + step] = dequantize(chunk, bs[i : i + step], gs[i : i + step], dtype)
        return out

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        """The A4 of W4A4: the activations entering this projection, fake-quantized as ModelOpt does."""
        if not self.activations:
            return x_sorted
        return quantize_input_rows(x_sorted, offsets, self.input_scale)

    @property
    def input_quant_rowwise(self) -> bool:
        """Each row's activation quantization depends on that row alone (one input scale for every expert), so
        the engine may quantize the tokens before they are gathered and routed (8x fewer rows at top-8)."""
        return not self.activations or self.input_scale.numel() == 1

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str, *, row_index: Tensor | None = None,
                   act: str | None = None, row_scale: Tensor | None = None,
                   row_dest: Tensor | None = None) -> Tensor | None:
        """The fused kernel, with the engine's fused steps (row_index / act / row_scale / row_dest, see its
        contract) when asked; x already quantized where this format quantizes activations."""
        if not (x_sorted.is_cuda and x_sorted.dtype in (torch.bfloat16, torch.float16) and triton_available()):
            return None
        if act not in (None, "swiglu"):
            return None
        rows = x_sorted.shape[0] if row_index is None else row_index.shape[0]
        config = pick_config(rows, self.num_experts, self.out_features, self.in_features, x_sorted.device)
        gluon = config.get("KERNEL") == "gluon"
        if gluon != (self.layout == "wgmma"):
            self._relayout("wgmma" if gluon else "modelopt")
        self.ran_kernel = gluon_common.kernel_name(nvfp4_wgmma.KERNEL, config) if gluon else FUSED_KERNEL  # per run
        return nvfp4_grouped_mm(x_sorted, self.packed, self.block_scale, self.global_scale, offsets, config,
                                row_index=row_index, swiglu=act == "swiglu", row_scale=row_scale, row_dest=row_dest,
                                layout=self.layout)

    @torch.no_grad()
    def _relayout(self, layout: str) -> None:
        """The codes rewritten in place into `layout` (same bytes of memory): once, at the first call of the
        Gluon kernel, which is never inside a CUDA graph's capture (the engine runs a forward before capturing)."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("nvfp4: the codes' layout would change inside a CUDA graph capture; run one forward "
                               "outside the capture first")
        convert = nvfp4_wgmma.repack if layout == "wgmma" else nvfp4_wgmma.unpack
        self.packed.copy_(convert(self.packed))
        self.layout = layout

    def unpacked(self, dtype: torch.dtype) -> Nvfp4UnpackedExperts:
        """The same weights dequantized once (what `--nvfp4 unpacked` keeps: BF16-sized)."""
        return Nvfp4UnpackedExperts(self.dequantize(dtype), self.input_scale, activations=self.activations)

    def extra_repr(self) -> str:
        acts = "w4a4" if self.activations else "w4a16"
        return f"nvfp4 {acts}, experts={self.num_experts}, out={self.out_features}, in={self.in_features}"


class Nvfp4UnpackedExperts(DenseExperts):
    """NVFP4 weights dequantized at load (BF16-sized in memory); activations still fake-quantized when on."""

    def __init__(self, weight: Tensor, input_scale: Tensor | None, *, activations: bool = True):
        super().__init__(weight)
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(-1))
        self.activations = activations and input_scale is not None
        self.format = "nvfp4-unpacked"

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        if not self.activations:
            return x_sorted
        return quantize_input_rows(x_sorted, offsets, self.input_scale)


# -- dense layers (a full, not experts-only, variant quantizes attention too) ---------------------------------------
class Nvfp4Linear(nn.Module):
    """A quantized nn.Linear: packed NVFP4 (dequantized per call) or unpacked; input fake-quantized when on."""

    def __init__(self, packed: Tensor, block_scale: Tensor, global_scale: Tensor, input_scale: Tensor | None,
                 bias: Tensor | None, *, activations: bool, unpacked_dtype: torch.dtype | None = None):
        super().__init__()
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        gs = global_scale.float().reshape(-1)
        gs = gs.expand(self.out_features) if gs.numel() == 1 else gs
        if unpacked_dtype is None:
            self.register_buffer("packed", packed.contiguous())
            self.register_buffer("block_scale", block_scale.contiguous())
            self.register_buffer("global_scale", gs.contiguous())
            self.register_buffer("weight_unpacked", None)
        else:
            self.register_buffer("weight_unpacked", dequantize(packed, block_scale, gs, unpacked_dtype))
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        self.register_buffer("bias", bias)
        self.activations = activations and input_scale is not None

    def weight_as(self, dtype: torch.dtype) -> Tensor:
        if self.weight_unpacked is not None:
            return self.weight_unpacked.to(dtype)
        return dequantize(self.packed, self.block_scale, self.global_scale, dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.activations:
            x = fake_quantize_activations(x, self.input_scale)
        return nn.functional.linear(x, self.weight_as(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        kind = "unpacked" if self.weight_unpacked is not None else "packed"
        return f"nvfp4 {kind}, in={self.in_features}, out={self.out_features}, activations={self.activations}"


# -- the fused Triton kernel ------------------------------------------------------------------------------------------
# The Gluon kernel's tiles (nvfp4_wgmma: BLOCK_N weight rows, gate and up stacked for SwiGLU, x BLOCK_M tokens,
# one warpgroup, AHEAD blocks of 128 columns copied ahead) per rows-per-expert bucket, as int4_kernels.WGMMA_TILES.
# mid: a 16- / 32-token tile for experts with at most 16 / 32 rows (gluon_common.tile_map; bit-identical), on the
# model's routing 2.634 against 2.671 ms for 8 layers and 110.5 / 67.9 against 117.0 / 70.5 us per layer
# (benchmarks/tile_plans.py, H200, 2026-12-03); at batch 8 no faster (12.87 against 12.82 ms), so large keeps one size.
# short-k: mid and large below gluon_common.PLAN_MIN_K inputs (the fixture, K 256) keep one tile size, as INT4.
# DRAIN (mid, large): two stages of tokens and words instead of three (80 / 64 KB of shared memory: down fits three
# programs an SM), waiting for the block before's last MMA at each block's start: down 70.5 -> 56.4 us a layer at
# batch 1, 362.8 -> 330.6 at batch 8, bits identical. RING 2 (mid): gate_up's block scales in a ring of two blocks
# instead of a 32 KB table (52 KB: three programs an SM instead of two): gate_up 110.4 -> 107.0 us, 8 layers 2.537 ->
# 2.470 ms, the 48-layer decision 13.4 -> 12.5 ms p50 (`quantbench run`, same call), bits identical. At 16
# decisions a pass DRAIN 1,835 -> 1,773 us a layer and RING no further (1,765; the 8-layer graph 23.81 against
# 23.89 ms), so large takes DRAIN only (benchmarks/tile_probe.sh, H200, 2026-12-04).
WGMMA_TILES: dict[str, dict[str, Any]] = {
    "small": dict(BLOCK_M=16, BLOCK_N=128, AHEAD=1),
    "mid": dict(BLOCK_M=64, BLOCK_N=128, AHEAD=1, DRAIN=1, RING=2, SMALL_M=16, MID_M=32),
    "large": dict(BLOCK_M=64, BLOCK_N=128, AHEAD=1, DRAIN=1),
    "short-k": dict(BLOCK_M=64, BLOCK_N=128, AHEAD=1),
}


def pick_config(rows: int, experts: int, n: int, k: int, device: torch.device | None = None) -> dict[str, Any]:
    """Block sizes. On an sm_90 `device`: the Gluon kernel's tile (nvfp4_wgmma) for the rows per expert
    (rows_bucket: small up to 12, mid up to 48). Otherwise this file's Triton kernel, measured on an H200 at the Qwen3-30B-A3B layer
    shape (512 tokens top-8, about 32 rows per expert; benchmarks/nvfp4_fp8_gpu.py, 2026-11-29): M64 N128 K128,
    8 warps, 3 stages: gate_up 0.288 ms, down 0.156 ms, against 0.385 / 0.210 ms for M32 N64 K128 with 4 warps.
    BLOCK_K is a multiple of the 16-element scale block and divides K. With the fused steps (2026-11-30,
    `benchmarks/kernel_sweep.py --formats nvfp4`, 512 tokens): gate_up + gather + SwiGLU 300.6 us with the
    weights on the wgmma M side (SWAP_AB, M64 N64, 4 warps, 2 stages) against 354.2 us for the tile above; down +
    routing weights + scatter 158.8 / 159.5 us, no better.)"""
    bucket = rows_bucket(rows, experts)
    if device is not None and nvfp4_wgmma.available(device, k):
        return dict(gluon_common.tiles_for("nvfp4", gluon_common.plan_bucket(bucket, k), WGMMA_TILES),
                    KERNEL="gluon")
    block_k = 128 if k % 128 == 0 else 64 if k % 64 == 0 else 32 if k % 32 == 0 else 16
    if (n, k) == (1536, 2048) and bucket != "large":  # gate_up, gather + SwiGLU: 300.6 against 354.2 us
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2, "SWAP_AB": True}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": block_k, "num_warps": 8, "num_stages": 3, "SWAP_AB": False}


def fused_act_quant_ok(x: Tensor) -> bool:
    """The fused activation fake-quant: CUDA with FP8 conversions in hardware (8.9+), Triton, K in 16-blocks."""
    return (x.is_cuda and triton_available() and x.shape[-1] % BLOCK == 0
            and torch.cuda.get_device_capability(x.device) >= (8, 9))


def fake_quantize_activations_fused(x: Tensor, input_scale: Tensor, offsets: Tensor | None = None) -> Tensor:
    """fake_quantize_activations in one Triton pass; `offsets` given: rows sorted by expert, scale per expert."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    if not rows.is_contiguous():
        rows = rows.contiguous()
    y = torch.empty_like(rows)
    s, k = rows.shape
    if s == 0:
        return y.reshape(shape)
    per_expert = offsets is not None
    e = offsets.numel() if per_expert else 1
    block_c = 128 if k % 128 == 0 else 64 if k % 64 == 0 else 32 if k % 32 == 0 else 16
    grid = (triton.cdiv(s, 16), triton.cdiv(k, block_c))
    nvfp4_act_quant_kernel[grid](
        rows, y, input_scale, offsets if per_expert else input_scale, s, rows.stride(0), y.stride(0),
        K=k, PER_EXPERT=per_expert, E=e, E_P2=triton.next_power_of_2(e), BLOCK_R=16, BLOCK_C=block_c,
        **pdl.launch_args(rows.device),
    )
    return y.reshape(shape)


if triton is not None:
    @triton.jit
    def e2m1_round(a):
        """|x| / scale -> the nearest E2M1 magnitude (ModelOpt's fp4_round_magnitude, ties to even)."""
        return tl.where(a <= 0.25, 0.0, tl.where(a < 0.75, 0.5, tl.where(a <= 1.25, 1.0, tl.where(
            a < 1.75, 1.5, tl.where(a <= 2.5, 2.0, tl.where(a < 3.5, 3.0, tl.where(a <= 5.0, 4.0, 6.0)))))))

    @triton.jit
    def nvfp4_act_quant_kernel(
        x_ptr, y_ptr, gs_ptr, offs_ptr, S, stride_x, stride_y,
        K: tl.constexpr, PER_EXPERT: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
    ):
        """ModelOpt's fp4_fake_quant_block, op for op, with a global scale per row's expert when PER_EXPERT."""
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (rows < S)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        if PER_EXPERT:
            eidx = tl.arange(0, E_P2)
            ends = tl.load(offs_ptr + eidx, mask=eidx < E, other=2147483647)
            expert = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), 1)
            gs = tl.load(gs_ptr + tl.minimum(expert, E - 1))
        else:
            gs = tl.load(gs_ptr + tl.zeros((BLOCK_R,), dtype=tl.int32))
        gs = tl.where(gs > 0.0, gs, 1e-12)[:, None, None]
        xb = tl.reshape(x, (BLOCK_R, BLOCK_C // 16, 16))
        amax = tl.max(tl.abs(xb), axis=2, keep_dims=True)
        scale = tl.minimum(amax / (6.0 * gs), 448.0).to(tl.float8e4nv).to(tl.float32) * gs
        scale = tl.where(scale >= 1e-5, scale, 1.0)
        q = e2m1_round(tl.abs(xb) / scale) * scale
        q = tl.reshape(tl.where(xb >= 0, q, -q), (BLOCK_R, BLOCK_C))
        tl.store(y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :], q.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def decode_e2m1_f32(codes):
        """E2M1 codes -> float32 values times 2^-14: float16 bits with the sign at bit 15 and the 3-bit magnitude
        code at bits 11..9 read as e2m1 · 2^-14 (the subnormal 0.5 lands on float16's subnormal range, which
        converts exactly)."""
        bits = ((codes & 8).to(tl.uint16) << 12) | ((codes & 7).to(tl.uint16) << 9)
        return bits.to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def nvfp4_weights(p_ptrs, b_ptrs, gs, cmask, dtype: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_F32: tl.constexpr):
        """One [BLOCK_N, BLOCK_K] weight tile decoded in registers: E2M1 codes times their E4M3 block scale times
        the global scale (gs already times 2^14, which undoes decode_e2m1_f32's bit trick; a power of two, so
        block_scale · global_scale rounds as in dequantize), in the dot's dtype."""
        p = tl.load(p_ptrs, mask=cmask[:, None], other=0)
        s = tl.load(b_ptrs, mask=cmask[:, None], other=0.0).to(tl.float32) * gs[:, None]
        # interleave the low (even k) and high (odd k) nibbles back into K order; decoding them into two
        # half-K dots against x's even and odd columns instead was 3-4x slower on an H200
        v = decode_e2m1_f32(tl.reshape(tl.join(p & 0xF, p >> 4), (BLOCK_N, BLOCK_K)))
        w = tl.reshape(tl.reshape(v, (BLOCK_N, BLOCK_K // 16, 16)) * s[:, :, None], (BLOCK_N, BLOCK_K))
        if DOT_F32:  # the Triton interpreter: its bf16 dot is wrong and its casts truncate
            return round_bf16(w)
        else:
            return w.to(dtype)

    @triton.jit
    def nvfp4_grouped_mm_kernel(
        x_ptr, p_ptr, bs_ptr, gs_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge, stride_ym,
        K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
        SWAP_AB: tl.constexpr, GATHER: tl.constexpr, SWIGLU: tl.constexpr, ROW_SCALE: tl.constexpr,
        SCATTER: tl.constexpr, PDL: tl.constexpr,
    ):
        # the same grid and fused steps as the int4 and fp8 kernels: axis 0 walks N (programs side by side share
        # one M tile of x in L2), axis 1 the M tiles
        pdl_open(PDL)
        pid_n = tl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, tl.program_id(1), E, E_P2, BLOCK_M)
        if e >= E:
            return
        rows, rmask, x_rows = tile_rows(rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N_OUT
        ks = tl.arange(0, BLOCK_K)
        kb = tl.arange(0, BLOCK_K // 2)
        ksc = tl.arange(0, BLOCK_K // 16)
        e64 = e.to(tl.int64)
        x_ptrs = x_ptr + x_rows[:, None] + ks[None, :]
        p_ptrs = p_ptr + e64 * stride_pe + cols[:, None].to(tl.int64) * stride_pn + kb[None, :]
        b_ptrs = bs_ptr + e64 * stride_be + cols[:, None].to(tl.int64) * stride_bn + ksc[None, :]
        gs = tl.load(gs_ptr + e64 * stride_ge + cols, mask=cmask, other=0.0) * 16384.0
        if SWIGLU:  # gate rows c and up rows HALF + c in one K loop, each x tile loaded once
            gsu = tl.load(gs_ptr + e64 * stride_ge + HALF + cols, mask=cmask, other=0.0) * 16384.0
        else:
            gsu = gs
        acc = accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
        up = tl.zeros_like(acc)
        for kk in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs + kk, mask=rmask[:, None], other=0.0)
            if DOT_F32:
                xd = x.to(tl.float32)
            else:
                xd = x
            w = nvfp4_weights(p_ptrs + kk // 2, b_ptrs + kk // 16, gs, cmask, x.dtype, BLOCK_N, BLOCK_K, DOT_F32)
            acc = mma_nt(w, xd, acc, SWAP_AB)
            if SWIGLU:
                wu = nvfp4_weights(p_ptrs + HALF * stride_pn + kk // 2, b_ptrs + HALF * stride_bn + kk // 16, gsu,
                                   cmask, x.dtype, BLOCK_N, BLOCK_K, DOT_F32)
                up = mma_nt(wu, xd, up, SWAP_AB)
        if DOT_F32:
            acc = round_bf16(acc)
            up = round_bf16(up)
        fused_epilogue(acc, up, y_ptr, rows, rmask, cols, cmask, rowscale_ptr, rowdest_ptr, stride_ym,
                       SWAP_AB, SWIGLU, ROW_SCALE, SCATTER, y_ptr.dtype.element_ty == tl.bfloat16)


def nvfp4_grouped_mm(x: Tensor, packed: Tensor, block_scale: Tensor, global_scale: Tensor, offsets: Tensor,
                     config: dict[str, Any] | None = None, *, row_index: Tensor | None = None, swiglu: bool = False,
                     row_scale: Tensor | None = None, row_dest: Tensor | None = None,
                     layout: str = "modelopt", out: Tensor | None = None) -> Tensor:
    """y[r] = x[r] @ W[e(r)].T for rows sorted by expert (offsets: cumulative row counts, int32), W packed NVFP4.
    row_index / swiglu / row_scale / row_dest: the engine's fused steps, as `int4_grouped_mm` takes them. A
    config with KERNEL="gluon" (pick_config's on an sm_90 GPU) runs nvfp4_wgmma's kernel, any other this file's.
    layout: the codes' order, "modelopt" (as stored) or "wgmma" (nvfp4_wgmma.repack's, what the Gluon kernel
    reads; ModelOpt's codes are repacked per call for it, a cost for benchmarks only: Nvfp4Experts keeps them
    repacked). out: the result's tensor ([S, N] or [S, N/2], x's dtype), Gluon kernel only."""
    e, n, _ = packed.shape
    k = x.shape[1]
    if layout not in ("modelopt", "wgmma"):
        raise ValueError(f"nvfp4_grouped_mm: layout {layout!r}: use modelopt or wgmma")
    if config is not None and config.get("KERNEL") == "gluon":
        if not nvfp4_wgmma.available(x.device, k):
            raise ValueError(f"nvfp4 kernel: the Gluon wgmma kernel needs an sm_90 GPU and K a multiple of "
                             f"{nvfp4_wgmma.K_BLOCK} ({x.device}, K={k}); pass a Triton configuration or none")
        packed = nvfp4_wgmma.repack(packed) if layout == "modelopt" else packed
        x = x.contiguous()
        s_rows = x.shape[0] if row_index is None else row_index.shape[0]
        y = torch.empty(s_rows, n // 2 if swiglu else n, dtype=x.dtype, device=x.device) if out is None else out
        if s_rows:
            nvfp4_wgmma.launch(x, packed, block_scale, global_scale, y, offsets, config, row_index=row_index,
                               swiglu=swiglu, row_scale=row_scale, row_dest=row_dest)
        return y
    if layout != "modelopt":
        raise ValueError("nvfp4_grouped_mm: the Triton kernel reads ModelOpt's layout; unpack the codes "
                         "(nvfp4_wgmma.unpack) or pass a Gluon configuration")
    return launch_grouped(
        nvfp4_grouped_mm_kernel, "nvfp4_grouped_mm", x, (packed, block_scale, global_scale),
        (packed.stride(0), packed.stride(1), block_scale.stride(0), block_scale.stride(1), global_scale.stride(0)),
        offsets, n, lambda rows: pick_config(rows, e, n, k), config,
        row_index=row_index, swiglu=swiglu, row_scale=row_scale, row_dest=row_dest)
