"""Each backend declares its own settings once (its `Options`); the `run` flags, the sweep keys and checks, the
labels, the config hash and the stored spec are derived from those declarations."""

import json
from importlib.metadata import EntryPoint
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.main
from typer.testing import CliRunner

from backends.int4 import Int4Backend
from quantbench.cli import app
from quantbench.cli.run import DEMO_VARIANTS
from quantbench.errors import ConfigError
from quantbench.run import backend as backend_module
from quantbench.run import spec as spec_module
from quantbench.run.machine import detect
from quantbench.run.record import RunResult, uuid7
from quantbench.run.runner import spec_hash, stored_spec
from quantbench.run.spec import ENTRY_POINT_GROUP, GroupedMoeOptions, RunSpec, opt
from quantbench.store import Store
from quantbench.sweep import LocalExecutor, Slot, load_sweep, plan, split_finished
from quantbench.sweep import spec as sweep_spec

H200 = SimpleNamespace(gpu_name="NVIDIA H200", host="node-1")
CPU = SimpleNamespace(gpu_name=None, host="pinhost")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def _stored(store: Store, spec: RunSpec, machine) -> None:
    row = {**machine.as_row(), "run_id": str(uuid7()), "created_at": "2026-12-02 07:00:00+00", "status": "ok",
           "backend": spec.backend, "spec_hash": spec_hash(spec, machine)}
    store.write_run(RunResult(run=row))


# (1) a setting that changes the measurement makes another configuration ------------------------------------------
def test_a_sweep_varying_cuda_graph_plans_and_runs_both_variants(tmp_path):
    sweep = load_sweep(write(tmp_path, '[[variants]]\nbackend = "bf16"\n'
                                       '[[variants]]\nname = "bf16 no graphs"\nbackend = "bf16"\ncuda_graph = "off"\n'))
    runs = plan(sweep)
    assert [(r.variant, r.spec.options.cuda_graph) for r in runs] == [("bf16", "auto"), ("bf16 no graphs", "off")]
    assert spec_hash(runs[0].spec, H200) != spec_hash(runs[1].spec, H200)
    store = Store(tmp_path / "r.duckdb")
    _stored(store, runs[0].spec, detect())  # the graphs-on run is stored: only the graphs-off one is left to run
    todo, skipped = split_finished(runs, store, LocalExecutor([Slot("cpu", detect(), {}, cpu=True)]).accepts)
    assert [r.variant for r in todo] == ["bf16 no graphs"] and [r.variant for r in skipped] == ["bf16"]


# (2) a label-only change is the same configuration ------------------------------------------------------------
def test_name_and_notes_do_not_change_the_config_hash(tmp_path):
    a = plan(load_sweep(write(tmp_path, '[[variants]]\nbackend = "int4"\n')))[0].spec
    b = plan(load_sweep(write(tmp_path, '[[variants]]\nname = "w4a16"\nbackend = "int4"\nnotes = "renamed"\n')))[0].spec
    assert a.notes != b.notes
    assert spec_hash(a, CPU) == spec_hash(b, CPU) == DEMO_HASHES["int4"]


# (3) every stored row keeps its hash: the demo's variants hash as they did before the options moved ---------------
DEMO_HASHES = {  # computed on main before the move (machine: no GPU, host "pinhost")
    # the two BF16 variants hash anew since bf16's experts kernel defaults to `auto` (2026-12-03: quantbench's
    # engine on a GPU); before, c17bd97cb85af2b4 and 1ebff36a53b60a02. The other four are unchanged.
    "bf16 (reference)": "7c6a2ba83d0c3e0d",
    "bf16 noise floor (second kernel)": "e06ac2ce7b701822",
    "int4": "faa6c59ef0e2cb70",
    "nvfp4 packed": "143d67574437a53c",
    "nvfp4 unpacked": "d14bb9260c62768c",
    "fp8": "f23d648de14c9f8f",
}
FLAT_KEYS = ["backend", "model", "suite", "gpu", "device", "dtype", "experts_impl", "fast_moe", "nvfp4_mode",
             "nvfp4_activations", "endpoint", "concurrency", "api_key", "base_model", "shape", "layers", "role",
             "trust_remote_code", "max_options", "max_tokens", "truncate", "method", "cuda_graph", "fused_ops", "warmup",
             "latency_min_decisions", "latency_min_seconds", "limit", "timeout_s", "seed", "notes", "extra"]


def test_the_demo_variants_keep_their_hashes_labels_and_stored_spec(tmp_path):
    assert {name: spec_hash(RunSpec(**kw), CPU) for name, kw in DEMO_VARIANTS} == DEMO_HASHES
    stored = stored_spec(RunSpec(**dict(DEMO_VARIANTS)["bf16 (reference)"]))
    assert list(stored) == FLAT_KEYS  # the `spec` column: today's keys in today's order
    assert (stored["nvfp4_mode"], stored["fast_moe"], stored["cuda_graph"]) == ("packed", True, "auto")
    assert RunSpec.from_dict(stored) == RunSpec(backend="bf16", role="reference")
    toml = "".join(f'[[variants]]\nbackend = "{kw["backend"]}"\n' + (f'nvfp4_mode = "{kw["nvfp4_mode"]}"\n'
                   if "nvfp4_mode" in kw else "") for _, kw in DEMO_VARIANTS[2:])
    toml += '[[variants]]\nbackend = "bf16"\nexperts_impl = "eager"\nrole = "noise_floor"\n'
    labels = [v.label for v in load_sweep(write(tmp_path, toml)).variants]
    assert labels == ["int4", "nvfp4-packed", "nvfp4-unpacked", "fp8", "bf16-eager (noise floor)"]


def test_secrets_are_masked_and_foreign_settings_refused():
    spec = RunSpec(backend="http", endpoint="http://127.0.0.1:8000", api_key="s3cret")
    assert spec.options.api_key == "s3cret" and stored_spec(spec)["api_key"] == "***"
    assert stored_spec(spec)["endpoint"] == "http://127.0.0.1:8000"
    with pytest.raises(ConfigError, match="nvfp4_mode is not a setting of backend bf16; its settings: cuda_graph"):
        RunSpec.from_dict({"backend": "bf16", "nvfp4_mode": "unpacked"})
    with pytest.raises(ConfigError, match=r"nvfp4_mode 'tight' \(backend nvfp4\): use one of packed, unpacked"):
        RunSpec(backend="nvfp4", nvfp4_mode="tight")


def test_a_sweep_refuses_an_option_its_variant_backend_does_not_declare(tmp_path):
    with pytest.raises(ConfigError, match=r"variants\[0\]\.nvfp4_mode: nvfp4_mode is not a setting of backend 'bf16'; "
                                          r"remove it; its settings: cuda_graph, fused_ops, experts_impl"):
        load_sweep(write(tmp_path, '[[variants]]\nbackend = "bf16"\nnvfp4_mode = "unpacked"\n'))
    sweep = load_sweep(write(tmp_path, '[defaults]\nnvfp4_activations = "off"\nlimit = 2\n'
                                       '[[variants]]\nbackend = "bf16"\n[[variants]]\nbackend = "nvfp4"\n'))
    assert [(r.variant, r.spec.options.model_dump().get("nvfp4_activations")) for r in plan(sweep)] == [
        ("bf16", None), ("nvfp4-packed", "off")]  # a [defaults] option reaches the variants that declare it
    with pytest.raises(ConfigError, match=r"defaults\.nvfp4_mode: no variant's backend has the setting nvfp4_mode"):
        load_sweep(write(tmp_path, '[defaults]\nnvfp4_mode = "unpacked"\n[[variants]]\nbackend = "bf16"\n'))


# (4) a new option is one declaration: flags, sweep keys, label and hash follow -----------------------------------
class HintedInt4Options(GroupedMoeOptions):
    group_hint: int = opt(7, "test: a made-up int4 setting", after="--fast-moe", label="-g{}", ge=0)


class HintedInt4Backend(Int4Backend):
    name = "int4hint"
    Options = HintedInt4Options


@pytest.fixture
def installed_hinted(monkeypatch):
    """HintedInt4Backend installed as backend `int4hint`, as its entry point would install it."""
    real = spec_module.entry_points

    def with_hinted(group: str):
        hinted = EntryPoint("int4hint", "tests.test_options:HintedInt4Backend", ENTRY_POINT_GROUP)
        return [*real(group=group), hinted]

    monkeypatch.setattr(spec_module, "entry_points", with_hinted)
    monkeypatch.setattr(backend_module, "entry_points", with_hinted)
    monkeypatch.setattr(sweep_spec, "installed_options", sweep_spec.installed_options.__wrapped__)  # not cached


def test_an_option_declared_once_reaches_flags_sweep_keys_labels_and_hash(tmp_path, installed_hinted):
    run = typer.main.get_command(app).commands["run"]
    params = {p.name: p for p in run.get_params(typer.Context(run))}
    assert params["group_hint"].opts == ["--group-hint"] and params["group_hint"].help == "test: a made-up int4 setting"
    order = [p.name for p in run.get_params(typer.Context(run))]
    assert order.index("group_hint") == order.index("fast_moe") + 1

    sweep = load_sweep(write(tmp_path, '[[variants]]\nbackend = "int4hint"\n'
                                       '[[variants]]\nbackend = "int4hint"\ngroup_hint = 8\n'))
    assert [(v.label, v.settings) for v in sweep.variants] == [("int4hint", {}), ("int4hint-g8", {"group_hint": 8})]
    default, eight = (r.spec for r in plan(sweep))
    assert spec_hash(default, H200) == spec_hash(RunSpec(backend="int4hint"), H200)
    assert spec_hash(eight, H200) != spec_hash(default, H200)
    assert stored_spec(eight)["group_hint"] == 8 and list(stored_spec(eight))[:-1] == FLAT_KEYS
    with pytest.raises(ConfigError, match=r"variants\[0\]\.group_hint: must be zero or more, got -1"):
        load_sweep(write(tmp_path, '[[variants]]\nbackend = "int4hint"\ngroup_hint = -1\n'))


# (5) a flag the chosen backend does not declare is refused, naming the backend ---------------------------------
def test_run_refuses_a_flag_the_backend_does_not_declare(tmp_path):
    db = tmp_path / "r.duckdb"
    result = CliRunner().invoke(app, ["run", "--backend", "bf16", "--nvfp4", "unpacked", "--db", str(db),
                                      "--suite", str(tmp_path / "missing.jsonl")])
    assert result.exit_code == 2
    assert ("--nvfp4 is not a setting of backend bf16; its settings: --cuda-graph, --fused-ops, --experts-impl"
            in " ".join(result.output.split()))
    assert not db.exists()  # refused before anything ran or was stored


def test_run_passes_a_declared_flag_to_the_backend(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("quantbench.cli.run._execute_and_store",
                        lambda spec, db, repeat=None: seen.append(spec) or ("r", "ok"))
    monkeypatch.setattr("quantbench.report.tables.runs_table", lambda runs, title: "")
    monkeypatch.setattr("quantbench.store.queries.stored_runs_by_id", lambda store, run_ids: [])
    CliRunner().invoke(app, ["run", "--backend", "nvfp4", "--nvfp4", "unpacked", "--cuda-graph", "off",
                             "--db", str(tmp_path / "r.duckdb")])
    assert [(s.backend, s.options.nvfp4_mode, s.options.cuda_graph, s.options.nvfp4_activations) for s in seen] == [
        ("nvfp4", "unpacked", "off", "on")]
    assert json.loads(json.dumps(seen[0].to_dict()))["nvfp4_mode"] == "unpacked"


def test_bf16_experts_auto_is_quantbenchs_engine_on_a_gpu_and_transformers_grouped_mm_on_a_cpu():
    from backends.bf16 import Bf16Options, resolve_experts_impl

    assert Bf16Options().experts_impl == "auto"
    assert resolve_experts_impl("auto", "cuda:0") == "quantbench"
    assert resolve_experts_impl("auto", "cpu") == "grouped_mm"
    assert resolve_experts_impl("eager", "cuda:0") == "eager"  # an explicit kernel is never replaced
