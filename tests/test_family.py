"""Model families: the Qwen3-MoE family finds the fixture's MoE blocks and routing from its config, the generic one
from the blocks' structure, and both give the grouped-MoE engine the same layout, so it no longer probes models."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from quantbench.engine.moe.engine import DenseExperts, GroupedMoE, install_grouped_moe
from quantbench.errors import UnsupportedError
from quantbench.models.families import GenericMoeFamily, Qwen3MoeFamily, family_of, moe_layout
from quantbench.protocol import DecisionRequest
from quantbench.protocol.prompt import render_prompt
from tests.tiny import tiny_model, tiny_tokenizer


def dense_weights(_layer, experts):
    return DenseExperts(experts.gate_up_proj.detach()), DenseExperts(experts.down_proj.detach())


def test_a_qwen3_moe_config_is_the_qwen3_family_and_anything_else_the_generic_one():
    assert isinstance(family_of({"model_type": "qwen3_moe"}), Qwen3MoeFamily)
    assert isinstance(family_of({"model_type": "mixtral"}), GenericMoeFamily)
    assert isinstance(family_of(tiny_model().config.to_dict()), Qwen3MoeFamily)


def test_the_qwen3_layout_names_every_sparse_layer_and_its_routing_from_the_config():
    model = tiny_model(seed=1)
    model.config.norm_topk_prob = True  # the tiny config's default is False: both values must come through
    layout = moe_layout(model)
    assert [(ref.name, ref.layer_index, ref.attr) for ref in layout.blocks] == [
        ("model.layers.0.mlp", 0, "mlp"), ("model.layers.1.mlp", 1, "mlp")]
    assert all(ref.block is model.model.layers[ref.layer_index].mlp for ref in layout.blocks)
    assert (layout.top_k, layout.norm_topk_prob, layout.hidden_act) == (2, True, "silu")
    assert (layout.gate_bias, layout.shared_experts) == (False, None)
    model.config.mlp_only_layers = [0]  # a dense layer: not an MoE block, whatever its module holds
    assert [ref.layer_index for ref in moe_layout(model).blocks] == [1]


def test_the_generic_family_finds_the_same_blocks_by_their_structure():
    model = tiny_model(seed=2)
    qwen, generic = Qwen3MoeFamily().moe_layout(model), GenericMoeFamily().moe_layout(model)
    assert [r.name for r in generic.blocks] == [r.name for r in qwen.blocks]
    assert (generic.top_k, generic.norm_topk_prob, generic.hidden_act, generic.gate_bias) == (
        qwen.top_k, qwen.norm_topk_prob, qwen.hidden_act, qwen.gate_bias)
    with pytest.raises(UnsupportedError, match="Sequential has no MoE block"):
        GenericMoeFamily().moe_layout(nn.Sequential(nn.Linear(4, 4)))


def test_the_engine_routes_as_the_layout_says_not_as_the_model_would_be_probed():
    model = tiny_model(seed=3)
    layout = moe_layout(model)
    wrong = dataclasses.replace(layout, top_k=1)  # the engine must take top_k from the layout alone
    install_grouped_moe(model, dense_weights, layout=wrong)
    assert [m.top_k for m in model.modules() if isinstance(m, GroupedMoE)] == [1, 1]


def test_the_qwen3_family_renders_the_protocol_prompt():
    request = DecisionRequest.model_validate({"state": {"observation": "wall"}, "questions": {"q": {"type": "boolean"}}})
    tokenizer = tiny_tokenizer()
    assert Qwen3MoeFamily().render(request, tokenizer, "q") == render_prompt(tokenizer, request, "q")


def test_the_qwen3_family_loads_a_checkpoint_exactly(tmp_path):
    from tests.tiny import save_tiny

    path = save_tiny(tmp_path / "tiny")
    model = Qwen3MoeFamily().load(path, torch.bfloat16, "cpu")
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.dtype == torch.bfloat16
