"""FP8 (E4M3) expert weights and dense layers, as ModelOpt's FP8 and compressed-tensors' float-quantized write them.

For one projection of E experts with K inputs and N outputs (gate_up: gate rows then up rows):

    weight       float8_e4m3fn [E, N, K]
    scale        float32       [E, N]   per row: a per-tensor scale repeated, or per-channel scales as stored
    input_scale  float32       [E]      static per-tensor activation scale (amax / 448), when the checkpoint has one

    W[e, n, k] = weight[e, n, k] · scale[e, n]        (in float32, then cast)

FP8 checkpoints are W8A8: the activations entering each quantized layer are E4M3 too, with the static
`input_scale` ("static") or a per-token scale computed on the fly ("dynamic", compressed-tensors' FP8_DYNAMIC).
Emulated (any device): activations fake-quantized as ModelOpt's fake-quant forward does, weights dequantized.
Native (CUDA, compute capability >= 8.9: Ada, Hopper, Blackwell): dense layers run `torch._scaled_mm` and the
experts a Triton grouped GEMM whose dot takes E4M3 operands on the FP8 tensor cores.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from quantbench.engine import pdl
from quantbench.engine.moe.engine import ExpertsBase, stored_nbytes
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
        column_vector,
        e4m3_codes,
        expert_tile,
        fused_epilogue,
        mma_nt,
        pdl_open,
        round_bf16,
        tile_rows,
    )

E4M3_MAX = 448.0
FUSED_KERNEL = "triton-fused-fp8"
NATIVE_KERNEL = "triton-fused-fp8-native"
ACTIVATION_MODES = ("static", "dynamic", "none")
_DEQUANT_CHUNK = 1 << 24


def quantize(weight: Tensor, per_channel: bool = False) -> tuple[Tensor, Tensor]:
    """ModelOpt's FP8QTensor.quantize over the last two dims of [..., N, K]: scale = amax / 448 per matrix (or
    per row), weight / scale cast to E4M3. Returns (weight, scale [..., N])."""
    w = weight.float()
    amax = w.abs().amax(dim=-1) if per_channel else w.abs().amax(dim=(-2, -1)).unsqueeze(-1).expand(w.shape[:-1])
    scale = (amax / E4M3_MAX).contiguous()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / safe.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def dequantize(weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    return (weight.float() * scale.float().unsqueeze(-1)).to(dtype)


def fake_quantize_activations(x: Tensor, scale: Tensor | None) -> Tensor:
    """E4M3 fake-quant of activations, ModelOpt's `_fp8_eager` op for op with amax = 448 · scale: x · (448 / amax)
    rounded to E4M3 (saturating at ±448), times its reciprocal, in x's dtype. scale None: dynamic, each row's own
    amax (compressed-tensors' per-token FP8_DYNAMIC)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True) if scale is None else scale.float() * E4M3_MAX
    amax = torch.where(amax <= 1.0 / (1 << 24), torch.ones_like(amax), amax)
    factor = E4M3_MAX / amax
    return ((xf * factor).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * (1 / factor)).to(x.dtype)


@functools.cache
def native_fp8(device: torch.device | str) -> bool:
    """FP8 tensor cores: CUDA compute capability 8.9 (Ada) and up."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Experts(ExpertsBase):
    """One projection of all E experts of a layer in FP8 E4M3 with per-row scales, as buffers."""

    # native path only (grouped_mm); "codes": E4M3 codes in and out (see codes_scale)
    fused_features = frozenset({"gather", "swiglu", "row_scale", "scatter", "codes"})

    def __init__(self, weight: Tensor, scale: Tensor, input_scale: Tensor | None = None, *,
                 activations: str = "static", name: str = ""):
        super().__init__()
        e, n, k = weight.shape
        if weight.dtype != torch.float8_e4m3fn:
            raise LoadError(f"{name}.weight: dtype {weight.dtype}; FP8 experts are float8_e4m3fn")
        if scale.dtype != torch.float32 or tuple(scale.shape) != (e, n):
            raise LoadError(f"{name}.weight_scale: {scale.dtype} {tuple(scale.shape)}, expected float32 {(e, n)}")
        if activations not in ACTIVATION_MODES:
            raise LoadError(f"{name}: activation mode {activations!r}, expected one of {ACTIVATION_MODES}")
        if activations == "static" and input_scale is None:
            raise LoadError(f"{name}.input_scale: missing; static FP8 activations need it")
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(-1).contiguous())
        self.num_experts, self.out_features, self.in_features = e, n, k
        self.activations = activations
        self.format = "fp8"
        # one input scale for every expert (ModelOpt calibrates one per expert; synthetic models share one): inputs
        # can then be rounded to E4M3 once, before the kernel, and the previous projection can write them so
        s = self.input_scale
        self._one_input_scale = s is not None and bool((s == s[0]).all())

    @property
    def fused_kernel(self) -> str:
        return NATIVE_KERNEL if self._native(self.weight.device) else FUSED_KERNEL

    def _native(self, device: torch.device) -> bool:
        return self.activations == "static" and native_fp8(device) and self.in_features % 32 == 0

    @classmethod
    def from_weights(cls, weight: Tensor, *, input_scale: Tensor | None = None, per_channel: bool = False,
                     activations: str = "static") -> Fp8Experts:
        w, scale = quantize(weight, per_channel)
        return cls(w, scale, input_scale, activations=activations if input_scale is not None else "dynamic")

    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None) -> Tensor:
        w, s = (self.weight, self.scale) if experts is None else (self.weight[experts], self.scale[experts])
        out = torch.empty(w.shape, dtype=dtype, device=w.device)
        step = max(1, _DEQUANT_CHUNK // max(1, self.out_features * self.in_features))
        for i in range(0, w.shape[0], step):
            out[i : i + step] = dequantize(w[i : i + step], s[i : i + step], dtype)
        return out

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def quantizes_input_in_kernel(self, device: torch.device) -> bool:
        """The native kernel rounds x to E4M3 with the static input scale itself (see quantize_input)."""
        return self._native(device)

    def codes_scale(self, device: torch.device) -> Tensor | None:
        """The one input scale ([1]) with which this projection's native kernel takes E4M3 codes (`out_scale` of
        the previous projection's kernel), or None: per-expert scales, or no native kernel here."""
        return self.input_scale[:1] if self._one_input_scale and self._native(device) else None

    def quantize_input(self, x_sorted: Tensor, offsets: Tensor) -> Tensor:
        """The A8 of W8A8, as ModelOpt's fake-quant applies it (the native kernel re-reads the same E4M3 codes)."""
        if self.activations == "none":
            return x_sorted
        if self.activations == "dynamic":
            return fake_quantize_activations(x_sorted, None)
        s = self.input_scale
        if s.numel() > 1:
            s = s[expert_of_rows(offsets, x_sorted.shape[0])].unsqueeze(-1)
        return fake_quantize_activations(x_sorted, s)

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str, *, row_index: Tensor | None = None,
                   act: str | None = None, row_scale: Tensor | None = None, row_dest: Tensor | None = None,
                   out_scale: Tensor | None = None) -> Tensor | None:
        """The fused kernel; the engine's fused steps (row_index / act / row_scale / row_dest, see its contract)
        only on the native path, where the kernel quantizes its own inputs (the engine asks
        quantizes_input_in_kernel before passing them). With one input scale (codes_scale) x may come as E4M3
        codes, and tokens to gather are rounded once here rather than in every N tile of the kernel; out_scale:
        the output as E4M3 codes for the next projection (its codes_scale)."""
        codes = x_sorted.dtype == torch.float8_e4m3fn
        if not (x_sorted.is_cuda and (x_sorted.dtype in (torch.bfloat16, torch.float16) or codes)
                and triton_available()):
            return None
        native = self._native(x_sorted.device)
        extras = row_index is not None or act is not None or row_scale is not None or row_dest is not None
        one_scale = self.codes_scale(x_sorted.device)
        if ((extras or out_scale is not None) and not native) or act not in (None, "swiglu") or (
                codes and one_scale is None) or (out_scale is not None and x_sorted.dtype == torch.float16):
            return None
        if row_index is not None and one_scale is not None and x_sorted.dtype == torch.bfloat16:
            x_sorted = fp8_codes(x_sorted, one_scale)
        return fp8_grouped_mm(x_sorted, self.weight, self.scale, offsets, input_scale=self.input_scale if native else None,
                              row_index=row_index, swiglu=act == "swiglu", row_scale=row_scale, row_dest=row_dest,
                              out_scale=out_scale)

    def extra_repr(self) -> str:
        return f"fp8 e4m3, activations={self.activations}, experts={self.num_experts}, out={self.out_features}, in={self.in_features}"


class Fp8Linear(nn.Module):
    """A quantized nn.Linear in FP8: `torch._scaled_mm` where the GPU has FP8 tensor cores, else emulated."""

    def __init__(self, weight: Tensor, scale: Tensor, input_scale: Tensor | None, bias: Tensor | None, *,
                 activations: str = "static"):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        s = scale.float().reshape(-1)
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("scale", (s.expand(self.out_features) if s.numel() == 1 else s).contiguous())
        self.register_buffer("input_scale", None if input_scale is None else input_scale.float().reshape(()))
        self.register_buffer("bias", bias)
        self.activations = activations
        self.per_tensor = s.numel() == 1

    def native(self, device: torch.device) -> bool:
        return (self.activations == "static" and native_fp8(device)
                and self.in_features % 16 == 0 and self.out_features % 16 == 0)

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.native(x.device):
            return self._scaled_mm(x, bias)
        if self.activations != "none":
            x = fake_quantize_activations(x, self.input_scale if self.activations == "static" else None)
        return nn.functional.linear(x, dequantize(self.weight, self.scale, x.dtype), bias)

    def _scaled_mm(self, x: Tensor, bias: Tensor | None) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        xq = (rows.float() / self.input_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        if self.per_tensor:
            scale_a, scale_b = self.input_scale, self.scale[0]
        else:  # per-channel weights: row-wise scaling (one scale per row of x, one per output column)
            scale_a = self.input_scale.expand(rows.shape[0], 1).contiguous()
            scale_b = self.scale.reshape(1, -1)
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"fp8 e4m3, in={self.in_features}, out={self.out_features}, activations={self.activations}"


# -- the fused Triton kernel ------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def fp8_weights(w, s, FP8_DOT: tl.constexpr, DOT_F32: tl.constexpr, dtype: tl.constexpr):
        """A [BLOCK_N, BLOCK_K] weight tile as the dot takes it: E4M3 as stored (its scale applied after the dot),
        or dequantized to x's dtype (float32 under the interpreter, whose bf16 dot is wrong)."""
        if FP8_DOT:
            return w
        elif DOT_F32:
            return round_bf16(w.to(tl.float32) * s[:, None])
        else:
            return (w.to(tl.float32) * s[:, None]).to(dtype)

    @triton.jit
    def fp8_activations(x, in_scale, FP8_DOT: tl.constexpr, DOT_F32: tl.constexpr):
        """W8A8 on the FP8 tensor cores: x rounded to E4M3 with the static input scale (saturating)."""
        if FP8_DOT:
            return e4m3_codes(x.to(tl.float32), in_scale)
        elif DOT_F32:
            return x.to(tl.float32)
        else:
            return x

    @triton.jit
    def fp8_codes_kernel(x_ptr, in_ptr, y_ptr, R, stride_xm, K: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        """x -> its E4M3 codes with the one input scale, by the grouped kernel's own expression (same bits)."""
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (rows < R)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                 fp8_activations(x, tl.load(in_ptr), True, False), mask=mask)

    @triton.jit
    def fp8_grouped_mm_kernel(
        x_ptr, w_ptr, s_ptr, in_ptr, codes_ptr, y_ptr, offs_ptr, rowidx_ptr, rowscale_ptr, rowdest_ptr,
        N_OUT, HALF,
        stride_xm, stride_we, stride_wn, stride_se, stride_ym,
        K: tl.constexpr, E: tl.constexpr, E_P2: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        FP8_DOT: tl.constexpr, DOT_F32: tl.constexpr, SWAP_AB: tl.constexpr,
        GATHER: tl.constexpr, SWIGLU: tl.constexpr, ROW_SCALE: tl.constexpr, SCATTER: tl.constexpr,
        X_CODES: tl.constexpr, OUT_CODES: tl.constexpr, ROUND_BF16: tl.constexpr, PDL: tl.constexpr,
    ):
        # the same grid and fused steps as the int4 kernel (quantbench.engine.moe.int4): axis 0 walks N, axis 1 M tiles
        pdl_open(PDL)
        pid_n = tl.program_id(0)
        e, row_start, row_end = expert_tile(offs_ptr, tl.program_id(1), E, E_P2, BLOCK_M)
        if e >= E:
            return
        rows, rmask, x_rows = tile_rows(rowidx_ptr, row_start, row_end, stride_xm, BLOCK_M, GATHER)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N_OUT
        ks = tl.arange(0, BLOCK_K)
        e64 = e.to(tl.int64)
        x_ptrs = x_ptr + x_rows[:, None] + ks[None, :]
        w_ptrs = w_ptr + e64 * stride_we + cols[:, None].to(tl.int64) * stride_wn + ks[None, :]
        s = tl.load(s_ptr + e64 * stride_se + cols, mask=cmask, other=0.0)
        if SWIGLU:
            su = tl.load(s_ptr + e64 * stride_se + HALF + cols, mask=cmask, other=0.0)
        else:
            su = s
        if FP8_DOT:
            in_scale = tl.load(in_ptr + e)
        else:
            in_scale = 1.0
        acc = accumulator(BLOCK_M, BLOCK_N, SWAP_AB)
        up = tl.zeros_like(acc)
        for kb in range(0, K, BLOCK_K):
            # SWIGLU: gate rows c and up rows HALF + c in one K loop, each x tile loaded (and rounded) once
            x = tl.load(x_ptrs + kb, mask=rmask[:, None], other=0.0)
            if X_CODES:  # already E4M3, rounded with in_scale (fp8_codes or the previous kernel's OUT_CODES)
                xd = x
            else:
                xd = fp8_activations(x, in_scale, FP8_DOT, DOT_F32)
            w = tl.load(w_ptrs + kb, mask=cmask[:, None], other=0.0)
            acc = mma_nt(fp8_weights(w, s, FP8_DOT, DOT_F32, x.dtype), xd, acc, SWAP_AB)
            if SWIGLU:
                wu = tl.load(w_ptrs + HALF * stride_wn + kb, mask=cmask[:, None], other=0.0)
                up = mma_nt(fp8_weights(wu, su, FP8_DOT, DOT_F32, x.dtype), xd, up, SWAP_AB)
        if FP8_DOT:  # the scales of both operands, per output column
            acc = acc * column_vector(in_scale * s, SWAP_AB)
            up = up * column_vector(in_scale * su, SWAP_AB)
        if DOT_F32:
            acc = round_bf16(acc)
            up = round_bf16(up)
        codes_scale = tl.load(codes_ptr) if OUT_CODES else 1.0
        fused_epilogue(acc, up, y_ptr, rows, rmask, cols, cmask, rowscale_ptr, rowdest_ptr, stride_ym,
                       SWAP_AB, SWIGLU, ROW_SCALE, SCATTER, ROUND_BF16, codes_scale, OUT_CODES)


# Measured best on an H200 (benchmarks/kernel_sweep.py, 2026-11-30) at the Qwen3-30B-A3B shape, per (N, K, rows-
# per-expert bucket), the projections as the engine calls them (gate_up with gather + SwiGLU, down with the routing
# weights + scatter). 512 tokens ("mid", ~32 rows per expert): gate_up 141.5 us, down 89.1 us (the kernel before
# this one, plain orientation, FP8 dots lowered to fp16 mma.sync: 281 / 164 us without the fused steps).
# 16,384 tokens ("large", ~1,024 rows): gate_up 1,587 us, down 1,020 us (2,360 / 2,092 with the mid ones).
# TUNED_CODES: where the input comes as E4M3 codes (one input scale), `--formats fp8codes`: mid down 75.1 us
# (97.6 with the bf16-input tile), large gate_up 932 us, large down 594 us.
_SWAP = {"BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "SWAP_AB": True}
TUNED: dict[tuple[int, int, str], dict] = {
    (1536, 2048, "mid"): dict(_SWAP, BLOCK_M=32, BLOCK_N=64),
    (2048, 768, "mid"): dict(_SWAP, BLOCK_M=32, BLOCK_N=128),
    (1536, 2048, "large"): dict(_SWAP, BLOCK_M=128, BLOCK_N=128, num_warps=8, SWAP_AB=False),
    (2048, 768, "large"): dict(_SWAP, BLOCK_M=128, BLOCK_N=256, num_warps=8, SWAP_AB=False),
}
TUNED_CODES: dict[tuple[int, int, str], dict] = {
    **TUNED,
    (2048, 768, "mid"): dict(_SWAP, BLOCK_M=64, BLOCK_N=128, num_warps=8),
    (2048, 768, "large"): dict(_SWAP, BLOCK_M=128, BLOCK_N=128, num_warps=8, SWAP_AB=False),
}


def pick_config(rows: int, experts: int, n: int, k: int, fp8_dot: bool = True, codes: bool = False) -> dict:
    per_expert = rows / max(1, experts)
    tuned = (TUNED_CODES if codes else TUNED).get((n, k, rows_bucket(rows, experts)))  # the int4 kernel's buckets
    if fp8_dot and tuned and k % tuned["BLOCK_K"] == 0:
        return dict(tuned)
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64
    block_k = 128 if k % 128 == 0 else 64 if k % 64 == 0 else 32 if k % 32 == 0 else 16
    # the weights on the MMA's M side for FP8 dots (see fp8_mma): 64 weight rows, the tokens as N
    return {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 3,
            "SWAP_AB": fp8_dot}


def fp8_codes(x: Tensor, input_scale: Tensor) -> Tensor:
    """x [R, K] (bf16) -> float8_e4m3fn codes with one input scale, bit for bit what the grouped kernel computes
    from x in its K loop: rows the kernel would round once per N tile (and per routed slot, gathering) are
    rounded once here."""
    r, k = x.shape
    y = torch.empty(r, k, dtype=torch.float8_e4m3fn, device=x.device)
    if r:
        grid = (triton.cdiv(r, 16), triton.cdiv(k, 256))
        fp8_codes_kernel[grid](x, input_scale, y, r, x.stride(0), K=k, BLOCK_R=16, BLOCK_C=256,
                               **pdl.launch_args(x.device))
    return y


def fp8_grouped_mm(x: Tensor, weight: Tensor, scale: Tensor, offsets: Tensor, *, input_scale: Tensor | None = None,
                   config: dict[str, int] | None = None, row_index: Tensor | None = None, swiglu: bool = False,
                   row_scale: Tensor | None = None, row_dest: Tensor | None = None,
                   out_scale: Tensor | None = None) -> Tensor:
    """y[r] = x[r] @ W[e(r)].T for rows sorted by expert, W FP8 with per-row scales. With `input_scale` ([E]),
    x is quantized to E4M3 in the kernel and the dot runs in FP8 (needs compute capability >= 8.9); x may then
    also come as float8_e4m3fn codes already rounded with that scale (`fp8_codes`, or a previous call's
    `out_scale`), from a bfloat16 model. out_scale ([1]): y as E4M3 codes with that scale (the next projection's
    input scale) instead of bfloat16. row_index / swiglu / row_scale / row_dest: the engine's fused steps, as
    `int4_grouped_mm` takes them."""
    e, n, k = weight.shape
    fp8_dot = input_scale is not None
    x_codes = x.dtype == torch.float8_e4m3fn
    if (x_codes or out_scale is not None) and not (fp8_dot and x.dtype in (torch.bfloat16, torch.float8_e4m3fn)):
        raise ValueError("fp8_grouped_mm: E4M3 codes in or out need input_scale and a bfloat16 model")
    if fp8_dot and input_scale.numel() == 1:
        input_scale = input_scale.reshape(1).expand(e).contiguous()
    return launch_grouped(
        fp8_grouped_mm_kernel, "fp8_grouped_mm", x,
        (weight, scale, input_scale if fp8_dot else scale, scale if out_scale is None else out_scale),
        (weight.stride(0), weight.stride(1), scale.stride(0)), offsets, n,
        lambda rows: pick_config(rows, e, n, k, fp8_dot, x_codes), config,
        row_index=row_index, swiglu=swiglu, row_scale=row_scale, row_dest=row_dest,
        out_dtype=torch.float8_e4m3fn if out_scale is not None else torch.bfloat16 if x_codes else x.dtype,
        FP8_DOT=fp8_dot, X_CODES=x_codes, OUT_CODES=out_scale is not None,
        ROUND_BF16=x.dtype in (torch.bfloat16, torch.float8_e4m3fn))
