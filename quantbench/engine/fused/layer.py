"""The decoder layer's residual adds and the attention's q/k norms folded into the kernels beside them, on a GPU.

A Qwen3-MoE decoder layer (transformers' forward; the Qwen3-Omni thinker's is the same) runs

    residual = x;  h = input_layernorm(x);  h = self_attn(h)     # q_norm, k_norm and the rotary inside
    x = residual + h;  residual = x;  h = post_attention_layernorm(x)
    x = residual + mlp(h)

With quantbench.engine.fused.ops every norm and the rotary are one kernel each; the two adds are two more launches and
q_norm and k_norm one each. At the 30B shape that is 5 of an INT4 layer's 20 launches and about 10 µs of its GPU
time (`benchmarks/model_profile.py`, H200, 512 tokens), each launch also a gap in a CUDA graph's replay. Here:

- `residual + attention` and post_attention_layernorm run as one kernel (`fused_ops.add_rms_norm`: the same bits);
- `residual + mlp(h)` is added in the MoE engine's sum over the k experts (`GroupedMoE.forward(h, residual)`:
  the same bits), for blocks that declare `takes_residual`; other blocks get the plain add;
- q_norm and k_norm run inside the rotary kernel (`fused_ops.apply_rope(..., norms=)`): the same arithmetic, its
  sum of squares reduced in another order than the separate norm kernel's (within a rounding step);
- the norm that reads a layer's output (the next layer's input_layernorm, the last layer's final norm) is computed
  in that MoE pass too (`routing.sum_slots_norm`, in the norm kernel's tile and order: the same bits) and handed
  over (`fused_ops.hand_normed`); 8 layers on the H200: 2.373 ms per decision's graph against 2.386 without.

`install(model)` gives each decoder layer and attention module whose class passes a probe a forward of its own
(the module's other methods, state_dict and weights are untouched), and links layers to the norms that read
them where those run fused_ops' kernel. The probes run the new forward against the module's current one on random
inputs on the model's own device: the decoder layer must match exactly, the attention within two bfloat16 steps of
its output's magnitude, a handed-over norm exactly. A call with a KV cache, with positional arguments
or with gradients takes the module's own forward.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch import Tensor, nn

from quantbench.engine.fused import ops as fused_ops
from quantbench.engine.fused.ops import (
    add_rms_norm,
    apply_rope,
    is_rms_norm,
    probe,
    rope_fits,
    swap_per_class,
)

_ORIGINAL = "_quantbench_original_forward"
_NEXT_NORM = "_quantbench_next_norm"  # the norm that reads this layer's output (in __dict__: not a submodule)
_ATTENTION_TOL = 2 * torch.finfo(torch.bfloat16).eps  # of the output's largest magnitude


def _plain_call(args: tuple, kwargs: dict) -> bool:
    """A call this module's forwards take: keyword arguments only, no KV cache, no autograd."""
    return (not args and kwargs.get("past_key_values") is None and kwargs.get("cache") is None
            and not torch.is_grad_enabled())


def _is_decoder_layer(m: nn.Module) -> bool:
    return (all(isinstance(getattr(m, n, None), nn.Module) for n in ("self_attn", "mlp", "input_layernorm"))
            and is_rms_norm(getattr(m, "post_attention_layernorm", None)))


def _is_qk_norm_attention(m: nn.Module) -> bool:
    return (all(isinstance(getattr(m, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and is_rms_norm(getattr(m, "q_norm", None)) and is_rms_norm(getattr(m, "k_norm", None))
            and isinstance(getattr(m, "head_dim", None), int))


def layer_forward(layer: nn.Module, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """transformers' decoder-layer forward with both residual adds fused (module docstring)."""
    if not _plain_call(args, kwargs):
        return getattr(layer, _ORIGINAL)(hidden_states, *args, **kwargs)
    residual = hidden_states
    h = layer.input_layernorm(hidden_states)
    h, _ = layer.self_attn(hidden_states=h, **kwargs)
    norm = layer.post_attention_layernorm
    h, residual = add_rms_norm(h, residual, norm.weight, norm.variance_epsilon)
    if getattr(layer.mlp, "takes_residual", False):
        norm = layer.__dict__.get(_NEXT_NORM)
        if norm is None:
            return layer.mlp(h, residual=residual)
        out, normed = layer.mlp(h, residual=residual, norm=norm)
        fused_ops.hand_normed(norm, out, normed)  # the next layer's input norm (or the final one) takes it as is
        return out
    return residual + layer.mlp(h)


def attention_forward(attn: nn.Module, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """transformers' Qwen3-MoE attention forward with q_norm and k_norm inside the rotary kernel."""
    position_embeddings = kwargs.get("position_embeddings")
    if not _plain_call(args, kwargs) or attn.training or position_embeddings is None or "hidden_states" not in kwargs:
        return getattr(attn, _ORIGINAL)(*args, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "cache")}  # None: checked above
    hidden_states = kwargs.pop("hidden_states")
    cos, sin = kwargs.pop("position_embeddings")
    attention_mask = kwargs.pop("attention_mask", None)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, attn.head_dim)
    q = attn.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    k = attn.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    v = attn.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    module = sys.modules[type(attn).__module__]
    if rope_fits(q, k, cos, sin):
        q, k = apply_rope(q, k, cos, sin, norms=(attn.q_norm, attn.k_norm))
    else:  # the module's own ops, in its order (the norms are per row: the layout they see changes nothing)
        q, k = module.apply_rotary_pos_emb(attn.q_norm(q), attn.k_norm(k), cos, sin)
    interface = module.ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                             module.eager_attention_forward)
    out, weights = interface(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling,
                             sliding_window=attn.sliding_window, **kwargs)
    return attn.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def _swap(module: nn.Module, forward) -> None:
    setattr(module, _ORIGINAL, module.forward)
    module.forward = functools.partial(forward, module)


def _unswap(module: nn.Module) -> None:
    del module.forward
    delattr(module, _ORIGINAL)


def _probe_inputs(module: nn.Module, hidden: int, head_dim: int) -> dict[str, Any]:
    p = next(module.parameters())
    gen = torch.Generator(device=p.device).manual_seed(0)
    x = torch.randn(2, 19, hidden, generator=gen, device=p.device).to(p.dtype)
    cos, sin = (torch.randn(2, 19, head_dim, generator=gen, device=p.device).to(p.dtype) for _ in range(2))
    return dict(hidden_states=x, attention_mask=None, position_embeddings=(cos, sin))


def _layer_matches(layer: nn.Module) -> bool:
    """The fused decoder layer against its current forward: the same bits, or the probe fails saying by how much."""
    attn = layer.self_attn
    inputs = _probe_inputs(layer, layer.post_attention_layernorm.weight.shape[0], attn.head_dim)
    want = getattr(layer, _ORIGINAL)(**inputs)
    got = layer(**inputs)
    if not torch.equal(got, want):
        raise RuntimeError(f"fused decoder layer differs from its own forward by "
                           f"{float((got.float() - want.float()).abs().max()):.3g}")
    return True


def _attention_matches(attn: nn.Module) -> bool:
    """The attention with q/k norms in the rotary kernel against its current forward, within _ATTENTION_TOL."""
    inputs = _probe_inputs(attn, attn.q_proj.in_features, attn.head_dim)
    want = getattr(attn, _ORIGINAL)(**inputs)[0].float()
    got = attn(**inputs)[0].float()
    err, scale = float((got - want).abs().max()), float(want.abs().max())
    if got.shape != want.shape or not err <= _ATTENTION_TOL * scale:
        raise RuntimeError(f"attention with q/k norms in the rotary kernel differs by {err:.3g} (max |value| "
                           f"{scale:.3g}, tolerance {_ATTENTION_TOL:.3g} of it)")
    return True


def install(model: nn.Module) -> list[str]:
    """Give every decoder layer and q/k-norm attention whose class passes its probe the fused forward (a CUDA model
    whose norms and rotary quantbench.engine.fused.ops already swapped); returns what was fused: "residual", "qknorm"."""
    fused = []
    for name, kind, forward, check in (("residual", _is_decoder_layer, layer_forward, _layer_matches),
                                       ("qknorm", _is_qk_norm_attention, attention_forward, _attention_matches)):
        def swap(m: nn.Module, kind=kind, forward=forward) -> bool:
            # not someone else's instance forward (accelerate's hooks put theirs there): that is left alone
            if not kind(m) or "forward" in vars(m):
                return False
            _swap(m, forward)
            return True

        def swapped_before(m: nn.Module, kind=kind) -> bool:  # by an earlier install
            return kind(m) and hasattr(m, _ORIGINAL)

        if swap_per_class(name, model.modules(), swap, check, _unswap, already=swapped_before):
            fused.append(name)
    if "residual" in fused and _link_next_norms(model):
        fused.append("nextnorm")
    return fused


def _link_next_norms(model: nn.Module) -> bool:
    """Point each fused decoder layer whose MoE block takes the residual at the norm that reads its output (the
    next layer's input_layernorm, the last layer's the decoder's final norm), where that norm runs fused_ops'
    kernel; a probe on the first such layer checks the handed-over result against the norm kernel's own."""
    linked = []
    for stack in model.modules():
        layers, final = getattr(stack, "layers", None), getattr(stack, "norm", None)
        if not isinstance(layers, nn.ModuleList) or not is_rms_norm(final):
            continue
        readers = [getattr(m, "input_layernorm", None) for m in list(layers)[1:]] + [final]
        for layer, norm in zip(layers, readers, strict=True):
            if (getattr(layer, _ORIGINAL, None) is not None and getattr(layer.mlp, "takes_residual", False)
                    and getattr(getattr(norm, "forward", None), "func", None) is fused_ops._norm_forward):
                layer.__dict__[_NEXT_NORM] = norm
                linked.append(layer)
    if linked and not probe("nextnorm", _next_norm_matches, linked[0]):
        for layer in linked:
            del layer.__dict__[_NEXT_NORM]
        return False
    return bool(linked)


def _next_norm_matches(layer: nn.Module) -> bool:
    """The norm a fused layer hands to the next one against that norm's kernel on the layer's output: the same
    bits (sum_slots_norm reduces in the norm kernel's tile and order)."""
    norm = layer.__dict__[_NEXT_NORM]
    out = layer(**_probe_inputs(layer, norm.weight.shape[0], layer.self_attn.head_dim))
    handed = norm.__dict__.pop(fused_ops._NORMED, None)
    if handed is None or handed[0] is not out:
        raise RuntimeError("the layer handed no norm for its output")
    want = fused_ops.rms_norm(out, norm.weight, norm.variance_epsilon)
    if not torch.equal(handed[1], want):
        raise RuntimeError(f"the handed norm differs from the norm kernel's by "
                           f"{float((handed[1].float() - want.float()).abs().max()):.3g}")
    return True
