"""Qwen3-MoE (`Qwen3MoeForCausalLM`): the embedded default model, Qwen3-30B-A3B, and that model's real shape with
seeded random weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantbench.models.families.base import FamilyBase, HasSyntheticShapes

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantbench.engine.moe.engine import MoeLayout

# Real model shapes for speed / memory runs with random weights.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "intermediate_size": 6144,
        "norm_topk_prob": True,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
    },
}


class Qwen3MoeFamily(FamilyBase, HasSyntheticShapes):
    """Qwen3-MoE: every decoder layer's `mlp` is a sparse MoE block unless the config lists it in `mlp_only_layers`
    or `decoder_sparse_step` skips it (transformers' rule); routing is softmax top-k, renormalised when
    `norm_topk_prob`, with no router bias and no shared experts."""

    name = "qwen3_moe"
    title = "Qwen3-MoE"
    model_types = ("qwen3_moe",)
    modeling_modules = ("transformers.models.qwen3_moe.modeling_qwen3_moe",)
    synthetic_shapes = SHAPES

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        from quantbench.engine.moe.engine import MoEBlockRef, MoeLayout

        config = model.config
        blocks = []
        for i, layer in enumerate(model.model.layers):
            sparse = i not in config.mlp_only_layers and config.num_experts > 0 and (i + 1) % config.decoder_sparse_step == 0
            if sparse:
                blocks.append(MoEBlockRef(f"model.layers.{i}.mlp", i, layer, "mlp", layer.mlp))
        return MoeLayout(blocks=blocks, top_k=config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob,
                         hidden_act=config.hidden_act)

    # -- the real shape, random weights ---------------------------------------------------------------------
    def synthetic_config(self, shape: str, layers: int | None) -> tuple[Any, Any]:
        """A Qwen3MoeConfig of the shape and the fixture's tokenizer (its ids are a subset of the real vocabulary;
        the model keeps vocab_size 151936)."""
        from quantbench.models.build import moe_config
        from quantbench.models.tokenizer import build_tokenizer

        dims = dict(SHAPES[shape])
        if layers is not None:
            dims["num_hidden_layers"] = layers
        tokenizer = build_tokenizer()
        config = moe_config(dims, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                            bos_token_id=None)
        # the fixture's tokenizer says 1024 tokens (the fixture's context); here prompts may be as long as the shape's
        tokenizer.model_max_length = config.max_position_embeddings
        return config, tokenizer

    def synthetic_meta(self, config: Any, dtype: torch.dtype) -> nn.Module:
        from quantbench.models.build import meta_model

        return meta_model(config, dtype)

    def synthetic_buffers(self, model: nn.Module, device: Any) -> None:
        from quantbench.models.build import new_rotary

        new_rotary(model, device)

    def synthetic_marks(self) -> dict[str, Any]:
        return {}

    def synthetic_files(self) -> dict[str, str]:
        return {}
