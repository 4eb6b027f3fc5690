"""Variants made elsewhere meet their BF16 base (issue #22 item 12): the evidence a run records (quantbench.models.lineage)
on checkpoints made by auto-round and ModelOpt directly, with no quantbench provenance, and the report / compare
pairing a variant with its base by that evidence."""

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from quantbench import report
from quantbench.analysis import parity
from quantbench.errors import ConfigError
from quantbench.models import lineage
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests.stored import stored_run
from tests.test_report import Lab

ROOT = Path(__file__).resolve().parent.parent

def test_the_tensors_quantization_leaves_alone_hash_the_same_in_a_variant_and_its_base(made_elsewhere):
    digest = {k: lineage.shared_tensors_hash(p) for k, p in made_elsewhere.items()}
    assert digest["bf16"] is not None and len(digest["bf16"]) == 64
    assert digest["int4"] == digest["bf16"]  # auto-round quantized attention too; embeddings, norms, router stay
    assert digest["nvfp4"] == digest["bf16"]
    assert digest["other"] != digest["bf16"]  # another model of the same shape
    assert lineage.shared_tensors_hash(made_elsewhere["bf16"].parent) is None  # no safetensors: no evidence


def test_the_model_card_base_model_and_base_model_flag_are_recorded(made_elsewhere, tmp_path):
    card = tmp_path / "card"
    card.mkdir()
    (card / "README.md").write_text("---\nlicense: apache-2.0\nbase_model:\n- acme/Tiny-MoE\n"
                                    "base_model_relation: quantized\n---\n# an int4 of Tiny-MoE\n")
    assert lineage.model_card_base(card) == "acme/Tiny-MoE"
    (card / "README.md").write_text("# no front matter\nbase_model: not/this\n")
    assert lineage.model_card_base(card) is None
    assert lineage.resolve_given_base(str(made_elsewhere["bf16"])) == "Tiny-MoE"  # what its BF16 runs record
    assert lineage.resolve_given_base("acme/Tiny-MoE") == "acme/Tiny-MoE"
    with pytest.raises(ConfigError, match="--base-model .*no config.json"):
        lineage.resolve_given_base(str(tmp_path))


def test_a_run_of_a_checkpoint_made_elsewhere_records_its_base_and_how(made_elsewhere, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    int4 = made_elsewhere["int4"]
    (int4 / "README.md").write_text("---\nbase_model: acme/Tiny-MoE\n---\n")
    try:
        result = execute(RunSpec(backend="int4", model=str(int4), gpu="cpu", limit=1, warmup=0,
                                 latency_min_decisions=1, latency_min_seconds=0.0), echo=False)
    finally:
        (int4 / "README.md").unlink()
    run = result.run.model_dump()
    assert run["status"] == "ok", run.get("error")
    assert run["model_id"] == int4.name  # its own id: nothing but the evidence ties it to Tiny-MoE
    assert (run["base_model"], run["base_model_how"]) == ("acme/Tiny-MoE", "model_card")
    assert run["shared_tensors_hash"] == lineage.shared_tensors_hash(made_elsewhere["bf16"])
    Store(tmp_path / "r.duckdb").write_run(result)  # the columns exist in the store


# -- pairing in the report and in compare --------------------------------------------------------------------
def test_the_report_pairs_variants_made_elsewhere_with_their_base_and_says_how(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=60)
    shared = "ab" * 32
    lab.run(model_id="Tiny-MoE", model_path="/models/Tiny-MoE", shared_tensors_hash=shared)
    int4 = lab.run(lab.answers(noise=0.01, seed=3), backend="int4", variant="int4", model_id="Tiny-MoE-w4g128",
                   shared_tensors_hash=shared, model_tensor_bytes=20_000_000)
    nvfp4 = lab.run(lab.answers(noise=0.01, seed=4), backend="nvfp4", variant="nvfp4-packed", model_id="nvfp4",
                    base_model="acme/Tiny-MoE", base_model_how="model_card", shared_tensors_hash="cd" * 32,
                    model_tensor_bytes=25_000_000)
    fp8 = lab.run(backend="fp8", variant="fp8", model_id="fp8-of-it", base_model="Tiny-MoE", base_model_how="given",
                  model_tensor_bytes=30_000_000)
    stranger = lab.run(backend="int4", variant="int4", model_id="unrelated-int4", shared_tensors_hash="ef" * 32)
    reps = report.build_report(lab.store)
    assert [(r.model_id, [row.label for row in r.rows]) for r in reps] == [
        ("Tiny-MoE", ["bf16", "fp8", "int4", "nvfp4-packed"]), ("unrelated-int4", ["int4"])]
    tiny, lone = reps
    assert tiny.recommended.label == "int4" and tiny.recommended.run.run_id == int4
    assert "no BF16 reference" in lone.rule
    notes = "\n".join(tiny.notes)
    assert "int4 is the checkpoint Tiny-MoE-w4g128, compared with this model's BF16 run because of identical " \
           "embeddings, norms and router weights" in notes
    assert "nvfp4-packed is the checkpoint nvfp4, compared with this model's BF16 run because of its model " \
           "card's base_model (acme/Tiny-MoE)" in notes
    assert "fp8 is the checkpoint fp8-of-it, compared with this model's BF16 run because of `run --base-model " \
           "Tiny-MoE`" in notes
    flat = report.flat_rows(reps).set_index("run_id")
    assert flat.loc[nvfp4, "paired_by"] == "model_card" and flat.loc[nvfp4, "own_model_id"] == "nvfp4"
    assert flat.loc[fp8, "paired_by"] == "given" and pd.isna(flat.loc[stranger, "paired_by"])
    assert [r.model_id for r in report.build_report(lab.store, model="Tiny-MoE-w4g128")] == ["Tiny-MoE"]

    comp = parity.compare(lab.store, int4)  # compare finds the same base without --reference
    assert comp.reference.model_id == "Tiny-MoE"
    assert comp.reference_how == ("same GPU; paired with its base by identical embeddings, norms and router "
                                  "weights (the tensors quantization leaves alone)")
    assert json.dumps(comp.to_dict())


def test_a_base_that_names_no_bf16_run_falls_back_to_the_shared_tensors():
    # A model card may name a base under a name no BF16 run uses (an org's mirror, a renamed folder): the
    # identical embeddings, norms and router weights still pair the variant with its base.
    bf16 = stored_run(run_id="b", backend="bf16", model_id="Tiny-MoE", model_path="/m/Tiny-MoE",
                      shared_tensors_hash="ab" * 32)
    other = replace(bf16, run_id="o", model_id="Other-MoE", model_path=None, shared_tensors_hash="cd" * 32)
    run = stored_run(run_id="v", backend="int4", model_id="Tiny-MoE-int4", base_model="acme/Mirror-Of-Tiny",
                     base_model_how="model_card", shared_tensors_hash="ab" * 32)
    assert lineage.pair(run, [other, bf16]) == ([bf16], "tensors")
    assert lineage.pair_runs([bf16, other, run]) == {"v": ("Tiny-MoE", "tensors")}
    assert lineage.pair(replace(run, shared_tensors_hash="ef" * 32), [other, bf16]) == ([], None)


def test_a_sweep_names_the_base_of_a_variant_given_under_its_model(tmp_path):
    from quantbench.sweep import load_sweep
    from quantbench.sweep.planning import plan

    for name in ("Tiny-MoE", "Tiny-MoE-int4"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    (tmp_path / "sweep.toml").write_text(textwrap.dedent(f"""
        name = "elsewhere"
        [[models]]
        name = "tiny"
        path = "{tmp_path / 'Tiny-MoE'}"
        int4 = "{tmp_path / 'Tiny-MoE-int4'}"
        [[variants]]
        backend = "bf16"
        [[variants]]
        backend = "int4"
    """))
    specs = {r.spec.backend: r.spec for r in plan(load_sweep(tmp_path / "sweep.toml"))}
    assert specs["int4"].base_model == "Tiny-MoE" and specs["bf16"].base_model is None


def test_a_store_from_before_the_lineage_columns_still_reports_and_migrates(tmp_path):
    import duckdb

    from quantbench.store.schema import SCHEMA_VERSION, VIEWS

    path = tmp_path / "old.duckdb"
    Store(path).migrate(target=3)
    con = duckdb.connect(str(path))
    con.execute(VIEWS)  # as the version-3 quantbench left them (they name none of the new columns)
    con.execute("INSERT INTO runs (run_id, status, created_at, backend, variant, model_id, suite_id, suite_hash, "
                "device, host, weights) VALUES ('01a2300d-0000-7000-8000-000000000001', 'ok', now(), 'int4', 'int4', "
                "'someone-int4', 'builtin', 's1', 'cpu', 'box', 'checkpoint')")
    con.close()
    [rep] = report.build_report(Store(path))  # read only: the store stays at version 3
    assert rep.model_id == "someone-int4" and "no BF16 reference" in rep.rule
    assert Store(path).schema_version() == 3
    assert Store(path).migrate() == SCHEMA_VERSION
    cols = set(Store(path).read("SELECT * FROM runs").columns)
    assert {"base_model", "base_model_how", "shared_tensors_hash"} <= cols


def test_run_refuses_a_base_model_directory_that_is_no_checkpoint_before_spawning(tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    result = CliRunner().invoke(app, ["run", "--backend", "int4", "--base-model", str(tmp_path), "--db",
                                      str(tmp_path / "r.duckdb")], terminal_width=200)
    assert result.exit_code == 2
    assert f"--base-model {tmp_path}: the directory has no config.json" in " ".join(result.output.split())
    assert not (tmp_path / "r.duckdb").exists()  # nothing ran, nothing stored
