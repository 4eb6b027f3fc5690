"""What quantizing prints: one line per step and the progress bar; the libraries' own output (auto-round's
INFO/WARNING lines with ANSI colours, module printouts, transformers' bars) goes to a log beside the variant, and
the staging folder's name is never shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantbench.make.quantize import cached_variant, library_log
from quantbench.models.checkpoint import fingerprint
from quantbench.term import libraries_to
from tests.tiny import save_tiny


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-moe")


@pytest.fixture(scope="module")
def tiny_int4(tiny_source, tmp_path_factory) -> tuple[Path, str]:
    """The tiny model's int4 variant, made as `quantbench demo` makes one (groups of 64: its experts are 64 wide),
    and what that printed on stderr."""
    tmp = tmp_path_factory.mktemp("int4")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTBENCH_CACHE", str(tmp / "cache"))
        with libraries_to(tmp / "stderr.txt"):  # here: the test's own capture of fds 1 and 2
            target = cached_variant(tiny_source, "int4", iters=0, nsamples=8, seqlen=64, group_size=64)
    return target, (tmp / "stderr.txt").read_text()


def test_an_int4_variant_prints_its_steps_and_logs_the_library_beside_it(tiny_source, tiny_int4):
    target, said = tiny_int4
    log = library_log(target)
    assert "\x1b[" not in said and not re.search(r"\b(INFO|WARNING)\b", said), said
    assert ".tmp-" not in said and "auto-round-lib" not in said and "Loading weights" not in said, said
    ours = [line for line in said.splitlines() if not line.startswith("AutoRound: ")]  # the bar's own lines
    busy = r"; this machine is busy: load average [\d.]+ on \d+ cores?, so other work competes with this step .*$"
    assert re.sub(busy, "", ours[0]) == (f"int4: quantizing {tiny_source} with auto-round 0.16.1 (optimized RTN, 8 "
                                         f"samples of 64 tokens); the libraries' own log: {log}")  # (a busy VM says so)
    assert re.fullmatch(r"int4: \d+ non-expert tensors \([\d,]+ bytes\) byte-identical to the source", ours[1]), ours
    assert re.fullmatch(r"int4: quantized in \d+\.\d s", ours[2]) and len(ours) == 3, ours
    text = log.read_text()
    assert "quantization tuning time" in text and "WARNING" in text  # auto-round's own lines, kept
    assert log.parent == target.parent and not (target / log.name).exists()
    assert fingerprint(target) == fingerprint(target)  # the log is outside the checkpoint: its hash is stable


def test_a_failed_quantization_names_the_libraries_log(tiny_source, tmp_path, monkeypatch, capfd):
    import shutil

    from quantbench.errors import QuantbenchError

    monkeypatch.setenv("QUANTBENCH_CACHE", str(tmp_path / "cache"))
    broken = shutil.copytree(tiny_source, tmp_path / "broken-moe")
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(QuantbenchError, match=r"the libraries' own log, .*\.quantize\.log"):
        cached_variant(broken, "int4", iters=0, nsamples=8, seqlen=64)
    said = capfd.readouterr().err
    assert "int4: quantizing failed; the libraries' own log: " in said and ".tmp-" not in said


def test_an_int4_run_keeps_auto_rounds_load_messages_on_the_run_instead_of_printing_them(tiny_int4, tmp_path, capfd):
    from quantbench.run.runner import execute
    from quantbench.run.spec import RunSpec

    suite = tmp_path / "mini.jsonl"
    suite.write_text('{"id": "r0", "benchmark": "mini", "request": {"state": {"observation": "a wall"}, '
                     '"questions": {"q": {"type": "boolean"}}}}\n')
    capfd.readouterr()
    result = execute(RunSpec(backend="int4", model=str(tiny_int4[0]), suite=str(suite), gpu="cpu", warmup=0,
                             latency_min_decisions=1, latency_min_seconds=0.0))
    said = capfd.readouterr().err
    assert result.run.status == "ok", result.run.error
    assert "\x1b[" not in said and not re.search(r"\b(INFO|WARNING)\b", said) and "auto-round-lib" not in said
    kept = result.run.extra["library_log"]
    assert any(line.startswith("INFO Inference backend selection") for line in kept), kept


def test_a_variant_keeps_its_sources_tokenizer_files(tiny_source, tiny_int4):
    """auto-round saves the tokenizer it calibrated with, truncation to the calibration length left in it: the
    variant must tokenize as its source does, so its tokenizer files are the source's."""
    import json

    target, _ = tiny_int4
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (tiny_source / name).read_bytes(), name
    assert json.loads((target / "tokenizer.json").read_text())["truncation"] is None
    provenance = json.loads((target / "quantbench_provenance.json").read_text())
    assert "copied from the source" in json.dumps(provenance)
