"""Checkpoints brought by a user, second pass: what auto-round 0.16.1, ModelOpt 0.47.0 and transformers write
themselves, and damaged or odd checkpoints (tokenizer files, chat templates, shards, dtypes, remote code, configs
that disagree with their tensors). Each checkpoint is made by hand from the tiny random model (tests/tiny.py) in the
layout the library writes (seconds, not minutes); the layouts were checked against the libraries' own exports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantbench.errors import LoadError
from quantbench.run.spec import RunSpec
from tests.test_qa_checkpoints import _autoround_config, _int4_tensors, _modelopt_tensors, _rewrite
from tests.tiny import save_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "bf16")


def _copy(src: Path, dst: Path, config=None) -> Path:
    shutil.copytree(src, dst)
    if config is not None:
        file = dst / "config.json"
        data = json.loads(file.read_text())
        config(data)
        file.write_text(json.dumps(data, indent=2))
    return dst


def _preflight(path: Path, backend: str = "bf16") -> dict:
    from quantbench.run.runner import preflight

    return preflight(RunSpec(backend=backend, model=str(path), gpu="cpu"))


# -- tokenizer files and chat templates ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_tokenizer_file_that_is_not_json_is_refused_naming_it(tiny, tmp_path, name):
    """A cut-short tokenizer.json crashed the run's child with a bare `JSONDecodeError: Expecting value` (and
    quantize's library child with a traceback in its log): refused before anything loads, naming the file."""
    from quantbench.make.quantize.source import check_source

    bad = _copy(tiny, tmp_path / "bad")
    (bad / name).write_text('{"version": ')
    with pytest.raises(LoadError, match=rf"bad/{name}: not valid JSON"):
        _preflight(bad)
    with pytest.raises(LoadError, match=rf"bad/{name}: not valid JSON"):
        check_source(bad, tmp_path / "out")


def test_a_tokenizer_json_of_another_schema_is_a_load_error(tiny, tmp_path):
    """`{}` as tokenizer.json crashed the child with `KeyError: 'added_tokens'` (classified 'crashed')."""
    from quantbench.models.checkpoint import load_tokenizer

    odd = _copy(tiny, tmp_path / "odd")
    (odd / "tokenizer.json").write_text("{}")
    with pytest.raises(LoadError, match=r"its tokenizer cannot be built from its files \(tokenizer.json"):
        load_tokenizer(odd)


def test_a_chat_template_that_does_not_render_is_refused_at_load(tiny, tmp_path):
    """A chat template with a syntax error crashed the child on its first question (`TemplateSyntaxError:
    unexpected '}'`, named no file); the engine is refused, naming where the template lives."""
    from transformers import AutoTokenizer

    from quantbench.models.families import decision_engine
    from tests.tiny import tiny_model

    broken = _copy(tiny, tmp_path / "tpl")
    file = broken / "tokenizer_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "chat_template": "{% for m in messages %}{{ m }"}))
    spec = RunSpec(backend="bf16", model=str(broken), gpu="cpu")
    with pytest.raises(LoadError, match=r"its chat template \(tokenizer_config.json chat_template.*TemplateSyntaxError"):
        decision_engine(tiny_model(), AutoTokenizer.from_pretrained(broken), spec, broken)


# -- shards ---------------------------------------------------------------------------------------------------------------
def _sharded(tiny: Path, dst: Path) -> Path:
    tensors = load_file(str(tiny / "model.safetensors"))
    keys = sorted(tensors)
    shutil.copytree(tiny, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        name = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(dst / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


@pytest.mark.parametrize("stray", ["model-00003-of-00003.safetensors", "model.safetensors"])
def test_a_safetensors_file_its_index_does_not_name_is_refused(tiny, tmp_path, stray):
    """transformers reads the shards the index names; quantbench's own readers (the nvfp4 / fp8 loader, the experts
    check, quantize's unchanged check) read every *.safetensors. A stray shard ran as bf16 but failed quantizing
    after calibration ('the source's non-expert tensor junk.weight is missing; the quantizer changed …'), and a
    model.safetensors left beside an index made the strict loader see every tensor twice."""
    from quantbench.models.checkpoint import check_safetensors_only

    path = _sharded(tiny, tmp_path / "sharded")
    check_safetensors_only(path)  # the shards the index names, and nothing else: fine
    save_file({"junk.weight": torch.zeros(3)}, str(path / stray))
    with pytest.raises(LoadError, match=rf"{stray.replace('.', '[.]')} is not named in its model.safetensors.index.json"):
        check_safetensors_only(path)


def test_a_tensor_in_two_shards_is_refused_not_taken_from_the_later_one(tiny, tmp_path):
    """lm_head.weight in shard 1 (as the index says) and, zeroed, in shard 2: transformers loaded the later copy,
    ignoring the index, and the bf16 run answered with a zero lm_head. Refused, naming the tensor and both files."""
    from quantbench.models.checkpoint import check_safetensors_only

    path = _sharded(tiny, tmp_path / "sharded")
    second = path / "model-00002-of-00002.safetensors"
    save_file({**load_file(str(second)), "lm_head.weight": torch.zeros(600, 128, dtype=torch.bfloat16)}, str(second),
              metadata={"format": "pt"})
    with pytest.raises(LoadError, match=r"tensor lm_head.weight is in both model-00001-of-00002.safetensors and "
                                        r"model-00002-of-00002.safetensors \(its model.safetensors.index.json names "
                                        r"model-00001"):
        check_safetensors_only(path)


# -- quantize's source ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_quantize_refuses_a_source_that_is_not_bfloat16_before_calibrating(tiny, tmp_path, dtype):
    """A float16 (or float32) source was loaded in bfloat16, calibrated, exported, then failed the byte-identical
    check: 'non-expert tensor lm_head.weight is BF16, the source's is F16; the quantizer changed …'. Refused first,
    naming the dtype and the fix."""
    from quantbench.make.quantize.source import check_source

    source = _copy(tiny, tmp_path / "src")
    tensors = load_file(str(tiny / "model.safetensors"))
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(source / "model.safetensors"), metadata={"format": "pt"})
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(LoadError, match=rf"its weights are {name} \(model.safetensors: .*save the model in bfloat16"):
        check_source(source, tmp_path / "out")
    check_source(tiny, tmp_path / "out")  # the BF16 checkpoint itself passes


# -- remote code ----------------------------------------------------------------------------------------------------------
def test_run_refuses_an_architecture_that_exists_only_as_the_checkpoints_code(tiny, tmp_path):
    """A model_type transformers does not have, with an auto_map: `run` warned it would load 'transformers'
    built-in XForCausalLM instead' (there is none), then the child failed; refused in the parent, naming the flag.
    Nothing of the checkpoint's code runs."""
    remote = _copy(tiny, tmp_path / "remote", lambda c: c.update(
        model_type="xmoe", architectures=["XForCausalLM"],
        auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}))
    marker = tmp_path / "ran"
    for f in ("configuration_x.py", "modeling_x.py"):
        (remote / f).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(LoadError, match=r"model_type 'xmoe' is not built into transformers .*--trust-remote-code"):
        _preflight(remote)
    assert not marker.exists()


# -- ModelOpt: KV-cache quantization as it writes it into config.json ------------------------------------------------------
def test_modelopts_kv_cache_scheme_in_config_json_is_refused_by_name(tiny, tmp_path):
    """ModelOpt 0.47 with a KV-cache config writes `kv_cache_quant_algo` only to hf_quant_config.json and, in
    config.json's quantization_config, `kv_cache_scheme`: the run was refused for 'tensors the model has no place
    for: …k_proj.k_scale…; the checkpoint does not match its config'. It is named as KV-cache quantization."""
    from quantbench.models.layout import read_layout

    kv = _copy(tiny, tmp_path / "kv", lambda c: c.__setitem__("quantization_config", {
        "quant_method": "modelopt", "quant_algo": "FP8", "producer": {"name": "modelopt", "version": "0.47.0"},
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}))
    with pytest.raises(LoadError, match=r"kv/config.json quantization_config: kv_cache_scheme .*KV-cache quantization "
                                        r"is not emulated"):
        read_layout(kv)


# -- configs that disagree with the tensors -------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["fp8", "nvfp4"])
def test_a_config_whose_moe_intermediate_size_disagrees_with_the_experts_is_refused(tiny, tmp_path, scheme):
    """moe_intermediate_size 128 in config.json over experts of 64: bf16 and int4 refuse it (mismatched keys), the
    nvfp4 / fp8 loader built the experts from the tensors and ran."""
    from quantbench.models.modelopt import load_quantized

    qc = {"quant_method": "modelopt", "quant_algo": scheme.upper(), "ignore": ["lm_head"]}
    good = _rewrite(tiny, tmp_path / "good", _modelopt_tensors(tiny, scheme, static=True), qc)
    load_quantized(good, scheme=scheme, dtype=torch.float32)  # the right config loads
    wrong = _copy(good, tmp_path / "wrong", lambda c: c.__setitem__("moe_intermediate_size", 128))
    with pytest.raises(LoadError, match=r"experts of model\.layers\.0\.mlp\.experts are \(8, 128, 128\) .* gives "
                                        r"\(8, 256, 128\)"):
        load_quantized(wrong, scheme=scheme, dtype=torch.float32)


# -- auto-round's group_size -1 ---------------------------------------------------------------------------------------------
def test_an_int4_export_with_group_size_minus_one_is_checked_as_int4_and_loads(tiny, tmp_path):
    """auto-round's group_size -1 (one scale per output row: scales [1, N]) gives gate/up (hidden inputs) and down
    (moe_intermediate inputs) groups of different widths: the experts check read each layer as 'mixed' and refused
    it ('it is in no format quantbench runs'), though auto-round and quantbench's engine both run it."""
    from backends.int4 import Int4Backend
    from quantbench.models import experts_claim
    from quantbench.run.machine import detect

    path = _rewrite(tiny, tmp_path / "gm1", _int4_tensors(tiny, group=-1, codes=0x89ABCDEF, scale=0.01),
                    _autoround_config(sym=True, group=-1))
    record = experts_claim.check("int4", path)
    assert {(v["format"], v["group_size"]) for v in record["layers"].values()} == {("int4", -1)}
    loaded = Int4Backend().load(RunSpec(backend="int4", model=str(path), device="cpu", dtype="float32"), detect())
    assert loaded.info.weight_format.startswith("int4 w4a16 g-1 sym")
