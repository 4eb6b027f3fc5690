"""The grouped-MoE engine against transformers' own MoE block: same routing, same outputs, every layer swapped."""

import copy

import pytest
import torch
from torch import nn

from quantbench.engine.moe import (
    DenseExperts,
    GroupedMoE,
    experts_nbytes,
    install_grouped_moe,
    route,
)
from quantbench.errors import ConfigError, UnsupportedError
from quantbench.models.families import moe_layout
from tests.tiny import tiny_model


def dense_weights(layer_index, experts):
    return DenseExperts(experts.gate_up_proj.data.clone()), DenseExperts(experts.down_proj.data.clone())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_picks_the_same_experts_and_weights_as_transformers_router(dtype):
    router = tiny_model(seed=1, dtype=dtype).model.layers[0].mlp.gate
    x = torch.randn(64, router.hidden_dim, dtype=dtype)
    _, want_weights, want_index = router(x)
    weights, index = route(x, router.weight, router.top_k, router.norm_topk_prob)
    assert torch.equal(index, want_index)
    assert torch.equal(weights, want_weights)


@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_dense_grouped_moe_gives_transformers_logits(impl):
    reference = tiny_model(seed=2)
    reference.set_experts_implementation(impl)
    model = copy.deepcopy(reference)
    install_grouped_moe(model, dense_weights, layout=moe_layout(model))
    ids = torch.randint(0, 600, (3, 40))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_single_token_hits_only_top_k_experts_and_still_matches():
    reference = tiny_model(seed=3)
    block = reference.model.layers[1].mlp
    moe = GroupedMoE(block.gate, *dense_weights(1, block.experts), top_k=2, norm_topk_prob=block.gate.norm_topk_prob)
    x = torch.randn(1, 1, 128)
    with torch.inference_mode():
        torch.testing.assert_close(moe(x), block(x), rtol=1e-5, atol=1e-6)
    assert moe.kernel_path == "cpu-vectorised"


def test_install_swaps_every_moe_block_and_names_the_path():
    model = tiny_model(seed=4)
    names = [ref.name for ref in moe_layout(model).blocks]
    assert names == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert install_grouped_moe(model, dense_weights, layout=moe_layout(model)) == "cpu-vectorised"
    assert all(isinstance(layer.mlp, GroupedMoE) for layer in model.model.layers)


def test_install_refuses_a_model_without_moe_blocks():
    with pytest.raises(UnsupportedError, match="no MoE block"):
        plain = nn.Sequential(nn.Linear(4, 4))
        install_grouped_moe(plain, dense_weights, layout=moe_layout(plain))


def test_asking_for_a_fused_kernel_that_does_not_exist_fails_loudly():
    block = tiny_model(seed=5).model.layers[0].mlp
    with pytest.raises(UnsupportedError, match="no fused grouped kernel"):
        GroupedMoE(block.gate, *dense_weights(0, block.experts), top_k=2, norm_topk_prob=True, kernel="fused")


def test_projections_that_do_not_fit_together_are_refused():
    gate_up = DenseExperts(torch.zeros(8, 128, 128))
    down = DenseExperts(torch.zeros(8, 128, 32))  # down needs 64 inputs (half of gate_up's outputs)
    with pytest.raises(ConfigError, match="2 x down's inputs"):
        GroupedMoE(nn.Linear(128, 8, bias=False), gate_up, down, top_k=2, norm_topk_prob=True)


def test_experts_bytes_are_measured_from_the_stored_tensors():
    model = tiny_model(seed=6, dtype=torch.bfloat16)
    install_grouped_moe(model, dense_weights, layout=moe_layout(model))
    # 2 layers x 8 experts x (gate_up 128x128 + down 128x64) bf16 values
    assert experts_nbytes(model) == 2 * 8 * (128 * 128 + 128 * 64) * 2


def test_bf16_experts_impl_quantbench_runs_the_same_weights_through_the_engine_and_names_it():
    from backends.bf16 import set_experts_implementation

    reference = tiny_model(seed=5)
    reference.set_experts_implementation("grouped_mm")
    model = copy.deepcopy(reference)
    expert_weight = model.model.layers[0].mlp.experts.gate_up_proj
    assert set_experts_implementation(model, "quantbench") == "quantbench grouped-moe cpu-vectorised"
    assert model.model.layers[0].mlp.gate_up.weight.data_ptr() == expert_weight.data_ptr()  # not copied
    assert experts_nbytes(model) == sum(p.numel() * p.element_size() for n, p in reference.named_parameters()
                                        if ".experts." in n)
    ids = torch.randint(0, 600, (2, 30))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="not available"):
        set_experts_implementation(tiny_model(seed=5), "fastest")


def test_the_paths_a_forward_took_are_what_a_run_records():
    """A run records the kernel paths its forwards took (a large batch may take another than the one planned)."""
    from quantbench.engine.moe.engine import DenseExperts, GroupedMoE, kernel_paths, kernel_paths_ran

    torch.manual_seed(0)
    moe = GroupedMoE(torch.nn.Linear(16, 4, bias=False), DenseExperts(torch.randn(4, 16, 16)),
                     DenseExperts(torch.randn(4, 16, 8)), top_k=2, norm_topk_prob=True)
    model = torch.nn.Sequential(moe)
    assert kernel_paths(model) == "cpu-vectorised" and kernel_paths_ran(model) == ""
    model(torch.randn(5, 16))
    assert kernel_paths_ran(model) == "cpu-vectorised"


def test_forwards_before_the_run_are_not_what_it_ran():
    """The install probes' and a calibration's forwards are forgotten when the scoring engine is built: the run
    then records only what its own forwards took (a probe's 38 tokens may take another kernel than the run)."""
    from quantbench.engine.moe.engine import kernel_paths_ran
    from quantbench.engine.scoring import TransformersEngine
    from tests.tiny import tiny_tokenizer

    model = tiny_model()
    install_grouped_moe(model, dense_weights, layout=moe_layout(model))
    model(input_ids=torch.randint(0, 600, (1, 7)))
    assert kernel_paths_ran(model) == "cpu-vectorised"
    TransformersEngine(model, tiny_tokenizer())
    assert kernel_paths_ran(model) == ""


def test_h_goes_to_down_as_e4m3_codes_only_when_both_fp8_kernels_take_them(monkeypatch):
    """The choice made before gate_up runs (the kernels themselves run on a GPU; tests/test_fp8.py checks them
    under the interpreter): codes only for a bf16 model, both projections on their native fused FP8 kernels, and
    one input scale for every expert of down."""
    from quantbench.engine.moe import fp8

    monkeypatch.setattr(fp8.Fp8Experts, "_native", lambda self, device: True)
    one, per_expert = torch.tensor([0.02]), torch.tensor([0.02, 0.03, 0.02, 0.02])

    def moe(down_scale, gate_up=None):
        g = gate_up or fp8.Fp8Experts.from_weights(torch.randn(4, 16, 32), input_scale=torch.tensor([0.05]))
        m = GroupedMoE(nn.Linear(32, 4, bias=False), g, fp8.Fp8Experts.from_weights(torch.randn(4, 32, 8),
                       input_scale=down_scale), top_k=2, norm_topk_prob=True)
        m._path_for = lambda w, device: w.fused_kernel  # as on a GPU with Triton
        return m

    x = torch.randn(5, 32).bfloat16()
    assert torch.equal(moe(one)._codes_scale(x), one)
    assert moe(one)._codes_scale(x.float()) is None  # codes round as a bf16 model does: bf16 models only
    assert moe(per_expert)._codes_scale(x) is None  # each expert's rows would need their own scale
    dense_gate_up = DenseExperts(torch.randn(4, 16, 32))
    assert moe(one, gate_up=dense_gate_up)._codes_scale(x) is None  # gate_up cannot write codes
    cpu = moe(one)
    del cpu._path_for  # the CPU's own path: no fused kernel, no codes
    assert cpu._codes_scale(x) is None


def test_every_weight_format_declares_the_optional_features_on_experts_base():
    # The engine reads these attributes instead of probing for them (#23): a format that lacks a feature
    # inherits the default that turns it off.
    from quantbench.engine.moe.engine import DenseExperts, ExpertsBase
    from quantbench.engine.moe.fp8 import Fp8Experts
    from quantbench.engine.moe.int4 import Int4Experts
    from quantbench.engine.moe.nvfp4 import Nvfp4Experts, Nvfp4UnpackedExperts

    for cls in (DenseExperts, Int4Experts, Nvfp4Experts, Nvfp4UnpackedExperts, Fp8Experts):
        assert issubclass(cls, ExpertsBase), cls
    dense = DenseExperts(torch.zeros(2, 4, 8))
    assert (dense.fused_kernel, dense.fused_features, dense.ran_kernel, dense.input_quant_rowwise) == (
        None, frozenset(), None, False)
    assert dense.quantize_input is None and dense.quantizes_input_in_kernel(torch.device("cpu")) is False
    assert Int4Experts.quantize_input is None and callable(Nvfp4UnpackedExperts.quantize_input)
    assert Int4Experts.fused_features == frozenset({"gather", "swiglu", "row_scale", "scatter"})


def test_install_frees_each_layers_old_experts_before_building_the_next():
    """The swap holds one layer's old experts at a time: a layout that kept its refs to the old blocks held all of
    them until the end (peak memory of a checkpoint load at two copies of the experts)."""
    import gc
    import weakref

    model = tiny_model(seed=4)
    old: list[weakref.ref] = []

    def weights(layer_index, experts):
        gc.collect()
        assert all(r() is None for r in old), f"layer {layer_index}: an earlier layer's old experts are still alive"
        old.append(weakref.ref(experts))
        return dense_weights(layer_index, experts)

    install_grouped_moe(model, weights, layout=moe_layout(model))
    assert len(old) == len(model.model.layers) >= 2
