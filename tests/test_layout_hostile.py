"""Quantization configs written by hand or by other tools: every one is read or refused naming the file and the
fix (a LoadError, so the run is a `load_error` row), never a crash of the run's child (JSONDecodeError,
AttributeError)."""

import json

import pytest

from quantbench.errors import LoadError
from quantbench.models.layout import read_layout

CONFIG = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}
HF_QUANT = {"producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16}}


def checkpoint(tmp_path, config: dict, hf_quant: str | None = None):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (tmp_path / "hf_quant_config.json").write_text(hf_quant)
    return tmp_path


def test_an_hf_quant_config_beside_a_plain_config_is_read(tmp_path):
    layout = read_layout(checkpoint(tmp_path, CONFIG, json.dumps(HF_QUANT)))
    assert (layout.scheme, layout.producer) == ("nvfp4", "modelopt")


@pytest.mark.parametrize(("text", "message"), [
    ("{nope", "hf_quant_config.json: not valid JSON"),
    ("[1]", "hf_quant_config.json: must be a JSON object with a quantization object, got a list"),
    ('{"producer": {}}', "got no quantization"),
    ('{"quantization": "NVFP4"}', "got quantization str"),
])
def test_a_broken_hf_quant_config_is_a_load_error_naming_the_file(tmp_path, text, message):
    with pytest.raises(LoadError, match="fix or restore the file") as e:
        read_layout(checkpoint(tmp_path, CONFIG, text))
    assert message in str(e.value)


def test_what_hf_quant_config_says_is_refused_naming_that_file(tmp_path):
    algo = {**HF_QUANT, "quantization": {**HF_QUANT["quantization"], "quant_algo": "NVFP4_AWQ"}}
    with pytest.raises(LoadError, match=r"hf_quant_config.json quantization: ModelOpt quant_algo 'NVFP4_AWQ'"):
        read_layout(checkpoint(tmp_path, CONFIG, json.dumps(algo)))


def test_an_nvfp4_group_size_other_than_16_in_hf_quant_config_is_refused(tmp_path):
    # before, hf_quant_config.json's group_size was never read: a file saying 32 loaded as 16
    g32 = {**HF_QUANT, "quantization": {**HF_QUANT["quantization"], "group_size": 32}}
    with pytest.raises(LoadError, match=r"hf_quant_config.json quantization: NVFP4 group_size 32"):
        read_layout(checkpoint(tmp_path, CONFIG, json.dumps(g32)))


@pytest.mark.parametrize("qc", ["modelopt", ["modelopt"], 4])
def test_a_quantization_config_that_is_not_an_object_is_a_load_error(tmp_path, qc):
    with pytest.raises(LoadError, match="quantization_config must be a JSON object"):
        read_layout(checkpoint(tmp_path, {**CONFIG, "quantization_config": qc}))


def test_a_producer_or_config_groups_of_another_type_reads_as_absent(tmp_path):
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": "modelopt", "config_groups": []}
    assert read_layout(checkpoint(tmp_path, {**CONFIG, "quantization_config": qc})).scheme == "nvfp4"
