"""The sweep file: what a sweep.toml may say, read and validated into a `Sweep`.

The format is documented in examples/sweep.toml. Every mistake in a file is a ConfigError that names the file,
the key and the fix (`{file}: {key}: {problem}; {fix}`), raised by `load_sweep` before anything runs: variant
settings are checked against RunSpec's own annotations and the backend's declared Options, backends against the
installed ones, suites are loaded,
and a quantized variant of a checkpoint model must exist already unless `quantize_missing = true`.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from quantbench.errors import ConfigError, QuantbenchError
from quantbench.models import hub
from quantbench.run.backend import backend_names, get_backend
from quantbench.run.machine import KNOWN_FAMILIES
from quantbench.run.settings import GENERIC, MAX_REPEATS
from quantbench.run.spec import BackendOptions, RunSpec, choices, declared, is_remote, options_class

# Backends whose checkpoint `quantbench quantize --scheme <scheme>` makes from a BF16 checkpoint.
SCHEMES = {"int4": "int4", "nvfp4": "nvfp4", "fp8": "fp8"}
FAMILIES = tuple(f for f in KNOWN_FAMILIES if f != "cpu")
# RunSpec fields the matrix itself sets (or that must not sit in a file): not allowed in [defaults] / [[variants]].
AXIS_FIELDS = {"backend", "model", "suite", "gpu", "shape", "layers", "device", "api_key", "extra", "trust_remote_code"}
SETTINGS = set(RunSpec.GENERIC) - AXIS_FIELDS  # the generic ones; each backend's Options adds its own
TOP_KEYS = {"name", "repeats", "quantize_missing", "variants_dir", "quantize", "suites", "gpus", "defaults", "models",
            "variants", "ray"}
MODEL_KEYS = {"name", "fixture", "path", "shape", "layers", "trust_remote_code", *SCHEMES}
VARIANT_KEYS = {"name", "backend", "models"}
RAY_KEYS = {"num_cpus", "max_retries"}
QUANTIZE_KEYS = {"iters": int, "nsamples": int, "seqlen": int, "group_size": int, "experts_only": bool, "seed": int}
HINTS = {name: RunSpec.model_fields[name].annotation for name in RunSpec.GENERIC}


@cache
def installed_options() -> dict[str, FieldInfo]:
    """Every setting an installed backend declares, but secrets (they never sit in a sweep file)."""
    out: dict[str, FieldInfo] = {}
    for backend in backend_names():
        for name, info in options_class(backend).model_fields.items():
            if not declared(info).get("secret"):
                out.setdefault(name, info)
    return out


def _declared_by(backend: Any) -> dict[str, FieldInfo]:
    """The options a variant's backend declares but secrets, or none when it names no backend that imports."""
    try:
        fields = options_class(backend).model_fields if isinstance(backend, str) else {}
    except ConfigError:
        return {}
    return {name: info for name, info in fields.items() if not declared(info).get("secret")}


def _rule(key: str, info: FieldInfo | None) -> tuple[Any, tuple[Any, ...] | None, float | None, float | None]:
    """(type hint, allowed values, least value, the value it must be above) of a generic setting (as
    quantbench.run.settings declares it) or a backend option (its Literal, its ge= / gt=)."""
    if info is None:
        how = GENERIC.get(key)
        if how is None:
            return HINTS[key], None, None, None
        return HINTS[key], how.choices or None, how.least, how.above
    allowed = choices(info)
    least = next((m.ge for m in info.metadata if getattr(m, "ge", None) is not None), None)
    above = next((m.gt for m in info.metadata if getattr(m, "gt", None) is not None), None)
    return (type(allowed[0]) if allowed else info.annotation), allowed, least, above


def _bound(least: float | None, above: float | None) -> str:
    """How the sweep file's refusal names a bound: "positive", "zero or more", "2 or more"."""
    if above == 0 or least == 1:
        return "positive"
    if least == 0:
        return "zero or more"
    return f"{least:g} or more" if least is not None else f"above {above:g}"


@dataclass
class Model:
    name: str
    fixture: bool = False  # the embedded default model
    path: Path | None = None  # a BF16 checkpoint dir
    shape: str | None = None  # a synthetic real shape (random weights: speed and memory only)
    layers: int | None = None
    trust_remote_code: bool = False
    made: dict[str, Path] = field(default_factory=dict)  # scheme → a ready quantized checkpoint of this model


@dataclass
class Variant:
    label: str
    backend: str
    settings: dict[str, Any]
    models: list[str] | None = None  # only these models (an http endpoint serves one)


@dataclass
class Sweep:
    path: Path
    name: str
    models: list[Model]
    variants: list[Variant]
    suites: list[str | None]  # None = the built-in suite
    gpus: list[str]
    variants_dir: Path
    repeats: int = 1
    quantize_missing: bool = False
    quantize: dict[str, Any] = field(default_factory=dict)  # quantbench quantize options (the recipe)
    defaults: dict[str, Any] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)


def made_variant_dir(sweep: Sweep, model: Model, scheme: str) -> Path:
    """variants_dir/<model>-<scheme>-<recipe hash>: another recipe is another checkpoint (and another config)."""
    from quantbench.make.quantize import Recipe

    return sweep.variants_dir / f"{model.name}-{scheme}-{Recipe(scheme, **sweep.quantize).hash[:8]}"


def checkpoint_ready(path: Path) -> bool:
    """A made checkpoint is ready once its config.json is there (the sweep's quantize renames a finished one into
    place, so a crash leaves none behind)."""
    return (path / "config.json").is_file()


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a table"}
    return names.get(type(value), type(value).__name__)


def _hint_ok(value: Any, hint: Any) -> bool:
    for t in typing.get_args(hint) or (hint,):
        if t is type(None):
            continue
        if t in (int, float) and isinstance(value, bool):
            continue
        if (t is float and isinstance(value, int | float)) or isinstance(value, typing.get_origin(t) or t):
            return True
    return False


def _hint_name(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table"}
    kinds = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    return " or ".join(names.get(typing.get_origin(t) or t, str(t)) for t in kinds)


class _Parser:
    """Turns the TOML data into a Sweep; every problem names the file, the key and the fix."""

    def __init__(self, path: Path):
        self.path, self.base = path, path.parent

    def fail(self, where: str, problem: str, fix: str = "") -> typing.NoReturn:
        raise ConfigError(f"{self.path}: {where}: {problem}" + (f"; {fix}" if fix else ""))

    def backend_check(self, backend: str, options: BackendOptions, where: str) -> None:
        """The backend's own check of its settings (http: its endpoint, which must hold no password), here: a
        run it refuses would be stored as a failed row, its settings with it."""
        check = getattr(get_backend(backend), "check", None)
        if callable(check):
            try:
                check(RunSpec(backend=backend, options=options), None)
            except ConfigError as e:
                self.fail(where, str(e))

    def keys(self, table: dict[str, Any], allowed: set[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                near = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                if key == "api_key":
                    self.fail(f"{where}.api_key", "secrets do not belong in a sweep file",
                              "set $QUANTBENCH_API_KEY in the environment instead (on every node, for Ray)")
                self.fail(where, f"unknown key {key!r}", f"{hint}allowed keys: {', '.join(sorted(allowed))}")

    def typed(self, value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float, (int, float)))
        if not ok:
            self.fail(where, f"expected {what}, got {value!r} ({_kind(value)})")
        return value

    def table(self, data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
        return self.typed(data.get(key, {}), dict, where, f"a table ([{key}])")

    def settings(self, table: dict[str, Any], where: str, options: dict[str, FieldInfo]) -> dict[str, Any]:
        """Run settings, type- and range-checked against RunSpec's own annotations and the backend options'."""
        out = {}
        for key, value in table.items():
            if key not in SETTINGS and key not in options:
                continue
            loc = f"{where}.{key}"
            hint, allowed, least, above = _rule(key, options.get(key))
            if not _hint_ok(value, hint):
                self.fail(loc, f"expected {_hint_name(hint)}, got {value!r} ({_kind(value)})")
            if allowed and value not in allowed:
                self.fail(loc, f"{value!r} is not one of {', '.join(map(str, allowed))}")
            if value is not None and (least is not None and value < least or above is not None and value <= above):
                self.fail(loc, f"must be {_bound(least, above)}, got {value}")
            if isinstance(value, float) and least is not None and not math.isfinite(value):  # passed `value < least`
                self.fail(loc, f"must be a finite number, {_bound(least, above)}, got {value}")
            most = GENERIC[key].most if key in GENERIC and key not in options else None
            if most is not None and _hint_ok(value, hint) and value is not None and value > most:
                self.fail(loc, f"must be {most:g} or fewer, got {value}")
            out[key] = float(value) if hint is float else value
        return out

    def checkpoint_dir(self, value: Any, where: str, what: str) -> Path:
        text = self.typed(value, str, where, "a directory path (a string)")
        path = Path(text).expanduser()
        path = path if path.is_absolute() else (self.base / path).resolve()
        if not path.exists() and hub.is_hub_id(text):  # org/name[@revision]: its snapshot in the hub cache
            try:
                path = hub.resolve(text).path
            except QuantbenchError as e:
                self.fail(where, str(e))
        if not path.is_dir():
            self.fail(where, f"{path} does not exist or is not a directory", f"give the {what} directory")
        if not (path / "config.json").is_file():
            self.fail(where, f"{path} has no config.json", f"give a transformers checkpoint directory ({what})")
        return path

    # -- sections --------------------------------------------------------------------------------------------
    def sweep(self, data: dict[str, Any]) -> Sweep:
        self.keys(data, TOP_KEYS, "top level")
        name = self.typed(data.get("name", self.path.stem), str, "name", "a string")
        repeats = self.typed(data.get("repeats", 1), int, "repeats", "an integer")
        if not 1 <= repeats <= MAX_REPEATS:
            self.fail("repeats", f"must be 1 to {MAX_REPEATS}, got {repeats}")
        quantize_missing = self.typed(data.get("quantize_missing", False), bool, "quantize_missing", "true or false")
        variants_dir = Path(self.typed(data.get("variants_dir", "variants"), str, "variants_dir", "a path"))
        variants_dir = variants_dir if variants_dir.is_absolute() else (self.base / variants_dir).resolve()
        defaults = self.table(data, "defaults", "defaults")
        self.keys(defaults, SETTINGS | set(installed_options()), "defaults")
        defaults = self.settings(defaults, "defaults", installed_options())
        quantize = self.table(data, "quantize", "quantize")
        self.keys(quantize, set(QUANTIZE_KEYS), "quantize")
        for key, value in quantize.items():
            self.typed(value, QUANTIZE_KEYS[key], f"quantize.{key}", "true or false" if QUANTIZE_KEYS[key] is bool
                       else "an integer")
        ray = self.table(data, "ray", "ray")
        self.keys(ray, RAY_KEYS, "ray")
        for key, value in ray.items():
            least = 1 if key == "num_cpus" else 0
            if self.typed(value, int, f"ray.{key}", "an integer") < least:
                self.fail(f"ray.{key}", f"must be {least} or more, got {value}")

        models = self.models(data.get("models"))
        variants = self.variants(data.get("variants"), {m.name for m in models}, defaults)
        defaults = {k: v for k, v in defaults.items() if k in SETTINGS}  # options went to the variants declaring them
        suites = self.suites(data, _most_records(defaults, variants))
        sweep = Sweep(path=self.path, name=name, models=models, variants=variants, suites=suites,
                      gpus=self.gpus(data), variants_dir=variants_dir, repeats=repeats,
                      quantize_missing=quantize_missing, quantize=quantize, defaults=defaults, ray=ray)
        if quantize:
            from quantbench.make.quantize import Recipe

            try:
                Recipe("int4", **quantize)
            except ConfigError as e:
                self.fail("quantize", str(e))
        self.checkpoints(sweep)
        return sweep

    def models(self, items: Any) -> list[Model]:
        if items is None:
            return [Model(name="fixture", fixture=True)]  # no [[models]]: the embedded default model
        self.typed(items, list, "models", "a list of [[models]] tables")
        if not items:
            self.fail("models", "the list is empty", 'add a [[models]] table, e.g. fixture = true')
        out, seen = [], set()
        for i, item in enumerate(items):
            where = f"models[{i}]"
            self.typed(item, dict, where, "a table")
            self.keys(item, MODEL_KEYS, where)
            name = self.typed(item.get("name", ""), str, f"{where}.name", "a string")
            if not name:
                self.fail(where, "no name", 'give it name = "..." (variants and the summary use it)')
            if name in seen:
                self.fail(f"{where}.name", f"{name!r} is used twice", "give each model its own name")
            seen.add(name)
            kinds = [k for k in ("fixture", "path", "shape") if item.get(k) not in (None, False)]
            if len(kinds) != 1:
                self.fail(where, f"model {name!r} needs exactly one of fixture = true, path = \"DIR\", "
                          f"shape = \"...\" (has {', '.join(kinds) or 'none'})")
            model = Model(name=name, trust_remote_code=self.typed(item.get("trust_remote_code", False), bool,
                                                                  f"{where}.trust_remote_code", "true or false"))
            if kinds == ["fixture"]:
                model.fixture = self.typed(item["fixture"], bool, f"{where}.fixture", "true or false")
            elif kinds == ["path"]:
                model.path = self.checkpoint_dir(item["path"], f"{where}.path", "BF16 checkpoint")
            else:
                from quantbench.models.families import synthetic_shapes

                model.shape = self.typed(item["shape"], str, f"{where}.shape", "a string")
                if model.shape not in synthetic_shapes():
                    self.fail(f"{where}.shape", f"unknown shape {model.shape!r}",
                              f"use one of {', '.join(sorted(synthetic_shapes()))}")
            if "layers" in item:
                if not model.shape:
                    self.fail(f"{where}.layers", "layers only applies to a synthetic shape", "remove it")
                model.layers = self.typed(item["layers"], int, f"{where}.layers", "an integer")
                if model.layers < 1:
                    self.fail(f"{where}.layers", f"must be 1 or more, got {model.layers}")
            for scheme in SCHEMES.values():
                if scheme in item:
                    if not model.path:
                        self.fail(f"{where}.{scheme}", "a ready-made variant only goes with path = \"DIR\"",
                                  "remove it (the backend makes the fixture's and synthetic variants itself)")
                    model.made[scheme] = self.checkpoint_dir(item[scheme], f"{where}.{scheme}", f"{scheme} checkpoint")
            out.append(model)
        return out

    def variants(self, items: Any, model_names: set[str], defaults: dict[str, Any]) -> list[Variant]:
        if items is None or items == []:
            self.fail("variants", "no variants", 'add at least one [[variants]] table, e.g. backend = "bf16"')
        self.typed(items, list, "variants", "a list of [[variants]] tables")
        installed = backend_names()
        out = []
        declaring: set[str] = set()
        for i, item in enumerate(items):
            where = f"variants[{i}]"
            self.typed(item, dict, where, "a table")
            self.keys(item, VARIANT_KEYS | SETTINGS | set(installed_options()) | set(_declared_by(item.get("backend"))),
                      where)
            if "backend" not in item:
                self.fail(where, "no backend", f'give backend = "..." (installed: {", ".join(installed)})')
            backend = self.typed(item["backend"], str, f"{where}.backend", "a string")
            if ":" in backend:
                try:
                    get_backend(backend)
                except ConfigError as e:
                    self.fail(f"{where}.backend", str(e))
            elif backend not in installed:
                near = difflib.get_close_matches(backend, installed, n=1)
                self.fail(f"{where}.backend", f"{backend!r} is not an installed backend",
                          (f"did you mean {near[0]!r}? " if near else "")
                          + f"installed: {', '.join(installed)} (or give package.module:Class)")
            try:
                options = options_class(backend)
            except ConfigError as e:
                self.fail(f"{where}.backend", str(e))
            own = _declared_by(backend)
            for key in item:
                if key in installed_options() and key not in own:
                    self.fail(f"{where}.{key}", f"{key} is not a setting of backend {backend!r}",
                              f"remove it; its settings: {', '.join(own) or 'none'}")
            settings = self.settings(item, where, own)
            for key, value in defaults.items():  # a [defaults] option applies where the backend declares it
                if key in own and key not in settings:
                    settings[key] = value
            declaring.update(k for k in defaults if k in own)
            try:
                chosen = options.model_validate({k: v for k, v in settings.items() if k in own})
            except ValidationError as e:
                first = e.errors()[0]
                self.fail(f"{where}.{first['loc'][0] if first['loc'] else 'settings'}", first["msg"])
            models = item.get("models")
            if models is not None:
                self.typed(models, list, f"{where}.models", "a list of model names")
                for m in models:
                    if m not in model_names:
                        self.fail(f"{where}.models", f"no model named {m!r}",
                                  f"use names from [[models]]: {', '.join(sorted(model_names))}")
            if is_remote(backend):  # it answers through a server (quantbench.run.backend.Backend.remote)
                if not settings.get("endpoint"):
                    self.fail(where, f'backend "{backend}" needs endpoint = "http://HOST:PORT"')
                self.backend_check(backend, chosen, where)
                if models is None and len(model_names) > 1:
                    self.fail(f"{where}.models", f"a {backend} variant measures the model its server serves",
                              'say which with models = ["NAME"]')
            label = item.get("name") or _default_label(backend, settings, chosen)
            out.append(Variant(label=self.typed(label, str, f"{where}.name", "a string"), backend=backend,
                               settings=settings, models=models))
        for key in defaults:
            if key not in SETTINGS and key not in declaring:
                self.fail(f"defaults.{key}", f"no variant's backend has the setting {key}",
                          "remove it, or add a variant whose backend declares it")
        return out

    def suites(self, data: dict[str, Any], limit: int | None) -> list[str | None]:
        """The suites' paths (None: the built-in suite), each checked as far as the sweep's runs read it: the first
        `limit` records, or all (a run's own --limit read; a bad record past every run's limit stops none)."""
        from quantbench.protocol.suite import load_suite

        items = self.typed(data.get("suites", ["builtin"]), list, "suites", 'a list, e.g. ["builtin"]')
        if not items:
            self.fail("suites", "the list is empty", 'use ["builtin"] for the built-in suite')
        out: list[str | None] = []
        for i, item in enumerate(items):
            self.typed(item, str, f"suites[{i}]", '"builtin" or a JSONL path')
            if item == "builtin":
                out.append(None)
                continue
            path = Path(item).expanduser()
            path = path if path.is_absolute() else (self.base / path).resolve()
            if not path.is_file():
                self.fail(f"suites[{i}]", f"{path} does not exist", 'give a suite JSONL file, or "builtin"')
            load_suite(path, limit=limit)  # a bad record fails now, not in the middle of the sweep
            out.append(str(path))
        return out

    def gpus(self, data: dict[str, Any]) -> list[str]:
        items = self.typed(data.get("gpus", ["auto"]), list, "gpus", 'a list, e.g. ["hopper", {name = "H200"}]')
        if not items:
            self.fail("gpus", "the list is empty", 'use ["auto"] for whatever this host or cluster has')
        out: list[str] = []
        for i, item in enumerate(items):
            where = f"gpus[{i}]"
            if isinstance(item, dict):
                self.keys(item, {"name"}, where)
                name = self.typed(item.get("name", ""), str, f"{where}.name", "a string").strip()
                if not name:
                    self.fail(where, "an empty GPU name", 'give part of the GPU\'s name, e.g. {name = "H200"}')
                gpu = name
            else:
                gpu = self.typed(item, str, where, "a GPU family or {name = \"...\"}").strip().lower()
                if gpu not in ("auto", "cpu", *FAMILIES):
                    near = difflib.get_close_matches(gpu, [*FAMILIES, "auto", "cpu"], n=1)
                    self.fail(where, f"unknown GPU family {item!r}",
                              (f"did you mean {near[0]!r}? " if near else "")
                              + f"use auto, cpu or a family ({', '.join(FAMILIES)}); "
                              f'for a GPU by name write {{name = "{item}"}}')
            if gpu not in out:
                out.append(gpu)
        return out

    def checkpoints(self, sweep: Sweep) -> None:
        """Every quantized variant of a checkpoint model must exist already, or be made (quantize_missing)."""
        for i, model in enumerate(sweep.models):
            for variant in sweep.variants:
                scheme = SCHEMES.get(variant.backend)
                if not scheme or not model.path or scheme in model.made or (variant.models and model.name not in variant.models):
                    continue
                if not sweep.quantize_missing and not checkpoint_ready(made_variant_dir(sweep, model, scheme)):
                    self.fail(f"models[{i}]", f"variant {variant.label!r} needs a {scheme} checkpoint of "
                              f"{model.name!r}", f'give {scheme} = "DIR" in that model, or set quantize_missing = true '
                              "to make it with quantbench quantize first")


def _most_records(defaults: dict[str, Any], variants: list[Variant]) -> int | None:
    """The most records a run of the sweep answers (its `limit`, a variant's own or the defaults'); None when a
    run answers every record."""
    limits = [{**defaults, **variant.settings}.get("limit") for variant in variants]
    return None if not limits or None in limits else max(limits)


def _default_label(backend: str, settings: dict[str, Any], options: BackendOptions) -> str:
    """The backend's name, the parts its options' declarations add (e.g. nvfp4-packed, bf16-eager), the role."""
    label = (backend.rpartition(":")[2] if ":" in backend else backend) + options.label()
    if settings.get("role") == "noise_floor":
        label += " (noise floor)"
    return label


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and validate a sweep file. Raises ConfigError naming the file, the key and the fix."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a sweep file; give the sweep's .toml file (see examples/sweep.toml)")
    if not path.is_file():
        raise ConfigError(f"{path}: no such sweep file; see examples/sweep.toml for the format")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors write one) is not the file's TOML
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start}: {e.reason}); save it as UTF-8 TOML "
                          "(see examples/sweep.toml)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the sweep file ({e.strerror or e}); fix its permissions") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}; fix the file at that line") from None
    return _Parser(path.resolve()).sweep(data)

