"""The parent prepares, the child measures: `resolve(spec)` turns a spec that names no model into one whose `model`
is an existing directory, building the embedded model or quantizing its cached variant here, with progress.

A backend's `load()` then only loads, so the child's `load_s` times loading alone (before this, int4 / nvfp4 / fp8
quantized inside that window on a cold cache). Synthetic shapes (`--shape`) are not prepared: building them from
the seed is their load, and their rows say so (`load_note`). The runner, `sweep` and `serve` all resolve here.
"""

from __future__ import annotations

from quantbench.make import quantize
from quantbench.models import hub
from quantbench.run.backend import EMBEDDED_MODEL, get_backend
from quantbench.run.spec import RunSpec, is_remote


def resolve(spec: RunSpec) -> RunSpec:
    """The spec the child runs: a copy of `spec` whose `model` names the directory to load, or `spec` itself when
    it names one already, asks for a synthetic shape, or its backend has nothing local to prepare (a remote one: http). A hub
    id (`org/name[@revision]`, quantbench.models.hub) becomes its snapshot directory in the Hugging Face cache."""
    if spec.model and not spec.shape and hub.is_hub_id(spec.model) and not is_remote(spec.backend):
        return spec.model_copy(update={"model": str(hub.resolve(spec.model).path)})
    if spec.model or spec.shape:
        return spec
    # A backend given by import path (`package.module:Class`) may not declare `default_model`: nothing to prepare.
    default = getattr(get_backend(spec.backend), "default_model", None)
    if default is None:
        return spec
    return spec.model_copy(update={"model": prepared_model_dir(default)})


def prepared_model_dir(default: str, family: str = "text") -> str:
    """The embedded model's directory (`EMBEDDED_MODEL`), or its variant quantized with the scheme `default`;
    trained or quantized on first use, cached (and locked) across processes afterwards. `family` "omni": the omni
    default model (quantbench.make.omni_fixture) and its variants."""
    if family != "text":
        if default == EMBEDDED_MODEL:
            return str(quantize.default_model_dir(family))
        return str(quantize.default_variant(default, family))
    if default == EMBEDDED_MODEL:
        # lazy: fixture imports torch; the runner's parent, which imports this module, checks a given --model
        # without importing torch (runner.preflight) and only needs it here, to build the embedded model
        from quantbench.make import fixture

        return str(fixture.default_model_dir())  # through the module: tests replace it
    return str(quantize.default_variant(default))


def family_defaults(backend: str, family: str, model: str | None, suite: str | None,
                    shape: str | None = None) -> tuple[str | None, str | None]:
    """(model, suite) for `quantbench run --family`: "text" changes nothing; "omni" fills what is not given with
    the omni default model (or its variant for `backend`, prepared here) and the built-in media suite
    quantbench-omni-v2. A built-in suite given by its name (v2, or v1) becomes its file in the cache
    (quantbench.protocol.omnisuite), whatever the family."""
    if family not in quantize.FAMILIES:
        from quantbench.errors import ConfigError

        raise ConfigError(f"--family {family!r}: use one of {', '.join(quantize.FAMILIES)}")
    from quantbench.protocol import omnisuite

    if suite is None and family == "omni":
        suite = omnisuite.DEFAULT
    if omnisuite.is_builtin(suite):
        suite = str(omnisuite.suite_path(suite))
    if family == "omni" and model is None and shape is None:
        default = getattr(get_backend(backend), "default_model", None)
        if default is not None:
            model = prepared_model_dir(default, family)
    return model, suite
