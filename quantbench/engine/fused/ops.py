"""RMSNorm and rotary embedding as one Triton kernel each, and q/k/v projections as one GEMM, for every backend's
transformers model on a GPU.

Why: transformers writes both as chains of small PyTorch ops. At the Qwen3-30B-A3B shape one decoder layer runs
four RMSNorms (input, post-attention, q_norm, k_norm) of about 8 kernels each and a rotary embedding of about 14
(mul, neg, cat, add per tensor): about 140 µs of GPU time per layer that a CUDA graph cannot hide (measured with
`benchmarks/model_profile.py` on the H200), more than the attention's own GEMMs. One kernel per op does the
same arithmetic:

- RMSNorm: `weight * (x * rsqrt(mean(x²) + eps)).to(x.dtype)` in float32, rounded where transformers rounds.
  The sum of squares is reduced in a different order than PyTorch's, so a result can differ in the last bit.
- rotary: `q * cos + rotate_half(q) * sin` with each product and the sum rounded to q's dtype, as PyTorch's op
  chain rounds them: bit-identical.
`benchmarks/fused_ops_check.py` measures both against transformers on a GPU (identical elements, time).

q_proj, k_proj and v_proj are three cuBLAS GEMMs per layer; at the 30B shape k and v (N=512) run far below the
GPU's rate (q 16.8 µs, k and v 12.9 µs together, `benchmarks/model_profile.py`). `fuse_qkv` makes them one GEMM
over one weight of which the three Parameters are views (see `_FusedQKV`).

`install(model)` (in quantbench.engine.fused) swaps them in only on CUDA and only after a probe on the model's own
device and dtypes shows the kernel matches the module it replaces (a norm of another form, e.g. `(1 + weight)`,
fails the probe and is left alone). The run records what was swapped (kernel path `+fused rmsnorm+rope+qkv`,
extra.fused_ops); `--fused-ops off` keeps transformers' ops. Every variant of a comparison runs the same ops, so
parity figures are unaffected either way.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from quantbench.engine import pdl
from quantbench.engine.triton_common import interpreting, norm_tile, tl, triton

if triton is not None:  # what this file's kernels call (Triton resolves a callee in these globals)
    from quantbench.engine.triton_common import round_bf16  # float32 -> nearest bfloat16 (integer ops)

MODES = ("auto", "off")
_PATCHED = "_quantbench_fused"


@functools.cache
def _kernels() -> tuple[Any, Any]:
    @triton.jit
    def rounded(x, IS_BF16: tl.constexpr, dt: tl.constexpr):
        """x rounded to the tensor dtype and back to float32. For bfloat16 in integer arithmetic (round_bf16):
        measured on the H200, Triton drops a float32 -> bfloat16 -> float32 cast pair in the rotary kernel, and
        the sum is then rounded once instead of after each product as PyTorch does (86% of elements identical)."""
        if IS_BF16:
            return round_bf16(x)
        else:
            return x.to(dt).to(tl.float32)

    # Triton resolves a jitted callee through the caller's module globals
    pdl_open = pdl.triton_open()  # the first statement of each kernel here (quantbench.engine.pdl)
    globals().update(rounded=rounded, pdl_open=pdl_open)

    @triton.jit
    def rmsnorm_kernel(x_ptr, r_ptr, sum_ptr, w_ptr, y_ptr, R, stride_o, stride_h, eps, H: tl.constexpr,
                       N: tl.constexpr, N_P2: tl.constexpr, BLOCK_R: tl.constexpr, IS_BF16: tl.constexpr,
                       RESIDUAL: tl.constexpr, PDL: tl.constexpr):
        pdl_open(PDL)  # launched early (quantbench.engine.pdl): wait for the kernel before, first
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, N_P2)
        mask = (rows < R)[:, None] & (cols < N)[None, :]
        if H == 1:  # evenly spaced rows
            src = rows.to(tl.int64) * stride_o
        else:  # row r is head r % H of token r // H: q's slice of the fused q/k/v output, read where it lies
            src = (rows // H).to(tl.int64) * stride_o + (rows % H).to(tl.int64) * stride_h
        x = tl.load(x_ptr + src[:, None] + cols[None, :], mask=mask, other=0.0)
        xf = x.to(tl.float32)
        if RESIDUAL:  # the decoder's `residual + x` first, rounded as torch's add rounds: the new residual stream
            dst = rows[:, None].to(tl.int64) * N + cols[None, :]
            xf = rounded(xf + tl.load(r_ptr + dst, mask=mask, other=0.0).to(tl.float32), IS_BF16, x.dtype)
            tl.store(sum_ptr + dst, xf.to(x.dtype), mask=mask)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) * (1.0 / N) + eps)
        normed = rounded(xf * rstd[:, None], IS_BF16, x.dtype)  # rounded to the input dtype, as transformers
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = (w[None, :] * normed).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], y, mask=mask)

    @triton.jit
    def rotate(x_ptr, o_ptr, w_ptr, eps, b, t, c1, c2, s1, s2, sx_b, sx_h, sx_t, T, H: tl.constexpr,
               H_P2: tl.constexpr, HALF: tl.constexpr, IS_BF16: tl.constexpr, NORM: tl.constexpr):
        h = tl.arange(0, H_P2)[:, None]
        d = tl.arange(0, HALF)[None, :]
        mask = h < H
        src = x_ptr + b * sx_b + h * sx_h + t * sx_t + d
        x1 = tl.load(src, mask=mask, other=0.0)
        x2 = tl.load(src + HALF, mask=mask, other=0.0)
        dt = x1.dtype
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        if NORM:  # q_norm / k_norm over each head's 2 * HALF values first, rounded where rmsnorm_kernel rounds
            rstd = tl.math.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) * (0.5 / HALF) + eps)[:, None]
            w1 = tl.load(w_ptr + d).to(tl.float32)
            w2 = tl.load(w_ptr + HALF + d).to(tl.float32)
            f1 = rounded(w1 * rounded(f1 * rstd, IS_BF16, dt), IS_BF16, dt)
            f2 = rounded(w2 * rounded(f2 * rstd, IS_BF16, dt), IS_BF16, dt)
        # q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1); every op rounds to q's dtype
        o1 = (rounded(f1 * c1, IS_BF16, dt) + rounded(-f2 * s1, IS_BF16, dt)).to(dt)
        o2 = (rounded(f2 * c2, IS_BF16, dt) + rounded(f1 * s2, IS_BF16, dt)).to(dt)
        dst = o_ptr + ((b * T + t) * H + h) * (2 * HALF) + d  # [B, T, H, D] in memory (see apply_rope)
        tl.store(dst, o1, mask=mask)
        tl.store(dst + HALF, o2, mask=mask)

    globals()["rotate"] = rotate

    @triton.jit
    def rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, qw_ptr, kw_ptr, eps_q, eps_k, T,
                    sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sc_b, sc_t, ss_b, ss_t,
                    HQ: tl.constexpr, HQ_P2: tl.constexpr, HK: tl.constexpr, HK_P2: tl.constexpr, HALF: tl.constexpr,
                    IS_BF16: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
        pdl_open(PDL)
        pid = tl.program_id(0)
        b, t = pid // T, pid % T
        d = tl.arange(0, HALF)
        c1 = tl.load(cos_ptr + b * sc_b + t * sc_t + d).to(tl.float32)
        c2 = tl.load(cos_ptr + b * sc_b + t * sc_t + HALF + d).to(tl.float32)
        s1 = tl.load(sin_ptr + b * ss_b + t * ss_t + d).to(tl.float32)
        s2 = tl.load(sin_ptr + b * ss_b + t * ss_t + HALF + d).to(tl.float32)
        rotate(q_ptr, qo_ptr, qw_ptr, eps_q, b, t, c1[None, :], c2[None, :], s1[None, :], s2[None, :], sq_b, sq_h,
               sq_t, T, HQ, HQ_P2, HALF, IS_BF16, NORM)
        rotate(k_ptr, ko_ptr, kw_ptr, eps_k, b, t, c1[None, :], c2[None, :], s1[None, :], s2[None, :], sk_b, sk_h,
               sk_t, T, HK, HK_P2, HALF, IS_BF16, NORM)

    return rmsnorm_kernel, rope_kernel


def _rows(x: Tensor) -> tuple[Tensor, int, int, int]:
    """x [..., H, N] as the kernel's rows, without a copy wherever the leading dims merge: (x as [outer, H, N],
    heads per outer row, outer stride, head stride). q_proj's slice of the fused output, viewed [B, T, H, D], has a
    row stride of (H + 2·Hkv)·D, so `reshape(-1, N)` would copy it. Evenly spaced rows are passed as H = 1: the
    kernel then indexes as before (H is a constexpr: measured on the H200, a runtime division cost 9% of a q_norm)."""
    x3 = x.reshape(-1, x.shape[-2] if x.dim() > 1 else 1, x.shape[-1])
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    outer, h, _ = x3.shape
    if h == 1:
        return x3, 1, x3.stride(0), 0
    if outer == 1 or x3.stride(0) == h * x3.stride(1):
        return x3, 1, x3.stride(1), 0
    return x3, h, x3.stride(0), x3.stride(1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' RMSNorm (`weight * normed.to(x.dtype)`) over the last dimension, one kernel."""
    return _rms_norm(x, weight, eps, None)[0]


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(residual + x), residual + x) in one kernel, the sum rounded as torch's add rounds it: the decoder
    layer's `residual + attention` and the norm after it, the same bits as the two ops."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual {list(residual.shape)} {residual.dtype} does not fit x {list(x.shape)} {x.dtype}")
    return _rms_norm(x.contiguous(), weight, eps, residual.contiguous())


def _rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None) -> tuple[Tensor, Tensor | None]:
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    total = None if residual is None else torch.empty_like(residual)
    if not x.numel():
        return out, total
    x3, h, stride_o, stride_h = _rows(x)
    rows = x3.shape[0] * x3.shape[1]
    n_p2, block_r, warps = norm_tile(n)
    _kernels()[0][(triton.cdiv(rows, block_r),)](x3, residual, total, weight, out, rows, stride_o, stride_h,
                                                 float(eps), H=h, N=n, N_P2=n_p2, BLOCK_R=block_r,
                                                 IS_BF16=x.dtype == torch.bfloat16, RESIDUAL=residual is not None,
                                                 num_warps=warps, **pdl.launch_args(x.device))
    return out, total


def apply_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor,
               norms: tuple[nn.Module, nn.Module] | None = None) -> tuple[Tensor, Tensor]:
    """q, k [B, H, T, D] (any strides, last dim contiguous), cos/sin [B or 1, T, D]: rotated q, k, as [B, H, T, D]
    views of [B, T, H, D] memory: the layout q_proj's output has and attention's output keeps, so that the
    `transpose(1, 2).contiguous()` after scaled_dot_product_attention copies nothing. With `norms` (q_norm,
    k_norm: RMSNorms over D) each head is normalized first, in the same launch."""
    b, hq, t, d = q.shape
    hk = k.shape[1]
    qo = torch.empty(b, t, hq, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    ko = torch.empty(b, t, hk, d, dtype=k.dtype, device=k.device).transpose(1, 2)
    # cos / sin of one row of positions ([1, T, D], no position_ids given) serve every sequence: batch stride 0
    sc_b, ss_b = (0, 0) if cos.shape[0] == 1 else (cos.stride(0), sin.stride(0))
    qw, kw, eps_q, eps_k = (None, None, 0.0, 0.0) if norms is None else (
        norms[0].weight, norms[1].weight, float(norms[0].variance_epsilon), float(norms[1].variance_epsilon))
    if b * t:
        _kernels()[1][(b * t,)](q, k, cos, sin, qo, ko, qw, kw, eps_q, eps_k, t, q.stride(0), q.stride(1),
                                q.stride(2), k.stride(0), k.stride(1), k.stride(2), sc_b, cos.stride(1), ss_b,
                                sin.stride(1), HQ=hq, HQ_P2=triton.next_power_of_2(hq), HK=hk,
                                HK_P2=triton.next_power_of_2(hk), HALF=d // 2, IS_BF16=q.dtype == torch.bfloat16,
                                NORM=norms is not None, num_warps=4, **pdl.launch_args(q.device))
    return qo, ko


def rope_fits(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> bool:
    d = q.shape[-1] if q.dim() == 4 else 0
    return (q.is_cuda and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.shape == cos.shape
            and q.dtype == k.dtype == cos.dtype == sin.dtype and d % 2 == 0 and (d // 2) & (d // 2 - 1) == 0
            and k.shape[-1] == d and cos.shape[-1] == d and q.shape[0] == k.shape[0] and cos.shape[0] in (1, q.shape[0])
            and q.shape[2] == k.shape[2] == cos.shape[1]
            and q.stride(-1) == k.stride(-1) == cos.stride(-1) == sin.stride(-1) == 1)


def _fused_rope(original):
    def apply_rotary_pos_emb(q, k, cos, sin, *args, unsqueeze_dim=1, **kwargs):
        if args or kwargs or unsqueeze_dim != 1 or not rope_fits(q, k, cos, sin):
            return original(q, k, cos, sin, *args, unsqueeze_dim=unsqueeze_dim, **kwargs)
        return apply_rope(q, k, cos, sin)

    setattr(apply_rotary_pos_emb, _PATCHED, original)
    return apply_rotary_pos_emb


def is_rms_norm(module: nn.Module) -> bool:
    return (type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), Tensor)
            and module.weight.dim() == 1 and isinstance(getattr(module, "variance_epsilon", None), float))


def _norm_matches(module: nn.Module, dtype: torch.dtype) -> bool:
    """The kernel against the module's own forward, on its own weight and device: within one rounding step."""
    gen = torch.Generator(device=module.weight.device).manual_seed(0)
    x = torch.randn(37, module.weight.shape[0], generator=gen, device=module.weight.device).to(dtype) * 3
    want, got = module(x), rms_norm(x, module.weight, module.variance_epsilon)
    if want.shape != got.shape or want.dtype != got.dtype:
        return False
    return bool(torch.allclose(got.float(), want.float(), rtol=2 ** -6, atol=1e-5))


def _rope_matches(fn, device: torch.device) -> bool:
    """The kernel against transformers' function on random bf16 inputs: every element identical."""
    gen = torch.Generator(device=device).manual_seed(0)
    # transposed views [B, H, T, D], as attention makes them
    q = torch.randn(2, 7, 4, 64, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 7, 2, 64, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
    cos, sin = (torch.randn(2, 7, 64, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
    want, got = fn(q, k, cos, sin), apply_rope(q, k, cos, sin)
    return all(torch.equal(w, g) for w, g in zip(want, got, strict=True))


def probe(op: str, check, *args) -> bool:
    """A probe whose kernel fails to compile or run (an unfamiliar GPU, a Triton without it) keeps the original
    op, says why, and lets the run go on: what was swapped is recorded on the run (extra.fused_ops)."""
    try:
        with torch.no_grad():
            return check(*args)
    except Exception as exc:  # noqa: BLE001 - any failure of an optional kernel means: keep the original
        warnings.warn(f"fused {op} kernel failed its probe ({type(exc).__name__}: {str(exc)[:200]}); "
                      "keeping transformers' op", RuntimeWarning, stacklevel=3)
        return False


_QKV = "_quantbench_qkv"  # set on each of the three projections: the _FusedQKV they run
_QKV_TOL = 2 * torch.finfo(torch.bfloat16).eps  # of the output's largest magnitude: two bf16 ulps (2^-6)


def _version(x: Tensor) -> int | None:
    # inference tensors keep no version counter: the same object is then taken as unchanged
    return None if x.is_inference() else x._version


def _adjacent(parts: list[Tensor]) -> Tensor | None:
    """The parts as one tensor along dim 0 (a view), while they still lie back to back in one storage as fuse_qkv
    left them; None once something replaced them (`.to()`, `load_state_dict(assign=True)`): each then runs alone."""
    first = parts[0]
    end, storage = first.data_ptr(), first.untyped_storage().data_ptr()
    for p in parts:
        if (p.dtype != first.dtype or not p.is_contiguous() or p.data_ptr() != end
                or p.untyped_storage().data_ptr() != storage):
            return None
        end += p.numel() * p.element_size()
    return first.as_strided((sum(p.shape[0] for p in parts), *first.shape[1:]), first.stride(),
                            first.storage_offset())


class _FusedQKV:
    """q_proj's call runs one GEMM for q, k and v and keeps the k and v columns; k_proj / v_proj hand them out when
    called next on the same, unchanged input tensor (as attention calls them). Any other call computes its own
    projection, so another order, another input (cross-attention) or an input changed in place stays correct."""

    def __init__(self, q: nn.Linear, k: nn.Linear, v: nn.Linear):
        self.projs = (q, k, v)
        self.sizes = [m.out_features for m in self.projs]
        self.x: Tensor | None = None
        self.version: int | None = None
        self.kept: dict[str, Tensor] = {}
        self.ptrs: list[int] = []
        self.joined: tuple[Tensor, Tensor | None] | None = None

    def _fused(self) -> tuple[Tensor, Tensor | None] | None:
        """The fused weight and bias, or None to run three GEMMs. Validated once and then only by data pointers
        (the full check costs more host time than the GEMM it saves, and eager runs are launch-bound): while the
        views are held, no other tensor can take their addresses, so a pointer change means something replaced
        the weights (`.to()`, `load_state_dict(assign=True)`), and the old storage is let go here."""
        params = [m._parameters.get(name) for name in ("weight", "bias") for m in self.projs]
        if torch.is_grad_enabled() and params[0].requires_grad:
            return None  # autograd through the fused view would not reach k's and v's Parameters
        ptrs = [0 if p is None else p.data_ptr() for p in params]
        if ptrs != self.ptrs:
            self.ptrs, self.joined = ptrs, None
            with torch.inference_mode(False):  # a view made in inference mode is not for use outside it
                w, biases = _adjacent(params[:3]), params[3:]
                b = None if any(t is None for t in biases) else _adjacent(biases)
                if w is not None and (b is not None or all(t is None for t in biases)):
                    self.joined = (w, b)
        return self.joined

    def q_forward(self, x: Tensor) -> Tensor:
        fused = self._fused()
        if fused is None:
            self.x, self.kept = None, {}
            return F.linear(x, self.projs[0].weight, self.projs[0].bias)
        q, k, v = F.linear(x, *fused).split(self.sizes, dim=-1)
        self.x, self.version, self.kept = x, _version(x), {"k": k, "v": v}
        return q

    def take(self, name: str, x: Tensor) -> Tensor:
        out = self.kept.pop(name, None)
        if out is None or x is not self.x or _version(x) != self.version:
            m = self.projs[1 if name == "k" else 2]
            out = F.linear(x, m.weight, m.bias)
        if not self.kept:
            self.x = None  # both handed out: hold no tensor past this layer
        return out


def _qkv_of(attention: nn.Module) -> tuple[Any, Any, Any]:
    return tuple(getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj"))


def _fusable(q: Any, k: Any, v: Any) -> bool:
    """Plain nn.Linear (quantized subclasses have their own forward), one dtype and device, one input, biases all or
    none, and no instance forward of someone else's (accelerate's hooks put theirs there)."""
    projs = (q, k, v)
    if any(type(m) is not nn.Linear or "forward" in vars(m) for m in projs):
        return False
    w = q.weight
    tensors = [m.weight for m in projs] + [m.bias for m in projs if m.bias is not None]
    return (all(t.dtype == w.dtype and t.device == w.device for t in tensors)
            and k.in_features == v.in_features == q.in_features
            and sum(m.bias is None for m in projs) in (0, 3))


def _join_parameters(projs: tuple[nn.Linear, ...]) -> None:
    """Each projection's weight (and bias) replaced by a view of one concatenated tensor."""
    # install may run under inference_mode (benchmarks/model_profile.py): the Parameters stay ordinary tensors
    with torch.inference_mode(False), torch.no_grad():
        for name in ("weight", "bias"):
            parts = [getattr(m, name) for m in projs]
            if parts[0] is None:
                continue
            joined = torch.cat([p.detach() for p in parts])
            for m, p, view in zip(projs, parts, joined.split([p.shape[0] for p in parts]), strict=True):
                param = nn.Parameter(view, requires_grad=p.requires_grad)
                param.__dict__.update(p.__dict__)
                setattr(m, name, param)


def fuse_qkv(attention: nn.Module) -> bool:
    """Make the module's q_proj, k_proj, v_proj one GEMM where they qualify (_fusable): their weights (and biases)
    become views of one concatenated tensor, so memory is not doubled and state_dict keeps its names and shapes.
    True when fused (now or before)."""
    projs = _qkv_of(attention)
    state = getattr(projs[0], _QKV, None)
    if isinstance(state, _FusedQKV) and state.projs == projs:
        return True
    if not _fusable(*projs):
        return False
    _join_parameters(projs)
    if projs[0].weight.is_cuda:
        # the three weights' freed blocks cannot hold the joined one: released here (nothing refers to them once
        # _join_parameters returns), layer by layer, or the allocator keeps them all on top of the weights (a BF16
        # run at the 30B shape peaked 0.9 GiB higher with the fusion, about 48 x 20 MiB)
        torch.cuda.empty_cache()
    state = _FusedQKV(*projs)
    q, k, v = projs
    q.forward = state.q_forward
    k.forward = functools.partial(state.take, "k")
    v.forward = functools.partial(state.take, "v")
    for m in projs:
        setattr(m, _QKV, state)
    return True


def unfuse_qkv(attention: nn.Module) -> None:
    """Back to three GEMMs (the weights stay views of the one tensor: the same values, the same memory)."""
    for m in _qkv_of(attention):
        if isinstance(getattr(m, _QKV, None), _FusedQKV):
            del m.forward
            delattr(m, _QKV)


def _qkv_matches(attention: nn.Module) -> bool:
    """The fused projections against three separate GEMMs on the module's own weights. cuBLAS picks a kernel per
    shape, so the fused GEMM may round some elements differently: accepted within _QKV_TOL of the output's largest
    magnitude (a wrong slice or weight is off by about the magnitude itself); beyond it the probe fails, saying so."""
    projs = _qkv_of(attention)
    w = projs[0].weight
    gen = torch.Generator(device=w.device).manual_seed(0)
    x = torch.randn(2, 19, w.shape[1], generator=gen, device=w.device).to(w.dtype)
    got = [m(x) for m in projs]
    if got[1].untyped_storage().data_ptr() != got[0].untyped_storage().data_ptr():
        raise RuntimeError("k_proj did not take its columns of the fused GEMM")
    for name, g, m in zip("qkv", got, projs, strict=True):
        want = F.linear(x, m.weight, m.bias)
        if g.shape != want.shape or g.dtype != want.dtype:
            raise RuntimeError(f"fused {name}_proj gives {g.dtype} {list(g.shape)}, not {want.dtype} {list(want.shape)}")
        err, scale = float((g.float() - want.float()).abs().max()), float(want.float().abs().max())
        if not err <= _QKV_TOL * scale:
            raise RuntimeError(f"fused {name}_proj differs from its own GEMM by {err:.3g} (max |value| {scale:.3g}, "
                               f"tolerance {_QKV_TOL:.3g} of it)")
    return True


def swap_per_class(op: str, modules, swap, check, undo, already=lambda m: False) -> bool:
    """swap(m) on every module it takes (it returns False for one it does not); the first module of each class is
    probed after its swap (check(m), through probe) and, when that fails, undone (undo(m)), and no other module of
    that class is swapped. `already(m)`: swapped by an earlier call, counted as passed without a probe. True when
    some class passed."""
    passed: dict[type, bool] = {}
    for m in modules:
        if passed.get(type(m)) is False:
            continue
        if already(m):
            passed.setdefault(type(m), True)
            continue
        if not swap(m):
            continue
        if type(m) not in passed:
            passed[type(m)] = probe(op, check, m)
            if not passed[type(m)]:
                undo(m)
    return any(passed.values())


_NORMED = "_quantbench_normed"  # (x, norm(x)) handed over by the kernel that made x (quantbench.engine.fused.layer)


def hand_normed(norm: nn.Module, x: Tensor, normed: Tensor) -> None:
    """Give `norm` its result for `x`, computed where x was: its next call on that very tensor returns it."""
    norm.__dict__[_NORMED] = (x, normed)


def _norm_forward(module: nn.Module, hidden_states: Tensor) -> Tensor:
    handed = module.__dict__.pop(_NORMED, None)
    if handed is not None and handed[0] is hidden_states:
        return handed[1]
    if not hidden_states.is_cuda and not interpreting():  # (the tests run the kernel on CPU tensors)
        return type(module).forward(module, hidden_states)
    return rms_norm(hidden_states, module.weight, module.variance_epsilon)
