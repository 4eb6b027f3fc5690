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

`dequantize` reproduces ModelOpt's `NVFP4QTensor.dequantize` bit for bit; `quantize` its `NVFP4QTensor.quantize`
(used for synthetic real-shape models and tests); `fake_quantize_activations` its `fp4_fake_quant_block`, the
dynamic per-block activation quantization its fake-quant forward applies to every quantized layer's input.
On CUDA, `grouped_mm` is a Triton grouped GEMM that decodes the codes in registers inside the K loop: the
experts stay packed in memory (4.5 bits per weight) and no BF16 copy of them is ever written.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor, nn

try:  # Triton is optional: without it (a CPU-only install) the engine dequantizes instead
    import triton
    import triton.language as tl
except ImportError:
    triton = None

from quantbench.errors import LoadError
from quantbench.moe.engine import DenseExperts, stored_nbytes

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Rounding to E2M1 (ModelOpt's `_cast_fp4`): nearest magnitude, ties to the even code (0.25 -> 0, 0.75 -> 1,
# 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), everything above 5 -> 6.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ODD_BOUNDS = (0.75, 1.75, 3.5)
FUSED_KERNEL = "triton-fused-nvfp4"
_DEQUANT_CHUNK = 1 << 24  # elements per dequantize chunk: bounds the float32 scratch to 64 MiB


# -- E2M1 codes ---------------------------------------------------------------------------------------------------
def unpack_codes(packed: Tensor) -> Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K]: byte j holds element 2j (low nibble) and 2j+1 (high nibble)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def pack_codes(codes: Tensor) -> Tensor:
    """uint8 codes [..., K] (K even) -> uint8 [..., K/2], the inverse of unpack_codes."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


@functools.cache
def _table(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A constant tensor made once per device: no host-to-device copy inside a forward (CUDA graphs forbid it)."""
    return torch.tensor(values, dtype=dtype, device=device)


def decode_e2m1(codes: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return _table(E2M1_VALUES, torch.float32, codes.device)[codes.long()].to(dtype)


def round_to_codes(scaled: Tensor) -> Tensor:
    """float values already divided by their scale -> uint8 E2M1 codes (ModelOpt's rounding, saturating at 6)."""
    bounds = _table(_BOUNDS, scaled.dtype, scaled.device)
    mag = scaled.abs()
    idx = torch.searchsorted(bounds, mag, out_int32=True)
    for b in _ODD_BOUNDS:  # searchsorted puts a value equal to a bound below it; these ties round up to even
        idx += (mag == b).int()
    return ((scaled < 0).int() << 3 | idx).to(torch.uint8)


def round_to_e2m1(scaled: Tensor) -> Tensor:
    """The nearest E2M1 value (same rounding as round_to_codes), as float32."""
    return decode_e2m1(round_to_codes(scaled))


# -- two-level scales -----------------------------------------------------------------------------------------------
def global_scale_of(amax: Tensor) -> Tensor:
    """Per-tensor scale from the tensor's absolute maximum: amax / (6 · 448) (`weight_scale_2`, `input_scale`)."""
    return amax.float() / (E2M1_MAX * E4M3_MAX)


def dequantize(packed: Tensor, block_scale: Tensor, global_scale: Tensor, dtype: torch.dtype) -> Tensor:
    """[..., N, K/2] codes, [..., N, K/16] E4M3 scales, global scale broadcastable to [..., N] -> [..., N, K].

    In float32 and in ModelOpt's order (block scale times global scale first, then the value), then cast."""
    values = decode_e2m1(unpack_codes(packed))
    scale = block_scale.float() * global_scale.float().unsqueeze(-1)
    return (values.unflatten(-1, (-1, BLOCK)) * scale.unsqueeze(-1)).flatten(-2).to(dtype)


def quantize(weight: Tensor, global_scale: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """ModelOpt's NVFP4QTensor.quantize over the last two dims of `weight` [..., N, K]: one global scale per
    [N, K] matrix (from its amax unless given, shape [...]). Returns (packed, block_scale, global_scale)."""
    if weight.shape[-1] % BLOCK:
        raise ValueError(f"NVFP4 needs K divisible by {BLOCK}; got a weight of shape {tuple(weight.shape)}")
    w = weight.float()
    if global_scale is None:
        global_scale = global_scale_of(w.abs().amax(dim=(-2, -1)))
    gs = global_scale.float().reshape(*global_scale.shape, 1, 1)
    blocks = w.unflatten(-1, (-1, BLOCK))
    block_scale = blocks.abs().amax(-1) / (E2M1_MAX * gs)
    block_scale[block_scale == 0] = 1.0
    block_scale = block_scale.clamp(min=2**-9, max=E4M3_MAX).to(torch.float8_e4m3fn)
    scaled = blocks / (block_scale.float() * gs).unsqueeze(-1)
    return pack_codes(round_to_codes(scaled.flatten(-2))), block_scale, global_scale.float()


def fake_quantize_activations(x: Tensor, global_scale: Tensor) -> Tensor:
    """ModelOpt's dynamic NVFP4 activation fake-quant (`fp4_fake_quant_block`) in torch: per 16-element block of
    each row, scale = e4m3(min(amax / (6 · gs), 448)) · gs (1 where that is below 1e-5), values rounded to E2M1.
    `global_scale` is the calibrated `input_scale`: a scalar, or one per row ([S] or [S, 1])."""
    rows = x.float().unflatten(-1, (-1, BLOCK))
    gs = global_scale.float()
    gs = torch.where(gs > 0, gs, torch.full_like(gs, 1e-12))
    gs = gs.reshape(-1, 1, 1) if gs.numel() > 1 else gs.reshape(())
    amax = rows.abs().amax(-1, keepdim=True)
    scale = (amax / (E2M1_MAX * gs)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float() * gs
    scale = torch.where(scale >= 1e-5, scale, torch.ones_like(scale))
    q = round_to_e2m1(rows.abs() / scale) * scale
    return torch.where(rows >= 0, q, -q).flatten(-2).to(x.dtype)


def expert_of_rows(offsets: Tensor, rows: int) -> Tensor:
    """For rows sorted by expert (offsets: cumulative row counts), the expert of each row; no host sync."""
    return torch.searchsorted(offsets, torch.arange(rows, device=offsets.device, dtype=offsets.dtype), right=True)


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
class Nvfp4Experts(nn.Module):
    """One projection of all E experts of a layer in packed NVFP4, as buffers (see the module docstring)."""

    fused_kernel = FUSED_KERNEL

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
            out[i : i + step] = dequantize(packed[i : i + step], bs[i : i + step], gs[i : i + step], dtype)
        return out

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        """The A4 of W4A4: the activations entering this projection, fake-quantized as ModelOpt does."""
        if not self.activations:
            return x_sorted
        return quantize_input_rows(x_sorted, offsets, self.input_scale)

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str) -> Tensor | None:
        if not (x_sorted.is_cuda and x_sorted.dtype in (torch.bfloat16, torch.float16) and triton_available()):
            return None
        return nvfp4_grouped_mm(x_sorted, self.packed, self.block_scale, self.global_scale, offsets)

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
def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_available() -> bool:
    """A GPU and Triton (or Triton's CPU interpreter, which the tests use)."""
    return triton is not None and (torch.cuda.is_available() or interpreting())


def pick_config(rows: int, experts: int, n: int, k: int) -> dict[str, int]:
    """Block sizes. Measured on an H200 at the Qwen3-30B-A3B layer shape (512 tokens top-8, about 32 rows per
    expert; benchmarks/nvfp4_fp8_gpu.py, 2026-11-29): M64 N128 K128, 8 warps, 3 stages: gate_up 0.288 ms, down
    0.156 ms, against 0.385 / 0.210 ms for M32 N64 K128 with 4 warps. BLOCK_K is a multiple of the 16-element
    scale block and divides K."""
    block_k = 128 if k % 128 == 0 else 64 if k % 64 == 0 else 32 if k % 32 == 0 else 16
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": block_k, "num_warps": 8, "num_stages": 3}


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
    )
    return y.reshape(shape)


if triton is not None:

    @triton.jit
    def round_bf16(v):
        """float32 -> the nearest bfloat16 value (ties to even), kept in float32: what a GPU's cast does, spelled
        out for the Triton interpreter, whose casts truncate."""
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def expert_tile(offs_ptr, pid_m, E: tl.constexpr, E_P2: tl.constexpr, BLOCK_M: tl.constexpr):
        """Which expert and rows M tile `pid_m` covers (the tiles of expert e follow those of expert e-1):
        (e, first row, end of the expert's rows); e == E for a spare tile past the last one."""
        eidx = tl.arange(0, E_P2)
        emask = eidx < E
        ends = tl.load(offs_ptr + eidx, mask=emask, other=0)
        starts = tl.load(offs_ptr + eidx - 1, mask=emask & (eidx > 0), other=0)
        tiles = tl.where(emask, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
        tile_end = tl.cumsum(tiles, 0)
        e = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
        sel = eidx == e
        first_tile = tl.sum(tl.where(sel, tile_end - tiles, 0), 0)
        row_start = tl.sum(tl.where(sel, starts, 0), 0) + (pid_m - first_tile) * BLOCK_M
        row_end = tl.sum(tl.where(sel, ends, 0), 0)
        return e, row_start, row_end

    @triton.jit
    def e2m1_round(a):
        """|x| / scale -> the nearest E2M1 magnitude (ModelOpt's fp4_round_magnitude, ties to even)."""
        return tl.where(a <= 0.25, 0.0, tl.where(a < 0.75, 0.5, tl.where(a <= 1.25, 1.0, tl.where(
            a < 1.75, 1.5, tl.where(a <= 2.5, 2.0, tl.where(a < 3.5, 3.0, tl.where(a <= 5.0, 4.0, 6.0)))))))

    @triton.jit
    def nvfp4_act_quant_kernel(
        x_ptr, y_ptr, gs_ptr, offs_ptr, S, stride_x, stride_y,
        K: tl.constexpr, PER_EXPERT: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """ModelOpt's fp4_fake_quant_block, op for op, with a global scale per row's expert when PER_EXPERT."""
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
    def nvfp4_grouped_mm_kernel(
        x_ptr, p_ptr, bs_ptr, gs_ptr, y_ptr, offs_ptr,
        N,
        stride_xm, stride_pe, stride_pn, stride_be, stride_bn, stride_ge, stride_ym,
        K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
    ):
        # Axis 0 walks N so that programs running side by side share one M tile of x (it stays in L2).
        pid_n = tl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, tl.program_id(1), E, E_P2, BLOCK_M)
        if e >= E:
            return
        rows = row_start + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        ks = tl.arange(0, BLOCK_K)
        kb = tl.arange(0, BLOCK_K // 2)
        ksc = tl.arange(0, BLOCK_K // 16)
        e64 = e.to(tl.int64)
        x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + ks[None, :]
        p_ptrs = p_ptr + e64 * stride_pe + cols[:, None].to(tl.int64) * stride_pn + kb[None, :]
        b_ptrs = bs_ptr + e64 * stride_be + cols[:, None].to(tl.int64) * stride_bn + ksc[None, :]
        # 2^14 undoes the bit trick below; a power of two, so block_scale · global_scale rounds as in dequantize
        gs = tl.load(gs_ptr + e64 * stride_ge + cols, mask=cmask, other=0.0) * 16384.0
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs, mask=rmask[:, None], other=0.0)
            p = tl.load(p_ptrs, mask=cmask[:, None], other=0)
            s = tl.load(b_ptrs, mask=cmask[:, None], other=0.0).to(tl.float32) * gs[:, None]
            # interleave the low (even k) and high (odd k) nibbles back into K order; decoding them into two
            # half-K dots against x's even and odd columns instead was 3-4x slower on an H200
            v = decode_e2m1_f32(tl.reshape(tl.join(p & 0xF, p >> 4), (BLOCK_N, BLOCK_K)))
            w = tl.reshape(tl.reshape(v, (BLOCK_N, BLOCK_K // 16, 16)) * s[:, :, None], (BLOCK_N, BLOCK_K))
            if DOT_F32:  # the Triton interpreter: its bf16 dot is wrong and its casts truncate
                acc += tl.dot(x.to(tl.float32), tl.trans(round_bf16(w)))
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
            x_ptrs += BLOCK_K
            p_ptrs += BLOCK_K // 2
            b_ptrs += BLOCK_K // 16
        if DOT_F32:
            acc = round_bf16(acc)
        y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def nvfp4_grouped_mm(x: Tensor, packed: Tensor, block_scale: Tensor, global_scale: Tensor, offsets: Tensor,
                     config: dict[str, int] | None = None) -> Tensor:
    """y[r] = x[r] @ W[e(r)].T for rows sorted by expert (offsets: cumulative row counts, int32), W packed NVFP4."""
    s_rows, k = x.shape
    e, n, _ = packed.shape
    x = x.contiguous()
    y = torch.empty(s_rows, n, dtype=x.dtype, device=x.device)
    if s_rows == 0:
        return y
    cfg = dict(config or pick_config(s_rows, e, n, k))
    if k % cfg["BLOCK_K"]:
        raise ValueError(f"nvfp4_grouped_mm: K={k} is not a multiple of BLOCK_K={cfg['BLOCK_K']}")
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    interpret = interpreting()
    if interpret:
        cfg.pop("num_warps", None), cfg.pop("num_stages", None)
    # enough M tiles for any split of the rows: each expert wastes at most one partial tile
    grid = (triton.cdiv(n, block_n), triton.cdiv(s_rows, block_m) + e)
    nvfp4_grouped_mm_kernel[grid](
        x, packed, block_scale, global_scale, y, offsets,
        n,
        x.stride(0), packed.stride(0), packed.stride(1), block_scale.stride(0), block_scale.stride(1),
        global_scale.stride(0), y.stride(0),
        K=k, E=e, E_P2=triton.next_power_of_2(e), DOT_F32=interpret, **cfg,
    )
    return y
