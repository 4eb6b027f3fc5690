"""`quantbench quantize` given an --out it cannot use, or stopped half way: one line naming --out, and never a
half-written variant left where `run` would load it."""

from __future__ import annotations

import pytest

from quantbench.errors import ConfigError
from quantbench.make.quantize import quantize
from tests.tiny import save_tiny


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-moe")


def test_an_out_that_is_a_file_is_refused_naming_out(source, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    with pytest.raises(ConfigError, match=r"--out .*notes.txt: a file, not a directory"):  # was NotADirectoryError
        quantize(source, "int4", file)
    assert file.read_text() == "mine"


def test_an_out_that_cannot_be_written_is_refused_before_quantizing(source, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"--out .*: cannot write there \(.*\); give a directory on a writable disk"):
        quantize(source, "int4", tmp_path / "file" / "sub" / "v")  # was an OSError's traceback (a read-only disk too)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_a_quantization_stopped_half_way_leaves_no_variant(source, tmp_path, monkeypatch, capfd, stop):
    from quantbench.make.quantize import autoround

    def half(src, out, recipe, **kw):
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"\0" * 64)
        raise stop

    monkeypatch.setattr(autoround, "quantize_autoround", half)
    out = tmp_path / "v"
    with pytest.raises(type(stop) if isinstance(stop, BaseException) else stop):
        quantize(source, "int4", out)
    assert not out.exists()  # before: config.json and a cut model.safetensors, no provenance, loadable by `run`
    assert "int4: quantizing failed; the libraries' own log: " in capfd.readouterr().err


@pytest.mark.parametrize(("args", "says"), [
    (["--scheme", "nvfp4", "--group-size", "64"], "--group-size 64 with --scheme nvfp4: auto-round's int4 settings"),
    (["--scheme", "fp8", "--iters", "200"], "--iters 200 with --scheme fp8: auto-round's int4 settings"),
    (["--nsamples", "0"], "--nsamples 0: give 1 or more calibration samples"),
    (["--seqlen", "4"], "--seqlen 4: give 8 or more tokens"),
    (["--iters", "-1"], "--iters -1: give 0 (RTN) or more (SignRound)"),
])
def test_settings_quantize_would_ignore_or_cannot_use_are_one_line_naming_the_flag(source, tmp_path, args, says):
    # before: nvfp4 / fp8 took --group-size and --iters without effect (into the recipe's hash), and a count out of
    # range printed the Recipe dataclass's repr
    from typer.testing import CliRunner

    from quantbench.cli import app

    done = CliRunner().invoke(app, ["quantize", "--model", str(source), "--out", str(tmp_path / "v"), *args],
                              env={"COLUMNS": "400"})
    assert done.exit_code == 2 and says in done.output, done.output
    assert "Recipe(" not in done.output and not (tmp_path / "v").exists()
