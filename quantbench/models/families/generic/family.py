"""Any other transformers causal LM: MoE blocks found by their structure (a module with a router `gate` that has a
weight, and `experts`: a ModuleList or transformers' fused experts), routing read from the block or the (text)
config, as quantbench always has. A model without such blocks still loads and answers through transformers."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from quantbench.errors import ConfigError, UnsupportedError
from quantbench.models.families.base import FamilyBase

if TYPE_CHECKING:
    from torch import nn

    from quantbench.engine.moe.engine import MoeLayout

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class GenericMoeFamily(FamilyBase):
    """The family of every checkpoint no other family detects (listed last)."""

    name = "transformers"
    title = "transformers causal LM"

    def detect(self, config: dict[str, Any]) -> bool:
        return True

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        from torch import Tensor

        from quantbench.engine.moe.engine import MoEBlockRef, MoeLayout

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
    from torch import Tensor, nn

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
