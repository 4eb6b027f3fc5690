"""A variant is what it claims (issue #35 item 4): every MoE layer's experts, read from the checkpoint's tensors,
against the backend asked to run it. The checkpoints are auto-round's and ModelOpt's own (tests/elsewhere.py):
an INT4 whose config says bits 4 while auto-round kept half (or all) of its experts at 16 bits is refused before it
loads, naming the layers, and a run of it is stored as a failed run with the per-layer map, never as INT4."""

import json

import pytest

from quantbench import report
from quantbench.errors import LoadError
from quantbench.models import experts_claim
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store


def test_a_correct_int4_passes_and_its_map_says_what_every_layer_is(made_elsewhere):
    record = experts_claim.check("int4", made_elsewhere["int4"])
    assert record["result"] == "every expert of 2 MoE layers is int4"
    assert record["claim"] == {"backend": "int4", "formats": ["int4"], "bits": 4, "group_size": 32}
    for layer in ("0", "1"):
        info = record["layers"][layer]
        assert (info["format"], info["bits"], info["group_size"], info["packed_dtype"], info["experts"]) == (
            "int4", 4, 32, "I32", 8)
        assert 4.0 < info["bits_per_weight"] < 5.0  # 4-bit codes plus fp16 scales and packed zero points per 32
    nvfp4 = experts_claim.check("nvfp4", made_elsewhere["nvfp4"])["layers"]["0"]
    assert (nvfp4["format"], nvfp4["bits"], nvfp4["group_size"], nvfp4["packed_dtype"]) == ("nvfp4", 4, 16, "U8")
    bf16 = experts_claim.check("bf16", made_elsewhere["bf16"])["layers"]["1"]
    assert (bf16["format"], bf16["bits"], bf16["bits_per_weight"]) == ("bf16", 16, 16.0)


def test_a_half_quantized_auto_round_checkpoint_is_refused_naming_its_layers(made_elsewhere):
    half = made_elsewhere["int4-half"]
    config = json.loads((half / "config.json").read_text())["quantization_config"]
    assert config["bits"] == 4  # the config says INT4 ...
    with pytest.raises(LoadError) as e:
        experts_claim.check("int4", half)
    message = str(e.value)
    assert "--backend int4 claims int4 (4 bits, group 32, as its quantization_config says) experts" in message
    assert "not run as int4: only 1 of 2" in message
    assert "only 1 of 2 MoE layers' experts are int4" in message and "in layer 1)" in message  # ... layer 1 is not
    assert "will not run it as int4" in message and "quantize every expert" in message
    layers = e.value.record["layers"]
    assert layers["0"]["format"] == "int4" and layers["1"]["format"] in ("bf16", "fp32")  # fp32: no native bf16 here
    assert layers["1"]["bits_per_weight"] >= 16


def test_quantized_experts_are_refused_by_the_bf16_backend(made_elsewhere):
    with pytest.raises(LoadError, match=r"every MoE layer's experts are int4 .*run it with --backend int4"):
        experts_claim.check("bf16", made_elsewhere["int4"])


def test_an_int4_whose_experts_are_bf16_is_stored_as_a_refused_run_never_as_int4(made_elsewhere, tmp_path):
    bf16_experts = made_elsewhere["int4-bf16-experts"]
    result = execute(RunSpec(backend="int4", model=str(bf16_experts), gpu="cpu", limit=1, warmup=0,
                             latency_min_decisions=1, latency_min_seconds=0.0), echo=False)
    run = result.run.model_dump()
    assert run["status"] == "failed" and run["failure"] == "load_error"
    assert "every MoE layer's experts are" in run["error"] and "will not run it as int4" in run["error"]
    assert run["variant"] is None and not result.latencies and not result.answers  # nothing measured as INT4
    experts = run["extra"]["experts"]
    assert experts["result"].startswith("refused") and set(experts["layers"]) == {"0", "1"}
    assert {info["format"] for info in experts["layers"].values()} <= {"bf16", "fp32"}
    store = Store(tmp_path / "r.duckdb")
    store.write_run(result)
    md = report.report_text(str(store.path))
    assert "int4 w4a16" not in md  # no row claims the INT4 format
    assert "load_error" in md and "not run as int4: every MoE layer's experts are" in md  # refused, with why


def test_the_server_refuses_to_serve_it_as_int4_too(made_elsewhere):
    from quantbench.server.command import cli_serve

    # --demo loads in this process and answers once: the check comes before the model loads (no auto-round import)
    with pytest.raises(LoadError, match="not run as int4: only 1 of 2 MoE layers' experts are int4"):
        cli_serve(str(made_elsewhere["int4-half"]), "int4", demo=True)


@pytest.mark.parametrize(("change", "says"), [
    ({"group_size": 64}, "its quantization_config says 4 bits, group 64, but the experts' tensors are 4 bits, group 32"),
    ({"bits": 8}, "its quantization_config says 8 bits, group 32, but the experts' tensors are 4 bits, group 32"),
])
def test_an_int4_config_that_does_not_describe_its_experts_says_so(made_elsewhere, tmp_path, change, says):
    # before: "every MoE layer's experts are int4 ..., while --backend int4 claims int4 ...: run it with --backend int4"
    import shutil

    copy = shutil.copytree(made_elsewhere["int4"], tmp_path / "int4")
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"].update(change)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError) as e:
        experts_claim.check("int4", copy)
    assert says in str(e.value) and "(layers 0, 1)" in str(e.value)
    assert "fix config.json's quantization_config" in str(e.value) and "run it with --backend" not in str(e.value)
