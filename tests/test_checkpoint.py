"""Strict loading: a checkpoint that does not fill the model exactly never runs."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantbench.errors import LoadError
from quantbench.models.checkpoint import (
    experts_tensor_bytes,
    fingerprint,
    load_causal_lm,
    model_identity,
    tensor_bytes,
)
from tests.tiny import save_tiny, tiny_model, tiny_tokenizer


def test_a_complete_checkpoint_loads(tmp_path):
    model = load_causal_lm(save_tiny(tmp_path / "m"), dtype=torch.bfloat16, device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def _drop(path, pick):
    tensors = load_file(path / "model.safetensors")
    victim = next(k for k in tensors if pick(k))
    del tensors[victim]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return victim


def test_a_checkpoint_with_a_missing_tensor_is_refused(tmp_path):
    path = save_tiny(tmp_path / "m")
    victim = _drop(path, lambda k: k.endswith("post_attention_layernorm.weight"))
    with pytest.raises(LoadError, match="missing keys") as e:
        load_causal_lm(path, dtype=torch.bfloat16, device="cpu")
    assert victim in str(e.value) and "random weights" in str(e.value)


def test_a_checkpoint_missing_one_expert_is_refused(tmp_path):
    # transformers fuses per-expert tensors on load: one expert short shows up as a shape mismatch.
    path = save_tiny(tmp_path / "m")
    _drop(path, lambda k: ".experts.3." in k)
    with pytest.raises(LoadError, match="experts"):
        load_causal_lm(path, dtype=torch.bfloat16, device="cpu")


def test_a_checkpoint_with_an_unexpected_tensor_is_refused(tmp_path):
    path = save_tiny(tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mlp.extra_scale"] = torch.ones(3)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoadError, match="unexpected keys.*extra_scale"):
        load_causal_lm(path, dtype=torch.bfloat16, device="cpu")


def test_pickled_weights_are_never_loaded(tmp_path):
    path = save_tiny(tmp_path / "m")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(LoadError, match="pickled weights are never loaded"):
        load_causal_lm(path, dtype=torch.bfloat16, device="cpu")


def test_not_a_checkpoint_dir_is_explained(tmp_path):
    with pytest.raises(LoadError, match="no config.json"):
        load_causal_lm(tmp_path, dtype=torch.bfloat16, device="cpu")


def test_fingerprint_follows_content(tmp_path):
    path = save_tiny(tmp_path / "m")
    a = fingerprint(path)
    assert a == fingerprint(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (path / "config.json").write_text(json.dumps(cfg))
    assert fingerprint(path) != a
    assert model_identity(path)["model_hash"] == fingerprint(path)


def test_tensor_bytes_are_measured_from_the_tensors():
    model = tiny_model(dtype=torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    assert tensor_bytes(model) >= 2 * n_params
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert experts > 0 and experts_tensor_bytes(model) == 2 * experts


@pytest.mark.parametrize("cut", [4, 100, 0.5])
def test_a_truncated_safetensors_file_is_refused_by_name(tmp_path, cut):
    path = save_tiny(tmp_path / "m")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * cut) if isinstance(cut, float) else cut])
    with pytest.raises(LoadError, match="copy or download it again") as e:
        load_causal_lm(path, dtype=torch.bfloat16, device="cpu")
    assert str(weights) in str(e.value)


def test_a_checkpoint_without_tokenizer_files_is_refused_naming_them(tmp_path):
    # transformers gives such a checkpoint an empty tokenizer: every prompt was 0 tokens and the run crashed in the
    # model (IndexError) instead of saying what the checkpoint lacks
    from transformers import AutoTokenizer

    from quantbench.models.families import decision_engine
    from quantbench.run.spec import RunSpec

    path = save_tiny(tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    model = load_causal_lm(path, dtype=torch.float32, device="cpu")
    with pytest.raises(LoadError, match="no tokenizer files") as e:
        decision_engine(model, AutoTokenizer.from_pretrained(path), RunSpec(backend="bf16"), path)
    assert str(path) in str(e.value)
    engine = decision_engine(model, tiny_tokenizer(), RunSpec(backend="bf16"), path)  # a real tokenizer still goes
    assert engine is not None


def _shard(path):
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    keys = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :]), start=1):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, path / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_a_sharded_checkpoint_loads_and_one_missing_a_shard_is_refused_naming_it(tmp_path):
    from quantbench.models.checkpoint import check_safetensors_only

    path = _shard(save_tiny(tmp_path / "m"))
    check_safetensors_only(path)
    assert load_causal_lm(path, dtype=torch.bfloat16, device="cpu") is not None
    (path / "model-00002-of-00002.safetensors").unlink()  # an interrupted download
    # before: "the checkpoint does not match the model's config (No such file or directory: ...)" from the child
    with pytest.raises(LoadError, match=r"1 of the 2 shards its model.safetensors.index.json names is not there "
                                        r"\(model-00002-of-00002.safetensors\); a partial checkpoint never runs"):
        check_safetensors_only(path)
    (path / "model.safetensors.index.json").write_text("{")
    with pytest.raises(LoadError, match="index.json: not valid JSON"):
        check_safetensors_only(path)
