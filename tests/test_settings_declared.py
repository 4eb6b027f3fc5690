"""Settings declared once, everything else derived: the server's settings (quantbench.server.settings) become the
`serve` flags, the refusals and what the app is built with; the generic run settings (quantbench.run.settings)
become the `run` flags, the checks before a run and the sweep file's checks; what makes the http backend special
is a declared capability (`remote`), so another backend that declares it is treated the same."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from quantbench.cli import app as cli_app
from quantbench.engine.scoring import TransformersEngine
from quantbench.errors import ConfigError
from quantbench.run.backend import Availability, LoadedVariant
from quantbench.run.record import VariantInfo
from quantbench.run.settings import GENERIC, one_of
from quantbench.run.spec import BackendOptions, RunSpec, opt
from quantbench.server import create_app
from quantbench.server.settings import ServerSettings, declared, flag_of
from quantbench.sweep.spec import load_sweep
from tests.tiny import tiny_model, tiny_tokenizer

LOCAL = "http://127.0.0.1"
FAKE_REMOTE = "tests.test_settings_declared:FakeRemoteBackend"


class FakeRemoteOptions(BackendOptions):
    endpoint: str | None = opt(None, "fake remote backend: its server")


class FakeRemoteBackend:
    """Not http, but declares what makes http special: it answers through a server at its endpoint."""

    name = "fake-remote"
    summary = "test: a second remote backend"
    remote = True
    default_model = None
    Options = FakeRemoteOptions

    def availability(self, machine):
        return Availability(True)

    def load(self, spec, machine):
        raise AssertionError("a remote backend is never loaded by these tests")


def command_params(name: str) -> dict[str, typer.core.click.Parameter]:
    command = typer.main.get_command(cli_app).commands[name]
    return {p.name: p for p in command.get_params(command.make_context(name, []))}


# -- server settings -------------------------------------------------------------------------------------------
def test_every_declared_server_setting_is_a_serve_flag_with_its_default_and_help():
    params = command_params("serve")
    assert declared(), "nothing declared"
    for f, default, _ in declared():
        param = params[f.name]
        assert flag_of(f) in param.opts, (f.name, param.opts)
        assert param.help == f.metadata["help"]
        assert param.default == (None if isinstance(default, tuple) else default), f.name  # a tuple: repeatable
    with_flag = {f.name for f, _, _ in declared()}
    assert {f.name for f in dataclasses.fields(ServerSettings)} - with_flag == {"media_limits"}  # the media flags


def _other_value(f: dataclasses.Field, default: typing.Any) -> tuple[list[str], typing.Any]:
    """Command-line words that set `f` to a value other than its default, and that value."""
    hint = typing.get_type_hints(ServerSettings)[f.name]
    flag = flag_of(f)
    if hint is bool:
        return ([f"--no-{flag[2:]}"] if default else [flag]), not default
    if typing.get_origin(hint) is tuple:
        values = ("box.lan", "other.lan") if typing.get_args(hint)[0] is str else (64, 128)
        return [w for v in values for w in (flag, str(v))], values
    value = default + 3 if hint is int else default + 1.5 if hint is float else "0.0.0.0" if default else "k3y"
    return [flag, str(value)], value


def test_each_server_setting_given_as_a_flag_reaches_the_settings_serve_hands_on(monkeypatch):
    seen = []
    monkeypatch.setattr("quantbench.server.command.cli_serve",
                        lambda model, backend, settings, **kw: seen.append((settings, kw)) or 0)
    for f, default, _ in declared():
        words, value = _other_value(f, default)
        done = CliRunner().invoke(cli_app, ["serve", *words])
        assert done.exit_code == 0, (f.name, done.output)
        settings, kw = seen.pop()
        assert getattr(settings, f.name) == value, f.name
        others = {g.name for g, _, _ in declared()} - {f.name}
        changed = [g for g in others if g != "api_key" and getattr(settings, g) != getattr(ServerSettings(), g)]
        assert not changed, (f.name, changed)
    done = CliRunner().invoke(cli_app, ["serve", "--max-video-frames", "9", "--dtype", "float32", "--seed", "4"])
    settings, kw = seen.pop()
    assert settings.media_limits == {"max_video_frames": 9} and settings.limits().max_video_frames == 9
    assert kw["run"]["dtype"] == "float32" and kw["run"]["seed"] == 4


@pytest.mark.parametrize("name, bad, says", [
    ("max_batch", 0, "--max-batch 0: give 1 or more"),
    ("max_queue", 0, "--max-queue 0: give 1 or more"),
    ("max_queue_ms", -1.0, "--max-queue-ms -1: give 0 or more"),
    ("max_wait_ms", -0.5, "--max-wait-ms -0.5: give 0 or more"),
    ("max_wait_ms", float("nan"), "--max-wait-ms nan: give a finite number, 0 or more"),  # was taken: a NaN wait
    ("max_queue_ms", float("inf"), "--max-queue-ms inf: give a finite number, 0 or more"),
    ("max_body_bytes", 0, "--max-body-bytes 0: give 1 or more"),
    ("max_request_tokens", 0, "--max-request-tokens 0: give 1 or more"),
    ("request_timeout_s", 0.0, "--request-timeout 0: give a positive number"),
    ("header_timeout_s", -1.0, "--header-timeout -1: give a positive number"),
    ("max_questions", 0, "--max-questions 0: give 1 or more"),  # through quantbench.limits
    ("max_options", 1, "--max-options 1: give 2 or more"),
])
def test_a_bad_server_setting_is_refused_naming_its_flag_in_code_and_on_the_command_line(name, bad, says):
    with pytest.raises(ConfigError, match=says):
        ServerSettings(**{name: bad})
    with pytest.raises(ConfigError, match=says):
        create_app(lambda: None, **{name: bad})
    f = next(f for f in dataclasses.fields(ServerSettings) if f.name == name)
    done = CliRunner().invoke(cli_app, ["serve", flag_of(f), str(bad)])
    assert done.exit_code == 2 and says in " ".join(done.output.split()), done.output


def test_create_app_takes_one_settings_object_and_healthz_reports_it():
    model = tiny_model()
    info = VariantInfo(variant="bf16", weight_format="float32", kernel_path="transformers experts=grouped_mm",
                       compute_dtype="float32", model_id="tiny-test", weights="synthetic")
    loaded = LoadedVariant(TransformersEngine(model, tiny_tokenizer()), info, model)
    settings = ServerSettings(warm=False, max_batch=3, max_queue=7, max_queue_ms=250.0, max_wait_ms=2.0,
                              allow_truncation=True, max_body_bytes=5000, max_questions=5, max_options=9,
                              max_total_options=40, max_request_tokens=900, request_timeout_s=12.0,
                              media_limits={"max_video_frames": 8}, allowed_hosts=("box.lan",))
    with TestClient(create_app(lambda: loaded, settings), base_url=LOCAL) as client:
        for _ in range(200):
            body = client.get("/healthz").json()
            if body["status"] == "ok":
                break
        assert (body["max_batch"], body["max_queue"], body["max_queue_ms"], body["max_wait_ms"]) == (3, 7, 250.0, 2.0)
        assert body["allow_truncation"] is True
        limits = body["limits"]
        assert (limits["max_body_bytes"], limits["max_questions"], limits["max_options"], limits["max_total_options"],
                limits["max_request_tokens"], limits["request_timeout_s"], limits["max_video_frames"]) == (
            5000, 5, 9, 40, 900, 12.0, 8)
        assert client.get("/metrics").json()["max_queue"] == 7
    with TestClient(create_app(lambda: loaded, settings), base_url="http://box.lan") as other:
        assert other.get("/healthz").status_code != 400  # --allowed-host reached the guard
    with TestClient(create_app(lambda: loaded, settings), base_url="http://elsewhere.lan") as foreign:
        assert foreign.get("/healthz").status_code == 400
    with pytest.raises(TypeError):
        create_app(lambda: loaded, settings, max_batchez=3)  # a setting that is not declared


# -- generic run settings ----------------------------------------------------------------------------------------
def test_each_generic_setting_is_declared_once_for_runspec_the_run_flags_and_the_checks():
    params = command_params("run")
    for name, how in GENERIC.items():
        assert RunSpec.model_fields[name].default == how.default, name
        if how.flag:
            param = next(p for p in params.values() if how.flag in p.opts)
            assert (param.help, param.default) == (how.help, how.default), name


def test_the_dtypes_declared_are_the_dtypes_the_child_places_weights_in():
    from quantbench.run.placement import DTYPES

    assert set(GENERIC["dtype"].choices) == set(DTYPES)


@pytest.mark.parametrize("name", [n for n, how in GENERIC.items() if how.choices])
def test_a_value_outside_a_generic_settings_choices_names_the_field_and_the_allowed_values(name, tmp_path):
    from quantbench.run.checks import check_spec
    from quantbench.run.machine import detect

    how = GENERIC[name]
    with pytest.raises(ConfigError, match=f"{how.flag or name} 'bogus': use {one_of(how.choices)}"):
        check_spec(RunSpec(backend="bf16", gpu="cpu", **{name: "bogus"}), detect(), FakeRemoteBackend())
    path = tmp_path / "s.toml"
    path.write_text(f'[[variants]]\nbackend = "bf16"\n{name} = "bogus"\n')
    with pytest.raises(ConfigError, match=rf"variants\[0\]\.{name}: 'bogus' is not one of {', '.join(how.choices)}"):
        load_sweep(path)


@pytest.mark.parametrize("name", [n for n, how in GENERIC.items() if how.least is not None or how.above is not None])
def test_a_value_below_a_generic_settings_bound_is_refused_by_the_run_checks_and_the_sweep_file(name, tmp_path):
    from quantbench.run.checks import check_spec
    from quantbench.run.machine import detect

    how = GENERIC[name]
    bad = how.least - 1 if how.least is not None else how.above
    with pytest.raises(ConfigError, match=f"^{how.flag or name} {bad}: "):  # max_options: RunSpec's own limits
        spec = RunSpec(backend="bf16", gpu="cpu", **{name: bad}, **({"shape": "qwen3-30b-a3b"} if name == "layers"
                                                                     else {}))
        check_spec(spec, detect(), FakeRemoteBackend())
    if name == "layers":
        return  # a sweep sets layers on a model, not a variant
    path = tmp_path / "s.toml"
    path.write_text(f'[[variants]]\nbackend = "bf16"\n{name} = {bad}\n')
    with pytest.raises(ConfigError, match=rf"variants\[0\]\.{name}: must be .*, got {bad}"):
        load_sweep(path)


# -- the remote capability: asked by what it declares, not by the backend's name ----------------------------------
@pytest.mark.parametrize("backend", ["http", FAKE_REMOTE])
def test_a_remote_backend_is_not_served_and_its_model_is_neither_resolved_nor_checked(backend):
    from quantbench.run.resolve import resolve
    from quantbench.run.runner import preflight
    from quantbench.server.command import cli_serve

    with pytest.raises(ConfigError, match=f"--backend {backend} sends requests to a server; serve a local model with "
                                          "bf16, fp8, int4, nvfp4"):
        cli_serve(None, backend, demo=True)
    spec = RunSpec(backend=backend, model="org/served-model", endpoint="http://127.0.0.1:9")
    assert resolve(spec) is spec  # a hub-looking id is the server's business, not a cache lookup here
    preflight(spec)  # no --model directory to check
    local = RunSpec(backend="bf16", model="org/served-model")
    with pytest.raises(Exception, match="org/served-model"):
        preflight(local)  # the same model for a local backend is looked for


@pytest.mark.parametrize("backend", ["http", FAKE_REMOTE])
def test_a_sweep_variant_of_a_remote_backend_needs_an_endpoint_and_names_its_model(backend, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(f'[[variants]]\nbackend = "{backend}"\n')
    with pytest.raises(ConfigError, match=f'backend "{backend}" needs endpoint'):
        load_sweep(path)
    models = '[[models]]\nname = "a"\nshape = "qwen3-30b-a3b"\n[[models]]\nname = "b"\nshape = "qwen3-30b-a3b"\n'
    path.write_text(models + f'[[variants]]\nbackend = "{backend}"\nendpoint = "http://127.0.0.1:9"\n')
    with pytest.raises(ConfigError, match=r"variants\[0\]\.models: .* measures the model its server serves"):
        load_sweep(path)
    path.write_text(models + f'[[variants]]\nbackend = "{backend}"\nendpoint = "http://127.0.0.1:9"\nmodels = ["a"]\n')
    assert load_sweep(path).variants[0].models == ["a"]


def test_serve_has_no_flag_that_only_a_remote_backend_declares():
    params = command_params("serve")
    assert "endpoint" not in params  # http's: a server to call, not a model to serve
    assert params["api_key"].help == "Require this key on every request"  # the server's own, not http's
