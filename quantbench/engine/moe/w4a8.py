"""W4A8: an auto-round int4 checkpoint's weights (4-bit codes q, fp16 scales s and uint8 zero points z per group of
128 inputs, as Int4Experts holds them) run with int8 activations, quantized per row per 128 inputs. A variant of its
own (`--int4-activations int8`, recorded as "int4-w4a8"), never a silent stand-in for W4A16: it changes the answers.

The arithmetic, which the GPU kernel (w4a8_kernels) follows exactly and `quantize_rows` / `reference_grouped_mm`
state in torch. Per row r and group g of 128 inputs of x [R, K]:

    amax = max |x| (float32)   sx[r, g] = amax / 127   xq = clamp(round_half_even(x · (127 / amax)), −127, 127) int8
    (a group of zeros, or below TINY: xq 0, sx 0)        xsum[r, g] = Σ xq over the group (int32)
    y[r, n] = Σ_g s[e, g, n] · sx[r, g] · (P_g[r, n] − z[e, g, n] · xsum[r, g])
    P_g[r, n] = Σ_{k in g} q[e, n, k] · xq[r, k]   (exact, in integers)

The zero point leaves the dot as z · xsum, so the integer dot takes the raw codes (exact in int32) and the scales
apply once per group. Symmetric (−127..127, no zero point) so that xq needs no correction of its own.

The packed weights the kernel reads, uint8 [E, N, K/2]: for block b (inputs 128b .. 128b+127) and byte c in 0..63,
packed[e, n, 64b + c] = q[e, n, 128b + c] | q[e, n, 128b + 64 + c] << 4. The same bytes as Int4Experts' int32
qweight, rewritten once at load (the qweight is dropped: no second copy).

Where the kernel does not run (the CPU, a GPU other than sm_90) the engine emulates W4A8: each projection's input
fake-quantized (xq · sx, rounded to x's dtype: `fake_quant`) times the dequantized weights.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantbench.engine.moe.engine import ExpertsBase, GroupedMoE, reset_paths, stored_nbytes
from quantbench.engine.moe.gluon_common import sm90
from quantbench.engine.moe.int4 import Int4Experts, unpack_k
from quantbench.errors import ConfigError

GROUP = 128  # inputs per activation scale and per weight group: one K block of the kernel
# A group whose largest |x| is below this counts as zeros: 127 / amax would overflow float32 (inf, then NaN codes)
# from amax < 127 / 3.4e38 ≈ 3.7e-37; such values are nothing next to any other activation.
TINY = 1e-36
FLAG = "--int4-activations int8"
KERNEL = "gluon-wgmma-int4-w4a8"
_CHUNK = 1 << 20  # weights per chunk when repacking or dequantizing: bounded scratch, whatever the shape


# -- the packed layout --------------------------------------------------------------------------------------------
def pack_w4a8(q: Tensor) -> Tensor:
    """Codes 0..15 [..., N, K] (K a multiple of 128) -> uint8 [..., N, K/2] in the kernel's layout (module doc):
    byte c of a block holds input c in its low nibble and input 64 + c in its high one, so one 64-byte load gives
    the kernel both halves of a block as two contiguous 64-input slices."""
    *lead, k = q.shape
    if k % GROUP:
        raise ValueError(f"pack_w4a8: {k} inputs are not a multiple of {GROUP}")
    blocks = q.to(torch.uint8).reshape(*lead, k // GROUP, 2, GROUP // 2)
    return (blocks[..., 0, :] | (blocks[..., 1, :] << 4)).reshape(*lead, k // 2)


def unpack_w4a8(packed: Tensor) -> Tensor:
    """Inverse of pack_w4a8: uint8 [..., N, K/2] -> codes uint8 [..., N, K]."""
    *lead, k2 = packed.shape
    blocks = packed.reshape(*lead, k2 // (GROUP // 2), 1, GROUP // 2)
    return torch.cat([blocks & 0xF, blocks >> 4], dim=-2).reshape(*lead, 2 * k2)


# -- the activations ------------------------------------------------------------------------------------------------
def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x [R, K] -> (xq int8 [R, K], sx float32 [R, K/128], xsum int32 [R, K/128]): the contract in the module doc,
    in torch (the reference the kernel's quantizer is held to)."""
    r, k = x.shape
    if k % GROUP:
        raise ValueError(f"quantize_rows: {k} inputs are not a multiple of {GROUP}")
    groups = x.float().reshape(r, k // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    # 127 / amax first, then one multiply per element (what the kernel computes); 0 for a group of zeros
    live = amax >= TINY
    # a tensor over a tensor: `127.0 / t` is t.reciprocal() * 127 in torch, two roundings (an ulp off a quarter of
    # the time: other codes than the kernel's IEEE division on the H200, 2026-12-03)
    inv = torch.where(live, torch.full_like(amax, 127.0) / torch.where(live, amax, 1.0), torch.zeros_like(amax))
    amax = torch.where(live, amax, torch.zeros_like(amax))
    xq = torch.round(groups * inv).clamp_(-127, 127).to(torch.int8)  # torch.round: half to even
    xsum = xq.sum(dim=-1, dtype=torch.int32)
    return xq.reshape(r, k), (amax / 127.0).squeeze(-1), xsum


def fake_quant(x: Tensor, offsets: Tensor | None = None) -> Tensor:
    """x [..., K] as the kernel sees it: (xq · sx) rounded to x's dtype. Per row, so `offsets` (the engine's
    quantize_input signature) do not matter: a row's codes are the same sorted, gathered or not."""
    k = x.shape[-1]
    xq, sx, _ = quantize_rows(x.reshape(-1, k))
    x_dq = xq.float().reshape(-1, k // GROUP, GROUP) * sx.unsqueeze(-1)
    return x_dq.reshape(x.shape).to(x.dtype)


# -- the reference of the kernel ------------------------------------------------------------------------------------
def reference_grouped_mm(x: Tensor, packed: Tensor, scales: Tensor, zeros: Tensor, offsets: Tensor, *,
                         row_index: Tensor | None = None, act: str | None = None, row_scale: Tensor | None = None,
                         row_dest: Tensor | None = None) -> Tensor:
    """What the kernel computes, in float64 from the integer parts (slow; for tests): y[r] for rows sorted by
    expert (offsets: cumulative rows per expert), with Int4Experts.grouped_mm's fused steps (row_index: row r reads
    x[row_index[r]]; act="swiglu": silu(gate) · up, [S, N/2]; row_scale: row r times row_scale[r]; row_dest: row r
    written to row row_dest[r]). In x's dtype; rows past offsets[-1] (which the kernel leaves unwritten) are 0."""
    rows = x if row_index is None else x[row_index.long()]
    xq, sx, xsum = quantize_rows(rows)
    _, n, k2 = packed.shape
    groups = 2 * k2 // GROUP
    y = torch.zeros(rows.shape[0], n, dtype=torch.float64, device=x.device)
    start = 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            q = unpack_w4a8(packed[e]).double().reshape(n, groups, GROUP)
            p = torch.einsum("mgk,ngk->mgn", xq[start:end].double().reshape(-1, groups, GROUP), q)  # exact integers
            corr = zeros[e].double() * xsum[start:end].double().unsqueeze(-1)  # z · xsum, [m, G, N]
            y[start:end] = ((p - corr) * scales[e].double() * sx[start:end].double().unsqueeze(-1)).sum(dim=1)
        start = end
    if act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    elif act is not None:
        raise ValueError(f"reference_grouped_mm: act {act!r}; use None or 'swiglu'")
    if row_scale is not None:
        y = y * row_scale.double().unsqueeze(-1)
    y = y.to(x.dtype)
    if row_dest is None:
        return y
    out = torch.zeros_like(y)
    done = start  # offsets[-1]: the rows the kernel writes
    out[row_dest[:done].long()] = y[:done]
    return out


# -- the format ---------------------------------------------------------------------------------------------------
class Int4W4A8Experts(ExpertsBase):
    """One projection of all E experts of a layer, an Int4Experts' weights in the W4A8 layout: packed uint8
    [E, N, K/2], scales fp16 and zeros uint8 [E, K/128, N] (Int4Experts' own tensors, shared), as buffers."""

    fused_kernel = KERNEL
    fused_features = Int4Experts.fused_features
    input_quant_rowwise = True  # a row's codes depend on that row alone: the engine may quantize before a gather
    quantize_input = staticmethod(fake_quant)  # the CPU / fallback path's emulation (engine.py, _project)

    def __init__(self, packed: Tensor, scales: Tensor, zeros: Tensor, *, sym: bool):
        super().__init__()
        e, n, k2 = packed.shape
        if packed.dtype != torch.uint8 or (2 * k2) % GROUP or scales.shape != (e, 2 * k2 // GROUP, n) \
                or zeros.shape != scales.shape:
            raise ValueError(f"W4A8 weights: packed {packed.dtype} {tuple(packed.shape)}, scales "
                             f"{tuple(scales.shape)}, zeros {tuple(zeros.shape)} do not fit (expected uint8 "
                             f"[E, N, K/2] and [E, K/{GROUP}, N])")
        self.register_buffer("packed", packed.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("zeros", zeros.contiguous())
        self.num_experts, self.out_features, self.in_features = e, n, 2 * k2
        self.group_size, self.sym = GROUP, sym
        self.format = f"int4-g{GROUP}-{'sym' if sym else 'asym'}-w4a8"
        self.ran_kernel: str | None = None

    @classmethod
    def from_int4(cls, experts: Int4Experts, name: str = "experts") -> Int4W4A8Experts:
        """The same weights, repacked a few experts at a time (the scratch stays small at any shape). Refused
        unless groups are 128 inputs and K a multiple of 128: one activation scale per weight group."""
        g, k = experts.group_size, experts.in_features
        if g != GROUP or k % GROUP:
            why = f"group size {g}" if g != GROUP else f"{k} inputs, not a multiple of {GROUP}"
            raise ConfigError(f"{FLAG}: {name} has {why}; W4A8 quantizes activations per {GROUP} inputs against "
                              f"weight groups of {GROUP} (use a group-size-{GROUP} checkpoint, or leave "
                              "--int4-activations at bf16)")
        e, n = experts.num_experts, experts.out_features
        packed = torch.empty(e, n, k // 2, dtype=torch.uint8, device=experts.qweight.device)
        step = max(1, _CHUNK // (k * n))
        for i in range(0, e, step):
            q = unpack_k(experts.qweight[i : i + step], experts.k_block)  # [e', K, N] int32
            packed[i : i + step] = pack_w4a8(q.transpose(-2, -1))
        return cls(packed, experts.scales, experts.zeros, sym=experts.sym)

    def quantizes_input_in_kernel(self, device: torch.device) -> bool:
        """The Gluon kernel quantizes its own inputs: CUDA on sm_90 with Gluon. Elsewhere the engine emulates."""
        return _kernel_runs_on(torch.device(device))

    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None) -> Tensor:
        """[E', N, K] in `dtype`: (q − z) · s in float32 (exact: an 8-bit integer times an fp16 scale), then
        rounded once, so the same bits as Int4Experts.dequantize."""
        p, s, z = self.packed, self.scales, self.zeros
        if experts is not None:
            p, s, z = p[experts], s[experts], z[experts]
        e, n, k = p.shape[0], self.out_features, self.in_features
        out = torch.empty(e, n, k, dtype=dtype, device=p.device)
        step = max(1, _CHUNK // (k * n))
        for i in range(0, e, step):
            q = unpack_w4a8(p[i : i + step]).reshape(-1, n, k // GROUP, GROUP).float()
            sc = s[i : i + step].float().transpose(-2, -1).unsqueeze(-1)  # [e', N, G, 1]
            zp = z[i : i + step].float().transpose(-2, -1).unsqueeze(-1)
            out[i : i + step] = ((q - zp) * sc).reshape(-1, n, k)
        return out

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str, *, row_index: Tensor | None = None,
                   act: str | None = None, row_scale: Tensor | None = None,
                   row_dest: Tensor | None = None) -> Tensor | None:
        """The W4A8 kernel (x quantized by its own pass, then the grouped GEMM with the engine's fused steps), or
        None where it does not run (the engine then emulates: fake-quantized x times the dequantized weights)."""
        if not (x_sorted.is_cuda and self.quantizes_input_in_kernel(x_sorted.device)):
            return None
        if x_sorted.dtype not in (torch.bfloat16, torch.float16) or act not in (None, "swiglu"):
            return None
        from quantbench.engine.moe import w4a8_kernels  # lazy: Gluon is imported only where it runs

        # as int4_kernels.int4_grouped_mm allocates: one output row per (gathered) row, half the columns with SwiGLU
        rows = x_sorted.shape[0] if row_index is None else row_index.shape[0]
        n_out = self.out_features // 2 if act == "swiglu" else self.out_features
        y = torch.empty(rows, n_out, dtype=x_sorted.dtype, device=x_sorted.device)
        self.ran_kernel = KERNEL
        if rows == 0:
            return y
        xq, sx, sxs = w4a8_kernels.quantize_rows(x_sorted.contiguous(), TINY)  # sxs: sx · Σ codes a group
        w4a8_kernels.launch(xq, sx, sxs, self.packed, self.scales, self.zeros, y, offsets, row_index=row_index,
                            swiglu=act == "swiglu", row_scale=row_scale, row_dest=row_dest)
        return y

    def extra_repr(self) -> str:
        return f"{self.format}, experts={self.num_experts}, out={self.out_features}, in={self.in_features}"


@functools.cache
def _kernel_runs_on(device: torch.device) -> bool:
    # cached: the engine asks twice per layer per forward
    return device.type == "cuda" and torch.cuda.is_available() and sm90(torch.cuda.get_device_capability(device))


def install_w4a8(model: nn.Module) -> int:
    """Swap every GroupedMoE's Int4Experts (gate_up, down) for Int4W4A8Experts; how many were swapped. Projections
    the checkpoint kept in 16 bits (DenseExperts) stay as they are. None at all is a ConfigError: W4A8 would then
    be a W4A16 run under another name."""
    swapped = 0
    for name, moe in [(n, m) for n, m in model.named_modules() if isinstance(m, GroupedMoE)]:
        for attr in ("gate_up", "down"):
            experts = getattr(moe, attr)
            if isinstance(experts, Int4Experts):
                setattr(moe, attr, Int4W4A8Experts.from_int4(experts, f"{name}.{attr}"))
                swapped += 1
    if not swapped:
        raise ConfigError(f"{FLAG}: the model has no int4 experts in quantbench's grouped-MoE engine to run as W4A8 "
                          "(its experts are in 16 bits, or not in the engine); leave --int4-activations at bf16")
    reset_paths(model)  # each layer's planned path now names the W4A8 kernel (or the emulation)
    return swapped
