"""The grouped-MoE engine: one MoE layer's experts as one grouped GEMM per projection, for every weight format.

A transformers MoE block (Qwen3-MoE and its relatives) routes each token to top-k of E experts and then loops
over the experts in Python. This engine replaces the whole block (`layer.mlp`) with `GroupedMoE`:

    route (the block's own BF16 router weight, transformers' exact math)
      -> sort the (token, expert) pairs by expert -> offsets (cumulative rows per expert, int32)
      -> grouped GEMM gate_up -> act(gate) * up -> grouped GEMM down
      -> multiply by the routing weights -> un-sort -> sum over the k experts of each token

Each projection's weights stay in their compressed format; a format is a small decoder. The contract below is
stable: the int4, nvfp4 and fp8 formats (quantbench.engine.moe.int4 / nvfp4 / fp8) all build on it.

    class ExpertWeights(Protocol):   # one projection (gate_up or down) of all E experts of one layer
        num_experts: int; out_features: int; in_features: int
        format: str                  # "int4-g128-sym", "nvfp4", "fp8", "bf16", ...
        fused_kernel: str | None     # name of the fused path grouped_mm() runs ("triton-fused-int4"), or None;
                                     # optional `ran_kernel`: the kernel the last grouped_mm call ran, where a
                                     # format has several (int4: "gluon-wgmma-int4" on sm_90): recorded instead
        def dequantize(self, dtype, experts: Tensor | None = None) -> Tensor
            # [E or len(experts), out, in] in `dtype` (may be a transposed view)
        def nbytes(self) -> int      # bytes of the stored tensors, measured from the tensors
        def grouped_mm(self, x_sorted, offsets, kernel) -> Tensor | None
            # fused path: rows of x_sorted [S, in] sorted by expert, offsets [E] int32 cumulative row counts
            # (torch._grouped_mm's `offs`); returns [S, out] in x's dtype, or None when no fused kernel applies
            # here (then the engine dequantizes and runs torch._grouped_mm / the CPU path)
    Implementations are nn.Modules that keep their tensors as buffers, so `.to(device)`, `model.buffers()` and
    memory figures see them; `DenseExperts` below is the reference implementation (plain weights).
    Formats subclass `ExpertsBase`, which declares each optional feature below with the default of a format
    that lacks it (no fused extras, no input quantization).
    Optional, additive: a format may declare `fused_features` (a set of "gather", "swiglu", "row_scale", "scatter") and then
    accept keyword arguments to grouped_mm: row_index=[S] int32 (x is the *unsorted* [T, in]; row r reads
    x[row_index[r]]), act="swiglu" (return silu(gate) * up, [S, out/2]), row_scale=[S] (multiply row r),
    row_dest=[S] int32 (write row r to row row_dest[r] of the result: a permutation). The
    engine passes them only to formats that declare them, so formats without them need not change.
    Optional: `quantize_input(x_sorted, offsets) -> x_sorted` (W4A4 / W8A8 formats) emulates activation
    quantization before the grouped GEMM; such formats get fused extras only where
    `quantizes_input_in_kernel(device)` says their kernel rounds its own inputs (FP8 on FP8 tensor cores), or
    where `input_quant_rowwise` says a row's quantization depends on that row alone (then the engine quantizes
    the unsorted tokens once and the kernel gathers the quantized rows: NVFP4 with one input scale).
    Optional: "codes" in `fused_features` with `codes_scale(device) -> Tensor [1] | None` (FP8 W8A8): where down
    returns its one input scale and gate_up takes "codes" too, gate_up gets out_scale=that scale and returns h as
    float8_e4m3fn codes, which down's grouped_mm then takes as x (a bf16 model only; the same bits as bf16 h).

    class GroupedMoE(nn.Module):     # replaces one MoE block (`layer.mlp`)
        GroupedMoE(gate, gate_up, down, *, top_k, norm_topk_prob, act="silu", kernel="auto", gate_bias=False)
        forward(hidden_states [..., H], residual=None, norm=None) -> [..., H]   # + residual, when given
                                                    # with norm too: (that, norm(that)) from one pass
        experts_forward(x [T, H], top_k_index [T, k], top_k_weights [T, k], residual=None, norm=None) -> [T, H]
        kernel_path: str             # what ran last ("cpu-vectorised", "triton-fused-int4", "dequant+grouped_mm")

    def install_grouped_moe(model, make_weights, kernel="auto", *, layout: MoeLayout) -> str
        # layout: where the MoE blocks are and how they route, from the model's family (quantbench.models.families)
        # make_weights(layer_index, experts_module) -> (gate_up, down); swaps every MoE block, returns the path
    MoeLayout(blocks, top_k, norm_topk_prob, hidden_act, gate_bias, shared_experts)  # what the family says
    def experts_nbytes(model) -> int                 # bytes of every GroupedMoE's expert tensors
    def kernel_paths_ran(model) -> str               # every path the forwards so far took
    def reset_paths(model) -> None                   # forget them (after a calibration pass or a probe)

`kernel`: "auto" (fused where the format has a kernel for this device, else dequantize + grouped GEMM),
"fused" (fail if there is none), "grouped_mm" (always dequantize + grouped GEMM).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantbench.engine.moe.align import group_by_expert, triton_available
from quantbench.engine.moe.routing import route_fits, route_topk, sum_slots, sum_slots_norm
from quantbench.errors import ConfigError, UnsupportedError

KERNELS = ("auto", "fused", "grouped_mm")
CPU_PATH = "cpu-vectorised"
DEQUANT_PATH = "dequant+grouped_mm"


@runtime_checkable
class ExpertWeights(Protocol):
    num_experts: int
    out_features: int
    in_features: int
    format: str
    fused_kernel: str | None

    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None) -> Tensor: ...

    def nbytes(self) -> int: ...

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str) -> Tensor | None: ...


class ExpertsBase(nn.Module):
    """The base of every format's expert weights: each optional feature of the contract above, declared with
    the default of a format that lacks it, so the engine reads attributes instead of probing for them."""

    fused_kernel: str | None = None  # the fused path grouped_mm runs; None: dequantize + grouped GEMM only
    fused_features: frozenset[str] = frozenset()  # the fused extras grouped_mm accepts ("gather", "swiglu", ...)
    ran_kernel: str | None = None  # the kernel the last grouped_mm ran, where a format has several
    input_quant_rowwise: bool = False  # a row's activation quantization depends on that row alone
    # W4A4 / W8A8 formats define quantize_input(x_sorted, offsets) -> x_sorted; None: weights-only formats
    quantize_input: Callable[[Tensor, Tensor], Tensor] | None = None

    def quantizes_input_in_kernel(self, device: torch.device) -> bool:
        """Whether the fused kernel on `device` rounds its own inputs (then the engine does not quantize them)."""
        return False


def stored_nbytes(module: nn.Module) -> int:
    """Bytes of a module's own parameters and buffers, measured from the tensors."""
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return sum(t.numel() * t.element_size() for t in tensors)


class DenseExperts(ExpertsBase):
    """Plain (unquantized) stacked expert weights [E, out, in]: the reference format, and BF16's."""

    fused_kernel = None

    def __init__(self, weight: Tensor):
        super().__init__()
        self.register_buffer("weight", weight.detach())
        self.num_experts, self.out_features, self.in_features = weight.shape
        self.format = str(weight.dtype).removeprefix("torch.").replace("bfloat16", "bf16")

    def dequantize(self, dtype: torch.dtype, experts: Tensor | None = None) -> Tensor:
        w = self.weight if experts is None else self.weight[experts]
        return w.to(dtype)

    def nbytes(self) -> int:
        return stored_nbytes(self)

    def grouped_mm(self, x_sorted: Tensor, offsets: Tensor, kernel: str) -> Tensor | None:
        return None


def _device_of(w: Any) -> torch.device:
    for t in list(w.buffers()) + list(w.parameters()):
        return t.device
    return torch.device("cpu")


# -- routing ----------------------------------------------------------------------------------------------------
def route(hidden: Tensor, gate_weight: Tensor, top_k: int, norm_topk_prob: bool, gate_bias: Tensor | None = None):
    """transformers' Qwen3MoeTopKRouter, op for op (so the same tokens pick the same experts with the same
    weights): logits in the hidden dtype, softmax in float32, top-k, optional renormalisation, cast back."""
    logits = F.linear(hidden, gate_weight, gate_bias)
    if logits.is_cuda and triton_available() and route_fits(logits, top_k):  # the same, in one kernel
        return route_topk(logits, top_k, norm_topk_prob)
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    top_value, top_index = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        top_value /= top_value.sum(dim=-1, keepdim=True)
    return top_value.to(logits.dtype), top_index


# -- grouped matmul over dequantized weights --------------------------------------------------------------------
def _grouped_matmul(x: Tensor, w_t: Tensor, offsets: Tensor) -> Tensor:
    """x [S, in] @ per-group w_t [G, in, out]; torch._grouped_mm where it has a kernel, else a loop."""
    if x.shape[0] == 0:
        return x.new_zeros(0, w_t.shape[-1])
    if x.device.type == "cpu" or x.dtype == torch.bfloat16:
        try:
            return torch._grouped_mm(x, w_t, offs=offsets)
        except (RuntimeError, NotImplementedError):
            pass  # an older GPU or torch without this kernel: the loop below is slow but right
    out = x.new_empty(x.shape[0], w_t.shape[-1])
    start = 0
    for g, end in enumerate(offsets.tolist()):
        if end > start:
            torch.mm(x[start:end], w_t[g], out=out[start:end])
        start = end
    return out


def _kernel_ran(w: ExpertsBase) -> str:
    """The fused kernel w's last grouped_mm ran: its `ran_kernel` where a format has several, else fused_kernel."""
    return w.ran_kernel or w.fused_kernel


class GroupedMoE(nn.Module):
    """One MoE block: the router stays the block's own (BF16) module; experts run as grouped GEMMs."""

    takes_residual = True  # forward(h, residual=r) returns r + forward(h) (quantbench.engine.fused.layer)

    def __init__(
        self,
        gate: nn.Module,
        gate_up: ExpertsBase,
        down: ExpertsBase,
        *,
        top_k: int,
        norm_topk_prob: bool,
        act: str | Callable[[Tensor], Tensor] = "silu",
        kernel: str = "auto",
        gate_bias: bool = False,
    ):
        super().__init__()
        if kernel not in KERNELS:
            raise ConfigError(f"grouped-MoE kernel {kernel!r}: use one of {', '.join(KERNELS)}")
        if gate_up.num_experts != down.num_experts or gate_up.out_features != 2 * down.in_features:
            raise ConfigError(
                f"gate_up [{gate_up.num_experts}, {gate_up.out_features}, {gate_up.in_features}] and down "
                f"[{down.num_experts}, {down.out_features}, {down.in_features}] do not fit together: gate_up must "
                "have 2 x down's inputs (gate rows then up rows) and the same number of experts"
            )
        self.gate = gate
        self.gate_up = gate_up
        self.down = down
        self.num_experts = gate_up.num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.gate_bias = gate_bias  # route adds gate.bias (the family's MoeLayout says whether there is one)
        self.kernel = kernel
        if isinstance(act, str):
            # lazy: transformers takes seconds to import, and backends import this module in the parent
            from transformers.activations import ACT2FN

            self._act_is_silu = act == "silu"
            act = ACT2FN[act]
        else:
            self._act_is_silu = False
        self.act_fn = act
        self.kernel_path = self.planned_path(_device_of(gate_up))
        self.paths_ran: set[str] = set()  # every path a forward took (a large batch may take another)

    def planned_path(self, device: torch.device) -> str:
        """The path forward() takes on `device` (before anything has run)."""
        paths = {self._path_for(w, device) for w in (self.gate_up, self.down)}
        return "+".join(sorted(paths))

    def _path_for(self, w: ExpertsBase, device: torch.device) -> str:
        if self.kernel != "grouped_mm" and device.type == "cuda" and w.fused_kernel:
            return w.fused_kernel
        if self.kernel == "fused":
            raise UnsupportedError(
                f"kernel 'fused': format {w.format} has no fused grouped kernel on {device.type}; "
                "use kernel='auto' or 'grouped_mm'"
            )
        return CPU_PATH if device.type == "cpu" else DEQUANT_PATH

    def forward(self, hidden_states: Tensor, residual: Tensor | None = None,
                norm: nn.Module | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The block's output; `residual + output` when `residual` is given (the decoder layer's add, fused into
        the sum over the k experts where that runs as a kernel: quantbench.engine.fused.layer); with `norm` too (an
        RMSNorm: the next layer's input norm), (residual + output, norm(residual + output)) from the same pass."""
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        weights, index = route(x, self.gate.weight, self.top_k, self.norm_topk_prob,
                                self.gate.bias if self.gate_bias else None)
        res = None if residual is None else residual.reshape(-1, shape[-1])
        out = self.experts_forward(x, index, weights, residual=res, norm=norm)
        if norm is None:
            return out.reshape(shape)
        return out[0].reshape(shape), out[1].reshape(shape)

    def experts_forward(self, x: Tensor, top_k_index: Tensor, top_k_weights: Tensor,
                        residual: Tensor | None = None, norm: nn.Module | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """transformers' grouped_mm_experts_forward, with each projection run by its own format (plus `residual`
        [T, H], when given, after the sum over the k experts; and with `norm`, that sum's norm too: forward)."""
        num_tokens, k = top_k_index.shape
        grouping = None
        if x.is_cuda and triton_available():  # two small kernels instead of a sort (quantbench.engine.moe.align)
            grouping = group_by_expert(top_k_index, top_k_weights, self.num_experts)
            offsets, counts, row_token, sample_weights = grouping.offsets, None, grouping.row_token, grouping.row_scale
        else:
            expert_sorted, perm = torch.sort(top_k_index.reshape(-1))
            sample_weights = top_k_weights.reshape(-1)[perm]
            if x.device.type == "cuda":
                # histc over ints, not bincount: no host sync, so the layer can be captured in a CUDA graph
                counts = torch.histc(expert_sorted.int(), bins=self.num_experts, min=0, max=self.num_experts - 1)
            else:
                counts = torch.bincount(expert_sorted, minlength=self.num_experts)
            offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
            row_token = (perm // k).int()

        paths: list[str] = []
        # gate_up: gather + grouped GEMM + SwiGLU in one fused kernel where the format has one; h as the down
        # kernel's E4M3 codes where both take them (FP8 with one input scale: half the bytes, rounded once)
        codes = self._codes_scale(x)
        h = self._fused(self.gate_up, x, offsets, paths, row_index=row_token, act="swiglu",
                        needs={"gather", "swiglu"} | ({"codes"} if codes is not None else set()),
                        **({"out_scale": codes} if codes is not None else {})) if self._act_is_silu else None
        if h is None:
            h = self._project(self.gate_up, x[row_token], counts, offsets, paths)
            gate, up = h.chunk(2, dim=-1)
            h = self.act_fn(gate) * up
        # down: the routing weights, and with a grouping the rows written straight back in (token, slot) order
        scatter = {}
        if grouping is not None and "scatter" in self.down.fused_features:
            scatter = {"row_dest": grouping.row_pair}
        weighted = self._fused(self.down, h, offsets, paths, row_scale=sample_weights,
                               needs={"row_scale", "scatter"} if scatter else {"row_scale"}, **scatter)
        if weighted is None:
            if h.dtype == torch.float8_e4m3fn:  # unreachable while _codes_scale checks what _fused does
                raise UnsupportedError(f"format {self.down.format}: its fused kernel declined E4M3 codes")
            scatter = {}
            weighted = self._project(self.down, h, counts, offsets, paths) * sample_weights.unsqueeze(-1)
        self.kernel_path = "+".join(sorted(set(paths)))
        self.paths_ran.update(paths)

        if not scatter:  # back to (token, slot) order
            if grouping is not None:
                weighted = weighted[grouping.pair_row]
            else:
                inv_perm = torch.empty_like(perm)
                inv_perm[perm] = torch.arange(perm.numel(), device=perm.device)
                weighted = weighted[inv_perm]
        # reshape + sum (not index_add_): deterministic, and the order transformers sums in
        fits = weighted.is_cuda and triton_available()  # one pass over weighted (quantbench.engine.moe.routing)
        same = residual is not None and weighted.dtype == x.dtype == residual.dtype
        if fits and norm is not None and same:
            return sum_slots_norm(weighted.view(num_tokens, k, -1), residual, norm.weight, norm.variance_epsilon)
        if fits and (residual is None or same):  # the residual added in the same pass
            out = sum_slots(weighted.view(num_tokens, k, -1), residual).to(x.dtype)
        else:
            out = (sum_slots(weighted.view(num_tokens, k, -1)) if fits
                   else weighted.view(num_tokens, k, -1).sum(dim=1)).to(x.dtype)
            out = out if residual is None else residual + out
        return out if norm is None else (out, norm(out))

    def _codes_scale(self, x: Tensor) -> Tensor | None:
        """The down projection's one input scale when gate_up can hand it h as E4M3 codes (both fused, both
        taking codes, a bf16 model), else None."""
        d, g = self.down, self.gate_up
        if (x.dtype != torch.bfloat16 or not self._act_is_silu
                or not {"codes", "row_scale"} <= d.fused_features
                or "codes" not in g.fused_features
                or self._path_for(d, x.device) != d.fused_kernel or self._path_for(g, x.device) != g.fused_kernel):
            return None
        return d.codes_scale(x.device)

    def _fused(self, w: ExpertsBase, x: Tensor, offsets: Tensor, paths: list[str], *, needs: set[str],
               **features: Any) -> Tensor | None:
        """The format's fused kernel with extra fused steps, when it declares them and runs here."""
        if self._path_for(w, x.device) != w.fused_kernel or not needs <= w.fused_features:
            return None
        quantize_input = w.quantize_input
        if quantize_input is not None and not w.quantizes_input_in_kernel(x.device):
            if not w.input_quant_rowwise:
                return None  # rows must be quantized by their expert's scale: _project, after the sort
            x = quantize_input(x, offsets)  # one scale for all rows: the tokens, before the kernel gathers them
        y = w.grouped_mm(x, offsets, self.kernel, **features)
        if y is not None:
            paths.append(_kernel_ran(w))
        return y

    def _project(self, w: ExpertsBase, x: Tensor, counts: Tensor, offsets: Tensor, paths: list[str]) -> Tensor:
        quantize_input = w.quantize_input  # W4A4 / W8A8 formats (nvfp4, fp8); None for the others
        path = self._path_for(w, x.device)
        # A native low-precision kernel quantizes its inputs itself (FP8 W8A8 on FP8 tensor cores): quantizing
        # them here first would only round them twice to the same codes.
        in_kernel = path == w.fused_kernel and w.quantizes_input_in_kernel(x.device)
        if quantize_input is not None and not in_kernel:  # emulate what their fake-quant forward applies
            x = quantize_input(x, offsets)
        if path == w.fused_kernel:
            y = w.grouped_mm(x, offsets, self.kernel)
            if y is not None:
                paths.append(_kernel_ran(w))
                return y
            if self.kernel == "fused":
                raise UnsupportedError(f"format {w.format}: its fused kernel declined these inputs ({x.dtype}, {x.device})")
            if in_kernel:  # declined after all: the fallback below needs the inputs quantized here
                x = quantize_input(x, offsets)
        if x.device.type == "cpu":
            # dequantize only the experts this batch hits (a host sync costs nothing on the CPU)
            hit = torch.nonzero(counts).flatten()
            if hit.numel() < w.num_experts:
                wt = w.dequantize(x.dtype, hit).transpose(-2, -1)
                y = _grouped_matmul(x, wt, torch.cumsum(counts[hit], 0, dtype=torch.int32))
            else:
                y = _grouped_matmul(x, w.dequantize(x.dtype).transpose(-2, -1), offsets)
            paths.append(CPU_PATH)
            return y
        paths.append(DEQUANT_PATH)
        return _grouped_matmul(x, w.dequantize(x.dtype).transpose(-2, -1), offsets)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, gate_up={self.gate_up.format}, "
                f"down={self.down.format}, kernel={self.kernel}")


# -- finding and swapping MoE blocks ----------------------------------------------------------------------------
@dataclass
class MoEBlockRef:
    name: str  # module path, e.g. model.layers.3.mlp
    layer_index: int
    parent: nn.Module
    attr: str
    block: nn.Module


@dataclass(frozen=True)
class MoeLayout:
    """Where a model's MoE blocks are and how they route: what a model family (quantbench.models.families) tells the
    engine, so the engine never probes a model or its config."""

    blocks: list[MoEBlockRef]
    top_k: int
    norm_topk_prob: bool
    hidden_act: str = "silu"
    gate_bias: bool = False  # the router adds a bias to its logits
    shared_experts: str | None = None  # the first shared-experts module, when the blocks run them (unsupported)


def install_grouped_moe(
    model: nn.Module,
    make_weights: Callable[[int, nn.Module], tuple[ExpertsBase, ExpertsBase]],
    kernel: str = "auto",
    *,
    layout: MoeLayout,
) -> str:
    """Replace every MoE block of `layout` (the model's family says where they are: quantbench.models.families) with
    a GroupedMoE built from `make_weights(layer_index, experts)`. Swaps one layer at a time so the old expert
    tensors are freed as it goes. Returns the kernel path."""
    if not layout.blocks:
        raise UnsupportedError(f"{type(model).__name__} has no MoE block (a module with `gate` and `experts`)")
    if layout.shared_experts:
        raise UnsupportedError(f"{layout.shared_experts}: MoE blocks with shared experts are not supported by the "
                               "grouped-MoE engine; run with --no-fast-moe")
    paths = set()
    for ref in layout.blocks:
        gate_up, down = make_weights(ref.layer_index, ref.block.experts)
        moe = GroupedMoE(
            ref.block.gate, gate_up, down, top_k=layout.top_k, norm_topk_prob=layout.norm_topk_prob,
            act=layout.hidden_act, kernel=kernel, gate_bias=layout.gate_bias,
        )
        setattr(ref.parent, ref.attr, moe)
        # The ref now names the block in place: holding the old one would keep every layer's old experts alive
        # until the last swap (loading a per-expert int4 checkpoint peaked at two copies of its experts on the
        # H200: 6.63 GiB for 3.80 GiB of weights at 8 layers).
        ref.block = moe
        paths.add(moe.kernel_path)
    return "+".join(sorted(paths))


def experts_nbytes(model: nn.Module) -> int:
    """Bytes the expert weights of every GroupedMoE take, measured from their stored tensors."""
    return sum(m.gate_up.nbytes() + m.down.nbytes() for m in model.modules() if isinstance(m, GroupedMoE))


def kernel_paths(model: nn.Module) -> str:
    """What the GroupedMoE layers ran last (or will run), joined when they differ."""
    return "+".join(sorted({m.kernel_path for m in model.modules() if isinstance(m, GroupedMoE)}))


def reset_paths(model: nn.Module) -> None:
    """Forget what forwards so far ran (a calibration pass, an install probe): kernel paths back to the plan."""
    for m in model.modules():
        if isinstance(m, GroupedMoE):
            m.kernel_path = m.planned_path(_device_of(m.gate_up))
            m.paths_ran.clear()


def kernel_paths_ran(model: nn.Module) -> str:
    """Every path the GroupedMoE layers took in the forwards so far ("" before any): a format may hand a batch
    large enough to be compute-bound to dequantize + grouped GEMM instead of its fused kernel."""
    ran = set().union(*(m.paths_ran for m in model.modules() if isinstance(m, GroupedMoE)))
    return "+".join(sorted(ran))
