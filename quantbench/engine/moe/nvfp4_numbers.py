"""The NVFP4 number format, exactly as NVIDIA ModelOpt defines it, in pure torch.

NVFP4 values are FP4 E2M1 codes in blocks of 16 along K, each block with an FP8 E4M3 scale, times one FP32 scale
per tensor (the two-level scale):

    code = sign << 3 | idx,  idx -> {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    W[..., n, k] = e2m1(code) · (block_scale[..., n, k // 16] · global_scale[..., n])     (in float32, then cast)

Two codes share a byte: element 2j in the low nibble, 2j+1 in the high (`pack_codes` / `unpack_codes`).
`dequantize` reproduces ModelOpt's `NVFP4QTensor.dequantize` bit for bit; `quantize` its `NVFP4QTensor.quantize`
(used for synthetic real-shape models and tests); `fake_quantize_activations` its `fp4_fake_quant_block`, the
dynamic per-block activation quantization its fake-quant forward applies to every quantized layer's input. The
weight format built on these numbers, and its kernels, are quantbench.engine.moe.nvfp4.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Rounding to E2M1 (ModelOpt's `_cast_fp4`): nearest magnitude, ties to the even code (0.25 -> 0, 0.75 -> 1,
# 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), everything above 5 -> 6.
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ODD_BOUNDS = (0.75, 1.75, 3.5)


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
