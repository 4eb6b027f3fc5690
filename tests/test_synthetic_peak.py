"""The quantized synthetic variants built layer by layer (build_synthetic_quantized): the same weights, packed
tensors, calibration amax and logits as quantizing a whole BF16 build_synthetic model, at a lower memory peak."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quantbench.models.synthetic as S
from quantbench.engine.moe import install_grouped_moe
from quantbench.engine.moe.engine import GroupedMoE
from quantbench.engine.moe.fp8 import E4M3_MAX, Fp8Experts
from quantbench.engine.moe.int4 import rtn_experts
from quantbench.models.calibration import calibration_prompt
from quantbench.models.families import moe_layout
from quantbench.models.families.qwen3_moe.family import SHAPES as TEXT_SHAPES

# experts dominate, as in the real shape (there 94% of the weights), at a few MB a layer
TINY = dict(TEXT_SHAPES["qwen3-30b-a3b"], vocab_size=2048, hidden_size=128, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=128)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(TEXT_SHAPES, "tiny", TINY)
    return "tiny"


def _whole_int4(shape, layers, seed):
    """Today's path before this change: the whole BF16 model, then every layer's experts to RTN int4."""
    model, tok = S.build_synthetic(shape, layers=layers, seed=seed)
    install_grouped_moe(model, lambda i, ex: (rtn_experts(ex.gate_up_proj.data), rtn_experts(ex.down_proj.data)),
                        layout=moe_layout(model))
    return model, tok


def _whole_calibrated(shape, layers, seed, make):
    """Today's nvfp4/fp8 path before this change: observers on the whole BF16 model, one forward, then replace."""
    model, tok = S.build_synthetic(shape, layers=layers, seed=seed)
    install_grouped_moe(model, lambda i, ex: (S._AmaxObserver(ex.gate_up_proj.data),
                                              S._AmaxObserver(ex.down_proj.data)), layout=moe_layout(model))
    with torch.inference_mode():
        model.get_decoder()(input_ids=calibration_prompt(tok), use_cache=False)
    for moe in [m for m in model.modules() if isinstance(m, GroupedMoE)]:
        moe.gate_up = make(moe.gate_up.weight, moe.gate_up.amax)
        moe.down = make(moe.down.weight, moe.down.amax)
    return model, tok


def _same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    with torch.inference_mode():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_int4_layer_by_layer_equals_quantizing_the_whole_bf16_model(tiny):
    old, _ = _whole_int4(tiny, 3, 7)
    new, _, path = S.build_synthetic_quantized(tiny, lambda w, _amax: rtn_experts(w), layers=3, seed=7, device="cpu",
                                               dtype=torch.bfloat16, expert_bits=4.2, calibrate=False)
    assert sum(isinstance(m, GroupedMoE) for m in new.modules()) == 3
    assert all(m.gate_up.format == old.model.layers[0].mlp.gate_up.format for m in new.modules()
               if isinstance(m, GroupedMoE))
    assert new.quantbench_weights == "synthetic" and path
    _same_model(old, new)


def test_sequential_calibration_gives_the_whole_forward_amax(tiny):
    seen = {"old": [], "new": []}

    def maker(key):
        def make(weight, amax):
            seen[key].append(amax.clone())
            return Fp8Experts.from_weights(weight, input_scale=(amax.float() / E4M3_MAX).reshape(1))
        return make

    old, _ = _whole_calibrated(tiny, 3, 3, maker("old"))
    new, _, _ = S.build_synthetic_quantized(tiny, maker("new"), layers=3, seed=3, device="cpu",
                                            dtype=torch.bfloat16, expert_bits=8)
    assert len(seen["new"]) == 6 and all(a > 0 for a in seen["new"])
    assert all(torch.equal(a, b) for a, b in zip(seen["old"], seen["new"], strict=True))
    _same_model(old, new)


_PEAK = r"""
import json, resource, sys
import psutil, torch
import quantbench.models.synthetic as S
from quantbench.engine.moe.int4 import rtn_experts
from quantbench.models.families.qwen3_moe.family import SHAPES as TEXT_SHAPES
sys.path.insert(0, sys.argv[1])
from test_synthetic_peak import TINY, _whole_int4
TEXT_SHAPES["tiny"] = dict(TINY, num_experts=32, moe_intermediate_size=512, hidden_size=512)
torch.set_num_threads(1)
import threading
proc = psutil.Process()
def peak_of(build):
    # the highest resident memory while `build` runs, sampled (ru_maxrss keeps the process's earlier high mark)
    start, top, done = proc.memory_info().rss, [0], threading.Event()
    def sample():
        while not done.is_set():
            top[0] = max(top[0], proc.memory_info().rss)
            done.wait(0.001)
    t = threading.Thread(target=sample); t.start()
    try:
        build()
    finally:
        done.set(); t.join()
    return max(top[0], proc.memory_info().rss) - start
peak = {}
if sys.argv[2] == "layers":
    peak["layers"] = peak_of(lambda: S.build_synthetic_quantized("tiny", lambda w, _a: rtn_experts(w), layers=6,
                             seed=0, device="cpu", dtype=torch.bfloat16, expert_bits=4.2, calibrate=False))
else:
    peak["whole"] = peak_of(lambda: _whole_int4("tiny", 6, 0))
print(json.dumps(peak))
"""


def test_layer_by_layer_int4_peaks_lower_than_the_whole_bf16_model():
    # 6 layers of 32 experts x 3 x 512 x 512 in BF16: 48 MiB a layer, 288 MiB in all; int4 takes ~80 MiB
    peak = {}
    for build in ("layers", "whole"):  # each in a fresh process: a freed allocation stays resident in its process
        out = subprocess.run([sys.executable, "-c", _PEAK, str(Path(__file__).parent), build], capture_output=True,
                             text=True, check=True)
        peak.update(json.loads(out.stdout.strip().splitlines()[-1]))
    layer = 32 * 3 * 512 * 512 * 2
    assert peak["whole"] > 6 * layer  # the BF16 experts were all resident
    assert peak["layers"] < peak["whole"] - 3 * layer, {k: v / 2**20 for k, v in peak.items()}


@pytest.mark.parametrize("backend", ["int4", "fp8", "nvfp4"])
def test_the_backends_build_their_shape_variant_layer_by_layer(tiny, backend):
    from quantbench.run.backend import get_backend
    from quantbench.run.spec import RunSpec

    spec = RunSpec(backend=backend, shape=tiny, layers=2, gpu="cpu", device="cpu")
    loaded = get_backend(backend).load(spec, None)
    moes = [m for m in loaded.model.modules() if isinstance(m, GroupedMoE)]
    assert len(moes) == 2 and all(m.gate_up.format.startswith(backend) for m in moes), [m.gate_up.format for m in moes]
    assert loaded.info.weights == "synthetic" and loaded.info.model_id == S.synthetic_id(tiny, 2, 0)



def test_the_refusal_before_allocating_counts_the_quantized_experts_not_the_bf16_model(monkeypatch):
    from quantbench.errors import UnsupportedError
    from quantbench.models import build

    class Allocating(Exception):
        pass

    def allocating(*_args):
        raise Allocating

    def build_int4():
        S.build_synthetic_quantized("qwen3-30b-a3b", lambda w, _a: rtn_experts(w), layers=None, seed=0, device="cpu",
                                    dtype=torch.bfloat16, expert_bits=4 + 24 / 128, calibrate=False)

    monkeypatch.setattr(S, "InOrderFill", allocating)  # past the check, nothing is made
    # the int4 model at 48 layers (~17 GiB + one layer of BF16 experts) fits where 56.9 GiB of BF16 did not
    monkeypatch.setattr(build, "free_bytes", lambda device: 24 * 2**30)
    with pytest.raises(Allocating):
        build_int4()
    monkeypatch.setattr(build, "free_bytes", lambda device: 12 * 2**30)
    with pytest.raises(UnsupportedError, match=r"weights \(4\.1875-bit experts\) need 1[78]\.\d GiB on cpu, 12\.0 GiB is free; "
                       r"give --layers N"):
        build_int4()
