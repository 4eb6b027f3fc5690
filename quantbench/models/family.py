"""Model families: the one seam between quantbench and a kind of checkpoint. A family says how to detect a checkpoint
of its kind (its config.json), load it in BF16, render a decision prompt for it, and where its MoE blocks are and how
they route (`MoeLayout`, which the grouped-MoE engine installs from instead of probing the model).

`Qwen3MoeFamily` covers the embedded fixture and Qwen3-30B-A3B (and the synthetic real shapes). Any other
transformers causal LM falls to `GenericMoeFamily`, which finds MoE blocks by their structure (a router `gate` and
`experts`), as quantbench always has. Adding a family (Qwen3-Omni next) is a class here, listed in FAMILIES ahead
of the generic one, and its tests.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from quantbench.engine.moe.engine import MoEBlockRef, MoeLayout
from quantbench.errors import ConfigError, UnsupportedError
from quantbench.models.checkpoint import load_causal_lm
from quantbench.protocol import DecisionRequest
from quantbench.protocol.prompt import render_prompt


class ModelFamily(Protocol):
    name: str

    def detect(self, config: dict[str, Any]) -> bool:
        """Whether a checkpoint with this config.json belongs to the family."""
        ...

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        """The checkpoint as a causal LM in `dtype` on `device`, filled exactly or refused (LoadError)."""
        ...

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        """The prompt for `question` of `request`."""
        ...

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        """Where `model`'s MoE blocks are and how they route."""
        ...


class _TransformersCausalLM:
    """Loading and prompting shared by the families that are plain transformers causal LMs."""

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        return load_causal_lm(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        return render_prompt(tokenizer, request, question)


class Qwen3MoeFamily(_TransformersCausalLM):
    """Qwen3-MoE (`Qwen3MoeForCausalLM`): the fixture, Qwen3-30B-A3B. Every decoder layer's `mlp` is a sparse MoE
    block unless the config lists it in `mlp_only_layers` or `decoder_sparse_step` skips it (transformers' rule);
    routing is softmax top-k, renormalised when `norm_topk_prob`, with no router bias and no shared experts."""

    name = "qwen3_moe"

    def detect(self, config: dict[str, Any]) -> bool:
        return config.get("model_type") == "qwen3_moe"

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        config = model.config
        blocks = []
        for i, layer in enumerate(model.model.layers):
            sparse = i not in config.mlp_only_layers and config.num_experts > 0 and (i + 1) % config.decoder_sparse_step == 0
            if sparse:
                blocks.append(MoEBlockRef(f"model.layers.{i}.mlp", i, layer, "mlp", layer.mlp))
        return MoeLayout(blocks=blocks, top_k=config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob,
                         hidden_act=config.hidden_act)


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class GenericMoeFamily(_TransformersCausalLM):
    """Any other transformers causal LM: MoE blocks found by their structure (a module with a router `gate` that
    has a weight, and `experts`: a ModuleList or transformers' fused experts), routing read from the block or the
    (text) config. A model without such blocks still loads and answers through transformers."""

    name = "transformers"

    def detect(self, config: dict[str, Any]) -> bool:
        return True

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        blocks = []
        for name, module in model.named_modules():
            if not _is_moe_block(module):
                continue
            match = _LAYER.search(name)
            parent_name, _, attr = name.rpartition(".")
            blocks.append(MoEBlockRef(name, int(match.group(1)) if match else len(blocks),
                                      model.get_submodule(parent_name), attr, module))
        if not blocks:
            raise UnsupportedError(f"{type(model).__name__} has no MoE block (a module with `gate` and `experts`)")
        config = getattr(model, "config", None)
        config = getattr(config, "get_text_config", lambda: config)()
        first = blocks[0].block
        shared = next((f"{ref.name}.{extra}" for ref in blocks for extra in ("shared_expert", "shared_experts")
                       if getattr(ref.block, extra, None) is not None), None)
        return MoeLayout(
            blocks=blocks,
            top_k=int(_setting(first, config, "top_k", "num_experts_per_tok")),
            norm_topk_prob=bool(_setting(first, config, "norm_topk_prob")),
            hidden_act=getattr(config, "hidden_act", "silu") if config is not None else "silu",
            gate_bias=isinstance(getattr(first.gate, "bias", None), Tensor),
            shared_experts=shared,
        )


def _is_moe_block(module: nn.Module) -> bool:
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    if gate is None or experts is None or not isinstance(getattr(gate, "weight", None), Tensor):
        return False
    return isinstance(experts, nn.ModuleList) or hasattr(experts, "gate_up_proj")


def _setting(block: nn.Module, config: Any, *names: str) -> Any:
    for owner in (block, getattr(block, "gate", None), getattr(block, "experts", None)):
        for n in names:
            if owner is not None and getattr(owner, n, None) is not None:
                return getattr(owner, n)
    for n in names:
        if getattr(config, n, None) is not None:
            return getattr(config, n)
    raise ConfigError(f"cannot tell the MoE block's {names[0]} (neither the block nor the config has {' / '.join(names)})")


FAMILIES: tuple[ModelFamily, ...] = (Qwen3MoeFamily(), GenericMoeFamily())  # first match wins: generic last


def family_of(config: dict[str, Any]) -> ModelFamily:
    """The family of a checkpoint with this config.json (or a model's `config.to_dict()`)."""
    return next(f for f in FAMILIES if f.detect(config))


def moe_layout(model: nn.Module) -> MoeLayout:
    """The MoE layout of a loaded transformers model, from its family."""
    config = getattr(model, "config", None)
    return family_of(config.to_dict() if config is not None else {}).moe_layout(model)
