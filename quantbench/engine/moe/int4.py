"""INT4 (W4A16) expert weights from AutoRound's `auto_round:auto_gptq` checkpoints, stacked per layer.

For one projection of E experts with K inputs and N outputs (gate_up: gate rows then up rows, as transformers):

    qweight int32   [E, K/8, N]   8 int4 codes per word, packed along K (layout below)
    scales  float16 [E, ⌈K/G⌉, N] kept as stored (fp16 even in a BF16 model); AutoRound's can be negative
    zeros   uint8   [E, ⌈K/G⌉, N] the zero points, unpacked from qzeros (which store zero point − 1)

    W[e, n, k] = scales[e, k//G, n] · (q[e, k, n] − zeros[e, k//G, n])

Packing along K, in blocks of `k_block` rows: word r of block b holds, in nibble j, row b·k_block + j·(k_block/8)
+ r. With k_block = 8 that is exactly auto_gptq's packing (row 8r + j); the regrouped tensors use k_block = 128
whenever K allows, so that the fused kernel loads each word once and nibble j is a contiguous 16-row slice: eight
K=16 tensor-core dots per block, no shuffles. Same bytes, same codes, only their order within a block differs.

Three ways to multiply: `dequantize` (vectorised torch, used by the CPU path and the GPU fallback), and on CUDA
`grouped_mm`, a Triton grouped GEMM that unpacks the int4 words in registers inside the K loop, so no BF16 copy
of the weights is ever written to memory. The kernels live in int4_kernels.py, which this module imports.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from quantbench.engine.moe import gluon_common, int4_wgmma
from quantbench.engine.moe.align import triton_available
from quantbench.engine.moe.engine import DenseExperts, ExpertsBase, stored_nbytes
from quantbench.engine.moe.int4_kernels import (
    FUSED_K_BLOCK,
    FUSED_KERNEL,
    dequantize_instead,
    fused_supported,
    int4_grouped_mm,
    pick_config,
    triton_dequantize,
)
from quantbench.errors import LoadError

_DEQUANT_CHUNK = 1 << 18  # elements per dequantize chunk: the float32 scratch (1 MiB) stays in cache (see BENCHMARKS)


def _shifts(device: torch.device, dtype: torch.dtype = torch.int32) -> Tensor:
    return torch.arange(0, 32, 4, dtype=dtype, device=device)


def unpack_k(packed: Tensor, k_block: int = 8) -> Tensor:
    """int32 [..., K/8, N] packed along K (layout in the module doc) -> int32 codes [..., K, N]."""
    *lead, words, n = packed.shape
    sub = k_block // 8
    blocks = packed.reshape(*lead, words // sub, 1, sub, n)
    q = (blocks >> _shifts(packed.device).view(8, 1, 1)) & 0xF  # [..., blocks, 8, sub, N]
    return q.reshape(*lead, words * 8, n)


def pack_k(q: Tensor, k_block: int = 8) -> Tensor:
    """Inverse of unpack_k: codes 0..15 [..., K, N] -> int32 [..., K/8, N]."""
    *lead, k, n = q.shape
    sub = k_block // 8
    q = q.to(torch.int64).reshape(*lead, k // k_block, 8, sub, n)
    words = (q << _shifts(q.device, torch.int64).view(8, 1, 1)).sum(dim=-3)  # [..., blocks, sub, N]
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.reshape(*lead, k // 8, n)


def unpack_rows(packed: Tensor) -> Tensor:
    """auto_gptq's qweight [..., K/8, N] (row 8r + j in nibble j of word r) -> codes [..., K, N]."""
    return unpack_k(packed, 8)


def pack_rows(q: Tensor) -> Tensor:
    return pack_k(q, 8)


def unpack_cols(packed: Tensor) -> Tensor:
    """int32 [..., R, C] packed 8 nibbles per word along C -> int32 [..., R, 8C] (nibble j of word c = col 8c+j)."""
    q = (packed.unsqueeze(-1) >> _shifts(packed.device)) & 0xF
    return q.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def fused_layout(k: int) -> int:
    """The k_block regrouped tensors get: the kernel's layout when K is a multiple of it, else auto_gptq's."""
    return FUSED_K_BLOCK if k % FUSED_K_BLOCK == 0 else 8


class Int4Experts(ExpertsBase):
    """One projection of all E experts of a layer, int4 + fp16 scales + uint8 zero points, as buffers."""

    fused_kernel = FUSED_KERNEL
    fused_features = frozenset({"gather", "swiglu", "row_scale", "scatter"})

    def __init__(self, qweight: Tensor, scales: Tensor, zeros: Tensor, group_size: int, sym: bool, name: str = "",
                 k_block: int = 8):
        super().__init__()
        e, k8, n = qweight.shape
        groups = -(-k8 * 8 // group_size)
        for tname, t, dtype in (("qweight", qweight, torch.int32), ("zeros", zeros, torch.uint8)):
            if t.dtype != dtype:
                raise LoadError(f"{name}.{tname}: dtype {t.dtype}, expected {dtype}")
        if scales.shape != (e, groups, n) or zeros.shape != (e, groups, n):
            raise LoadError(f"{name}.scales/zeros: shapes {tuple(scales.shape)} / {tuple(zeros.shape)} do not match "
                            f"qweight {tuple(qweight.shape)} with group size {group_size} (expected {(e, groups, n)})")
        if (k8 * 8) % k_block:
            raise LoadError(f"{name}.qweight: {k8 * 8} inputs are not a multiple of the packing block {k_block}")
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("zeros", zeros.contiguous())
        self.num_experts, self.in_features, self.out_features = e, k8 * 8, n
        self.group_size, self.sym, self.k_block = group_size, sym, k_block
        self.format = f"int4-g{group_size}-{'sym' if sym else 'asym'}"
        self.ran_kernel: str | None = None  # the kernel the last grouped_mm ran (int4_wgmma or this file's)

    # -- building from a loaded auto-round checkpoint ------------------------------------------------------------
    @classmethod
    def from_quant_linears(cls, experts: list[list[nn.Module]], *, group_size: int, sym: bool, name: str) -> Int4Experts:
        """Stack per-expert QuantLinears; `experts[e]` is [gate_proj, up_proj] (concatenated along N) or [down_proj].
        The codes are repacked into the kernel's block layout when K allows (same bytes)."""
        qweights, scales, zeros = [], [], []
        for e, parts in enumerate(experts):
            qweights.append(torch.cat([_tensor(p, "qweight", f"{name}.{e}") for p in parts], dim=-1))
            scales.append(torch.cat([_tensor(p, "scales", f"{name}.{e}") for p in parts], dim=-1))
            zeros.append(torch.cat([_zeros_of(p, f"{name}.{e}") for p in parts], dim=-1))
        shapes = {tuple(q.shape) for q in qweights}
        if len(shapes) != 1:
            raise LoadError(f"{name}: experts have different qweight shapes {sorted(shapes)}")
        qweight = torch.stack(qweights)
        k_block = fused_layout(qweight.shape[1] * 8)
        if k_block != 8:
            qweight = torch.stack([pack_k(unpack_rows(q), k_block) for q in qweight])  # one expert at a time
        return cls(qweight, torch.stack(scales), torch.stack(zeros), group_size, sym, name, k_block)

    # -- the ExpertWeights contract ------------------------------------------------------------------------------
    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None, *, use_triton: bool = True) -> Tensor:
        """[E', N, K] in `dtype` (a transposed view of a contiguous [E', K, N]); in float32 math, by a Triton
        kernel on CUDA (one pass over the words) or vectorised torch in chunks."""
        qw, sc, zp = self.qweight, self.scales, self.zeros
        if experts is not None:
            qw, sc, zp = qw[experts], sc[experts], zp[experts]
        e, k, n, g = qw.shape[0], self.in_features, self.out_features, self.group_size
        out = torch.empty(e, k, n, dtype=dtype, device=qw.device)
        if use_triton and qw.is_cuda and triton_available() and e:
            return triton_dequantize(qw, sc, zp, g, self.k_block, out).transpose(-2, -1)
        if k % self.k_block == 0 and g % (self.k_block // 8) == 0 and k % g == 0:
            return dequantize_slices(qw, sc, zp, g, self.k_block, out).transpose(-2, -1)
        step = max(1, _DEQUANT_CHUNK // max(1, k * n))
        for i in range(0, e, step):
            q = unpack_k(qw[i : i + step], self.k_block)
            s, z = sc[i : i + step].float(), zp[i : i + step].float()
            if k % g == 0:  # broadcast over each group's rows
                w = (q.view(-1, k // g, g, n) - z.unsqueeze(2)) * s.unsqueeze(2)
            else:
                w = (q - z.repeat_interleave(g, dim=1)[:, :k]) * s.repeat_interleave(g, dim=1)[:, :k]
            out[i : i + step] = w.view(-1, k, n)
        return out.transpose(-2, -1)

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str, *, row_index: Tensor | None = None,
                   act: str | None = None, row_scale: Tensor | None = None,
                   row_dest: Tensor | None = None) -> Tensor | None:
        """The fused Triton kernel (see the engine's contract for row_index / act / row_scale / row_dest), or None."""
        if not (x_sorted.is_cuda and x_sorted.dtype in (torch.bfloat16, torch.float16) and triton_available()):
            return None
        if not fused_supported(self.in_features, self.group_size, self.k_block) or act not in (None, "swiglu"):
            return None
        rows = x_sorted.shape[0] if row_index is None else row_index.shape[0]
        if rows // 16 + self.num_experts > 65535:
            return None  # the M tiles live on grid axis 1, which CUDA caps at 65535
        config = pick_config(rows, self.num_experts, self.out_features, self.in_features, self.group_size,
                             act == "swiglu", x_sorted.device)
        if kernel == "auto" and dequantize_instead(config.get("KERNEL", "triton"), self.out_features, self.in_features,
                                                   rows, self.num_experts):
            return None  # compute-bound: one dequantized copy + a CUTLASS grouped GEMM wins (DEQUANT_FROM_ROWS)
        gluon = config.get("KERNEL") == "gluon"
        self.ran_kernel = gluon_common.kernel_name(int4_wgmma.KERNEL, config) if gluon else FUSED_KERNEL  # per run
        return int4_grouped_mm(x_sorted, self.qweight, self.scales, self.zeros, offsets, self.group_size, config,
                               row_index=row_index, swiglu=act == "swiglu", row_scale=row_scale, row_dest=row_dest)

    def extra_repr(self) -> str:
        return f"{self.format}, experts={self.num_experts}, out={self.out_features}, in={self.in_features}"


def dequantize_slices(qweight: Tensor, scales: Tensor, zeros: Tensor, group_size: int, k_block: int,
                      out: Tensor) -> Tensor:
    """[E, K, N] weights into `out`, one nibble slice at a time (vectorised torch: the CPU path). Slice j of a
    packed block is nibble j of its words, rows b·k_block + j·sub .. + sub, all in one group (group_size is a
    multiple of sub), so it takes one row of scales: q·s − z·s in float32, then rounded to out's dtype, bit for
    bit what (q − z)·s gives (each product is exact in float32: an fp16 scale times a 4-bit integer). Against the
    whole-block version (unpack every nibble, then subtract and multiply full-size arrays) the working arrays are an
    eighth the size and stay in cache: 1.6x faster on 2 CPU threads at the 30B shape (16 experts' gate_up, 64-69
    against 101-112 ms)."""
    e, words, n = qweight.shape
    sub = k_block // 8
    blocks = words // sub
    first = torch.arange(blocks)[:, None] * k_block + torch.arange(8)[None, :] * sub  # each slice's first row
    group = (first // group_size).to(qweight.device)  # [blocks, 8]
    step = max(1, _DEQUANT_CHUNK // max(1, words * n))  # experts per chunk: each slice's arrays stay cache-sized
    for i in range(0, e, step):
        q = qweight[i : i + step].view(-1, blocks, sub, n)
        s = scales[i : i + step].float()
        c = zeros[i : i + step].float() * s
        o = out[i : i + step].view(-1, blocks, 8, sub, n)
        codes = torch.empty(q.shape, dtype=torch.int32, device=q.device)
        vals = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        for j in range(8):
            torch.bitwise_right_shift(q, 4 * j, out=codes).bitwise_and_(0xF)
            vals.copy_(codes)
            vals.mul_(s[:, group[:, j]].unsqueeze(2)).sub_(c[:, group[:, j]].unsqueeze(2))
            o[:, :, j].copy_(vals)
    return out


def _tensor(module: nn.Module, attr: str, name: str) -> Tensor:
    t = getattr(module, attr, None)
    if not isinstance(t, Tensor):
        raise LoadError(f"{name}.{attr}: missing; an int4 auto_round:auto_gptq expert needs qweight, qzeros and scales")
    return t


def _zeros_of(module: nn.Module, name: str) -> Tensor:
    """Zero points [K/G, N] as uint8, from qzeros int32 [K/G, N/8] that store zero point − 1."""
    qz = _tensor(module, "qzeros", name)
    return (unpack_cols(qz) + 1).to(torch.uint8)


# -- synthetic weights ------------------------------------------------------------------------------------------
def rtn_experts(weight: Tensor, group_size: int = 128) -> Int4Experts:
    """Symmetric round-to-nearest int4 of stacked weights [E, N, K] (zero point 8, fp16 scales), in chunks of
    experts. For synthetic real-shape runs, where quantizing random weights with AutoRound would take minutes."""
    e, n, k = weight.shape
    groups = -(-k // group_size)
    k_block = fused_layout(k)
    qweight = torch.empty(e, k // 8, n, dtype=torch.int32, device=weight.device)
    scales = torch.empty(e, groups, n, dtype=torch.float16, device=weight.device)
    step = max(1, _DEQUANT_CHUNK // max(1, k * n))
    for i in range(0, e, step):
        w = weight[i : i + step].float().transpose(-2, -1)  # [e', K, N]
        wg = torch.nn.functional.pad(w, (0, 0, 0, groups * group_size - k)).view(-1, groups, group_size, n)
        scale = (wg.abs().amax(dim=2) / 7).clamp(min=1e-8).half()  # [e', groups, N]
        q = torch.round(wg / scale.float().unsqueeze(2)).clamp(-8, 7) + 8
        qweight[i : i + step] = pack_k(q.view(-1, groups * group_size, n)[:, :k], k_block)
        scales[i : i + step] = scale
    zeros = torch.full((e, groups, n), 8, dtype=torch.uint8, device=weight.device)
    return Int4Experts(qweight, scales, zeros, group_size, sym=True, name="rtn", k_block=k_block)


# -- regrouping a loaded auto-round checkpoint ------------------------------------------------------------------
def _is_int4_linear(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, a, None), Tensor) for a in ("qweight", "qzeros", "scales"))


def regroup_experts(experts: nn.Module, *, sym: bool | None, name: str = "experts") -> tuple[nn.Module, nn.Module]:
    """(gate_up, down) for one layer from auto-round's per-expert MLPs (a ModuleList of gate_proj / up_proj /
    down_proj). Int4 QuantLinears become Int4Experts; projections left in 16 bits become DenseExperts. Bits,
    group size and (a)symmetry come from each QuantLinear, i.e. from the checkpoint's config, and are checked
    against the tensors: a mismatch is a LoadError naming the tensor."""
    if not isinstance(experts, nn.ModuleList) or not len(experts):
        raise LoadError(f"{name}: expected auto-round's per-expert ModuleList, found {type(experts).__name__}")
    out = []
    for projs in (("gate_proj", "up_proj"), ("down_proj",)):
        per_expert = [[getattr(mlp, p, None) for p in projs] for mlp in experts]
        flat = [m for parts in per_expert for m in parts]
        missing = [f"{name}.{e}.{p}" for e, parts in enumerate(per_expert) for p, m in zip(projs, parts, strict=True)
                   if m is None]
        if missing:
            raise LoadError(f"{missing[0]}: missing from the loaded experts ({len(missing)} projections missing)")
        label = f"{name}.*.{'+'.join(projs)}"
        if all(_is_int4_linear(m) for m in flat):
            _check_int4(flat, name, projs)
            group_size = int(flat[0].group_size)
            out.append(Int4Experts.from_quant_linears(per_expert, group_size=group_size, sym=bool(sym), name=label))
            if sym:
                bad = out[-1].zeros != 8
                if bool(bad.any()):
                    e = int(bad.nonzero()[0, 0])
                    raise LoadError(f"{name}.{e}.{projs[0]}.qzeros: the config says sym=true but the zero points are "
                                    "not 8; the checkpoint's config does not match its tensors")
        elif all(isinstance(getattr(m, "weight", None), Tensor) and m.weight.dim() == 2 for m in flat):
            weight = torch.stack([torch.cat([m.weight for m in parts], dim=0) for parts in per_expert])
            out.append(DenseExperts(weight))
        else:
            raise LoadError(f"{label}: experts mix int4 and 16-bit weights within one projection; "
                            "the grouped-MoE engine cannot stack them (run with --no-fast-moe)")
    return out[0], out[1]


def _check_int4(linears: list[nn.Module], name: str, projs: tuple[str, ...]) -> None:
    for i, m in enumerate(linears):
        where = f"{name}.{i // len(projs)}.{projs[i % len(projs)]}"
        bits, group = int(getattr(m, "bits", 4)), int(getattr(m, "group_size", 0) or 0)
        if bits != 4:
            raise LoadError(f"{where}: {bits}-bit weights; the int4 backend reads 4-bit auto_round:auto_gptq only")
        k, n = int(m.infeatures), int(m.outfeatures)
        if group <= 0:
            group = k
        groups = -(-k // group)
        expect = {"qweight": (k // 8, n), "scales": (groups, n), "qzeros": (groups, n // 8)}
        for attr, shape in expect.items():
            t = getattr(m, attr)
            if tuple(t.shape) != shape:
                raise LoadError(f"{where}.{attr}: shape {tuple(t.shape)}, expected {shape} for {k} inputs, {n} "
                                f"outputs, {bits} bits, group size {group} (as the config says)")
        g_idx = getattr(m, "g_idx", None)
        if isinstance(g_idx, Tensor) and not torch.equal(g_idx.cpu().long(), torch.arange(k) // group):
            raise LoadError(f"{where}.g_idx: groups out of input order (act-order); quantbench's int4 kernels and "
                            "auto-round's read them in input order: export with desc_act=false")
