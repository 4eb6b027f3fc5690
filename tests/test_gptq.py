"""GPTQ (v1) checkpoints on the int4 backend: auto-round's own `format="auto_gptq"` export (quant_method gptq, a
g_idx per projection) was refused ('quant_method is gptq, not auto-round') although it holds the same packed int4
as its `auto_round` export; loaded, it answers exactly as that export does, on both paths. What it cannot read
(act-order groups, GPTQModel's v2 layout) is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantbench.errors import LoadError

REQUEST = {"state": {"observation": "a wall to the left, a door ahead"},
           "questions": {"action": {"type": "choice", "criteria": {"left": "turn left", "right": "turn right",
                                                                   "forward": "go forward"}},
                         "safe": {"type": "choice", "criteria": {"yes": "safe", "no": "not safe"}}}}


def _answers(path: Path, **options) -> tuple[dict, object]:
    from backends.int4 import Int4Backend
    from quantbench.protocol import parse_request
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    loaded = Int4Backend().load(RunSpec(backend="int4", model=str(path), device="cpu", dtype="float32", **options),
                                detect())
    got = loaded.engine.forward(loaded.engine.prepare(parse_request(REQUEST)))
    return {q: a.probabilities for q, a in got.items()}, loaded.info


def _copy(src: Path, dst: Path, change=None, tensors=None) -> Path:
    shutil.copytree(src, dst)
    if change:
        config = json.loads((dst / "config.json").read_text())
        change(config["quantization_config"])
        (dst / "config.json").write_text(json.dumps(config))
    if tensors:
        [file] = dst.glob("*.safetensors")
        save_file({**load_file(str(file)), **tensors}, str(file), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("fast_moe", [True, False], ids=["engine", "auto-round-loop"])
def test_autorounds_gptq_export_answers_as_its_auto_round_export(made_elsewhere, fast_moe):
    gptq, info = _answers(made_elsewhere["int4-gptq"], fast_moe=fast_moe)
    same, _ = _answers(made_elsewhere["int4"], fast_moe=fast_moe)
    assert gptq == same
    assert info.weight_format == "int4 w4a16 g32 sym (gptq v1)"
    assert ("grouped-moe" in info.kernel_path) == fast_moe


def test_gptqmodels_meta_is_no_reason_to_refuse(made_elsewhere, tmp_path):
    """GPTQModel writes its name and version under `meta`, which transformers' conversion to auto-round refuses."""
    meta = _copy(made_elsewhere["int4-gptq"], tmp_path / "meta", lambda qc: qc.update(
        meta={"quantizer": ["gptqmodel:5.0.0"]}, checkpoint_format="gptq"))
    assert _answers(meta)[0] == _answers(made_elsewhere["int4-gptq"])[0]


def test_act_order_and_v2_gptq_are_refused_by_name(made_elsewhere, tmp_path):
    act_order = _copy(made_elsewhere["int4-gptq"], tmp_path / "act", lambda qc: qc.update(desc_act=True))
    with pytest.raises(LoadError, match="desc_act is true"):
        _answers(act_order)
    v2 = _copy(made_elsewhere["int4-gptq"], tmp_path / "v2", lambda qc: qc.update(checkpoint_format="gptq_v2"))
    with pytest.raises(LoadError, match="checkpoint_format is 'gptq_v2'"):
        _answers(v2)


@pytest.mark.parametrize("fast_moe", [True, False], ids=["engine", "auto-round-loop"])
def test_a_g_idx_out_of_input_order_is_refused_not_ignored(made_elsewhere, tmp_path, fast_moe):
    """desc_act false, but one projection's g_idx puts inputs in other groups: auto-round's QuantLinear has no place
    for g_idx and would run it in input order, silently wrong; the load is refused naming the tensor."""
    key = "model.layers.0.mlp.experts.0.up_proj.g_idx"
    [file] = made_elsewhere["int4-gptq"].glob("*.safetensors")
    g_idx = load_file(str(file))[key]
    shuffled = _copy(made_elsewhere["int4-gptq"], tmp_path / "shuffled", tensors={key: g_idx.flip(0).contiguous()})
    with pytest.raises(LoadError, match=key.replace(".", r"\.")):
        _answers(shuffled, fast_moe=fast_moe)


def test_the_trivial_g_idx_filter_keeps_everything_else(tmp_path):
    from quantbench.models.checkpoint import unread_trivial_g_idx

    save_file({"a.g_idx": torch.arange(64, dtype=torch.int32) // 32, "b.g_idx": torch.arange(64, dtype=torch.int32) % 2,
               "c.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    keys = ["a.g_idx", "b.g_idx", "c.weight", "d.g_idx"]  # d: reported but in no file
    assert unread_trivial_g_idx(tmp_path, keys, 32) == ["b.g_idx", "c.weight", "d.g_idx"]
    assert unread_trivial_g_idx(tmp_path, keys, 16) == keys  # the config's group size decides what is trivial
    assert unread_trivial_g_idx(tmp_path, keys, None) == keys
