"""Sweeps: models × variants × suites × GPUs × repeats in one command, on this host or on a Ray cluster.

    quantbench sweep sweep.toml                      # local: one process per visible GPU (one at a time on CPU)
    quantbench sweep sweep.toml --executor ray       # one Ray task per run, num_gpus=1, placed by GPU type

The unit of work is `runner.execute(spec) -> RunResult`, the same fresh-process run `quantbench run` does; it
writes nothing. Results come back to this driver, the only process that writes DuckDB. A run whose config hash
(`runner.spec_hash`) is already stored with status ok is skipped unless --rerun (failed runs run again).
The file format is documented in examples/sweep.toml; every mistake in it is a ConfigError naming file, key, fix.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import os
import queue
import subprocess
import sys
import threading
import tomllib
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quantbench.backend import RunSpec, backend_names, get_backend
from quantbench.errors import ConfigError, GpuMismatchError, QuantbenchError
from quantbench.machine import KNOWN_FAMILIES, Machine, check_gpu, detect
from quantbench.store import RunResult, Store, uuid7

# Backends whose checkpoint `quantbench quantize --scheme <scheme>` makes from a BF16 checkpoint.
SCHEMES = {"int4": "int4", "nvfp4": "nvfp4", "fp8": "fp8"}
FAMILIES = tuple(f for f in KNOWN_FAMILIES if f != "cpu")
# RunSpec fields the matrix itself sets (or that must not sit in a file): not allowed in [defaults] / [[variants]].
AXIS_FIELDS = {"backend", "model", "suite", "gpu", "shape", "layers", "device", "api_key", "extra", "trust_remote_code"}
SETTINGS = {f.name for f in fields(RunSpec)} - AXIS_FIELDS
TOP_KEYS = {"name", "repeats", "quantize_missing", "variants_dir", "quantize", "suites", "gpus", "defaults", "models",
            "variants", "ray"}
MODEL_KEYS = {"name", "fixture", "path", "shape", "layers", "trust_remote_code", *SCHEMES}
VARIANT_KEYS = SETTINGS | {"name", "backend", "models"}
RAY_KEYS = {"num_cpus", "max_retries"}
QUANTIZE_KEYS = {"iters": int, "nsamples": int, "seqlen": int, "group_size": int, "experts_only": bool, "seed": int}
CHOICES = {
    "role": ("candidate", "reference", "noise_floor"),
    "nvfp4_mode": ("packed", "unpacked"),
    "nvfp4_activations": ("on", "off"),
    "method": ("auto", "continuation"),
    "cuda_graph": ("auto", "off"),
    "dtype": ("bfloat16", "float32", "float16"),
}
POSITIVE = {"limit", "timeout_s", "concurrency", "max_tokens", "max_options"}
NON_NEGATIVE = {"warmup", "latency_min_decisions", "latency_min_seconds", "seed"}
HINTS = typing.get_type_hints(RunSpec)


# -- the sweep file ----------------------------------------------------------------------------------------------
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

    def settings(self, table: dict[str, Any], where: str) -> dict[str, Any]:
        """RunSpec settings, type- and range-checked against RunSpec's own annotations."""
        out = {}
        for key, value in table.items():
            if key not in SETTINGS:
                continue
            loc = f"{where}.{key}"
            if not _hint_ok(value, HINTS[key]):
                self.fail(loc, f"expected {_hint_name(HINTS[key])}, got {value!r} ({_kind(value)})")
            if key in CHOICES and value not in CHOICES[key]:
                self.fail(loc, f"{value!r} is not one of {', '.join(CHOICES[key])}")
            if key in POSITIVE and value <= 0 or key in NON_NEGATIVE and value < 0:
                self.fail(loc, f"must be {'positive' if key in POSITIVE else 'zero or more'}, got {value}")
            out[key] = float(value) if HINTS[key] is float else value
        return out

    def checkpoint_dir(self, value: Any, where: str, what: str) -> Path:
        path = Path(self.typed(value, str, where, "a directory path (a string)")).expanduser()
        path = path if path.is_absolute() else (self.base / path).resolve()
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
        if repeats < 1:
            self.fail("repeats", f"must be 1 or more, got {repeats}")
        quantize_missing = self.typed(data.get("quantize_missing", False), bool, "quantize_missing", "true or false")
        variants_dir = Path(self.typed(data.get("variants_dir", "variants"), str, "variants_dir", "a path"))
        variants_dir = variants_dir if variants_dir.is_absolute() else (self.base / variants_dir).resolve()
        defaults = self.table(data, "defaults", "defaults")
        self.keys(defaults, SETTINGS, "defaults")
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
        variants = self.variants(data.get("variants"), {m.name for m in models})
        sweep = Sweep(path=self.path, name=name, models=models, variants=variants, suites=self.suites(data),
                      gpus=self.gpus(data), variants_dir=variants_dir, repeats=repeats,
                      quantize_missing=quantize_missing, quantize=quantize, defaults=self.settings(defaults, "defaults"), ray=ray)
        if quantize:
            from quantbench.quantize import Recipe

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
                from quantbench.fixture import SYNTHETIC_SHAPES

                model.shape = self.typed(item["shape"], str, f"{where}.shape", "a string")
                if model.shape not in SYNTHETIC_SHAPES:
                    self.fail(f"{where}.shape", f"unknown shape {model.shape!r}",
                              f"use one of {', '.join(sorted(SYNTHETIC_SHAPES))}")
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

    def variants(self, items: Any, model_names: set[str]) -> list[Variant]:
        if items is None or items == []:
            self.fail("variants", "no variants", 'add at least one [[variants]] table, e.g. backend = "bf16"')
        self.typed(items, list, "variants", "a list of [[variants]] tables")
        installed = backend_names()
        out = []
        for i, item in enumerate(items):
            where = f"variants[{i}]"
            self.typed(item, dict, where, "a table")
            self.keys(item, VARIANT_KEYS, where)
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
            settings = self.settings(item, where)
            models = item.get("models")
            if models is not None:
                self.typed(models, list, f"{where}.models", "a list of model names")
                for m in models:
                    if m not in model_names:
                        self.fail(f"{where}.models", f"no model named {m!r}",
                                  f"use names from [[models]]: {', '.join(sorted(model_names))}")
            if backend == "http":
                if not settings.get("endpoint"):
                    self.fail(where, 'backend "http" needs endpoint = "http://HOST:PORT"')
                if models is None and len(model_names) > 1:
                    self.fail(f"{where}.models", "an http variant measures the model its server serves",
                              'say which with models = ["NAME"]')
            label = item.get("name") or _default_label(backend, settings)
            out.append(Variant(label=self.typed(label, str, f"{where}.name", "a string"), backend=backend,
                               settings=settings, models=models))
        return out

    def suites(self, data: dict[str, Any]) -> list[str | None]:
        from quantbench.suite import load_suite

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
            load_suite(path)  # a bad record fails now, not in the middle of the sweep
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
                if not sweep.quantize_missing and not _ready(_made_dir(sweep, model, scheme)):
                    self.fail(f"models[{i}]", f"variant {variant.label!r} needs a {scheme} checkpoint of "
                              f"{model.name!r}", f'give {scheme} = "DIR" in that model, or set quantize_missing = true '
                              "to make it with quantbench quantize first")


def _default_label(backend: str, settings: dict[str, Any]) -> str:
    label = backend.rpartition(":")[2] if ":" in backend else backend
    if backend == "nvfp4":
        label += f"-{settings.get('nvfp4_mode', 'packed')}"
    if settings.get("experts_impl") not in (None, "grouped_mm"):
        label += f"-{settings['experts_impl']}"
    if settings.get("role") == "noise_floor":
        label += " (noise floor)"
    return label


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and validate a sweep file. Raises ConfigError naming the file, the key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such sweep file; see examples/sweep.toml for the format")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}; fix the file at that line") from None
    return _Parser(path.resolve()).sweep(data)


# -- planning -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Make:
    """A quantized checkpoint to make with quantbench quantize before the runs that need it."""

    model: str
    scheme: str
    source: Path | None = None  # None: the embedded default model, whose variants live in quantbench's cache
    out: Path | None = None
    options: tuple[tuple[str, Any], ...] = ()  # the [quantize] recipe (checkpoint models only)


@dataclass
class PlannedRun:
    spec: RunSpec
    model: str
    variant: str
    suite: str
    repeat: int  # 0-based
    make: Make | None = None

    @property
    def label(self) -> str:
        gpu = "" if self.spec.gpu == "auto" else f" · {self.spec.gpu}"
        return f"{self.variant} · {self.model} · {self.suite}{gpu}" + (f" #{self.repeat + 1}" if self.repeat else "")

    def config_key(self) -> str:
        return json.dumps({k: v for k, v in self.spec.to_dict().items() if k != "notes"}, sort_keys=True,
                          default=str)


def _made_dir(sweep: Sweep, model: Model, scheme: str) -> Path:
    """variants_dir/<model>-<scheme>-<recipe hash>: another recipe is another checkpoint (and another config)."""
    from quantbench.quantize import Recipe

    return sweep.variants_dir / f"{model.name}-{scheme}-{Recipe(scheme, **sweep.quantize).hash[:8]}"


def _ready(path: Path) -> bool:
    return (path / "config.json").is_file()


def plan(sweep: Sweep) -> list[PlannedRun]:
    """Every run of the matrix, in order: models × variants × suites × GPUs × repeats."""
    runs: list[PlannedRun] = []
    seen: dict[str, str] = {}
    for model in sweep.models:
        for variant in sweep.variants:
            if variant.models is not None and model.name not in variant.models:
                continue
            checkpoint, make = _checkpoint(sweep, model, variant.backend)
            for suite in sweep.suites:
                for gpu in sweep.gpus:
                    settings = {**sweep.defaults, **variant.settings}
                    notes = " · ".join(filter(None, [settings.pop("notes", ""), f"sweep {sweep.name}: {variant.label}"]))
                    base = dict(backend=variant.backend, model=checkpoint, suite=suite, gpu=gpu, shape=model.shape,
                                layers=model.layers, trust_remote_code=model.trust_remote_code, notes=notes, **settings)
                    first = PlannedRun(RunSpec(**base), model.name, variant.label,
                                       Path(suite).stem if suite else "builtin", 0, make)
                    key = first.config_key()
                    if key in seen:
                        raise ConfigError(f"{sweep.path}: variants: {variant.label!r} and {seen[key]!r} are the same "
                                          f"run on model {model.name!r}; remove one (use repeats to run it again)")
                    seen[key] = variant.label
                    runs.append(first)
                    runs += [PlannedRun(RunSpec(**base), first.model, first.variant, first.suite, r, make)
                             for r in range(1, sweep.repeats)]
    return runs


def _checkpoint(sweep: Sweep, model: Model, backend: str) -> tuple[str | None, Make | None]:
    """The `model` a run of this backend gets, and the quantize job that must make it first (if any)."""
    scheme = SCHEMES.get(backend)
    if model.fixture:  # the backend loads the fixture's cached variant; make it once up front, not per run
        return None, Make(model.name, scheme) if scheme else None
    if model.path is None:
        return None, None  # a synthetic shape: the backend builds it (random weights) in the run
    if scheme is None:
        return str(model.path), None
    if scheme in model.made:
        return str(model.made[scheme]), None
    out = _made_dir(sweep, model, scheme)
    opts = tuple(sorted(sweep.quantize.items()))
    return str(out), None if _ready(out) else Make(model.name, scheme, model.path, out, opts)


# -- what is already done -----------------------------------------------------------------------------------------
Accepts = Callable[[PlannedRun, dict[str, Any]], bool]


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def split_finished(runs: list[PlannedRun], store: Store, accepts: Accepts, rerun: bool = False
                   ) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(to run, already finished). A stored ok run counts when its spec_hash is this run's hash on the machine
    that stored it and the executor accepts that machine for this run; `repeats` wants that many of them."""
    from quantbench.runner import spec_hash

    if rerun or not store.path.exists():
        return list(runs), []
    rows = store.read("SELECT spec_hash, gpu_name, gpu_family, host FROM runs "
                      "WHERE status = 'ok' AND spec_hash IS NOT NULL").to_dict("records")
    for row in rows:
        row["gpu_name"], row["gpu_family"], row["host"] = (_text(row[k]) for k in ("gpu_name", "gpu_family", "host"))
    done: dict[str, int] = {}
    todo, skipped = [], []
    for run in runs:
        key = run.config_key()
        if key not in done:
            hashes: dict[tuple, str] = {}
            n = 0
            for row in rows:
                ident = (row["gpu_name"], row["host"])
                if ident not in hashes:
                    hashes[ident] = spec_hash(run.spec, SimpleNamespace(gpu_name=ident[0], host=ident[1]))
                n += row["spec_hash"] == hashes[ident] and accepts(run, row)
            done[key] = n
        (skipped if run.repeat < done[key] else todo).append(run)
    return todo, skipped


# -- results the driver makes itself ------------------------------------------------------------------------------
def failed_result(spec: RunSpec, failure: str, error: str, **extra: Any) -> RunResult:
    """A `failed` row for a run that never produced one itself (a lost Ray worker, a variant that could not be
    made). It has no spec_hash: only ok runs count as finished."""
    from quantbench.runner import provenance

    now = dt.datetime.now(dt.UTC)
    return RunResult(run={
        **provenance(), "run_id": str(uuid7()), "created_at": now, "finished_at": now, "status": "failed",
        "failure": failure, "error": error, "backend": spec.backend, "role": spec.role, "gpu_requested": spec.gpu,
        "spec": spec.to_dict(), "extra": extra or None,
    })


# -- executors ----------------------------------------------------------------------------------------------------
@dataclass
class Event:
    kind: str  # started | finished
    run: PlannedRun
    result: RunResult | None = None
    where: str = ""


@dataclass
class Slot:
    """One place a local run can go: a GPU (its own CUDA_VISIBLE_DEVICES) or the CPU."""

    name: str
    machine: Machine
    env: dict[str, str]
    cpu: bool = False


def local_slots() -> list[Slot]:
    """One slot per visible GPU (NVML index, or CUDA_VISIBLE_DEVICES as given) plus the CPU; just the CPU on a
    host without a GPU. Identities are read here, in the main thread, before any worker thread starts."""
    here = detect()
    if not here.has_gpu:
        return [Slot("cpu", here, {}, cpu=True)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        indices = [v.strip() for v in visible.split(",") if v.strip()]
    else:
        import pynvml

        pynvml.nvmlInit()
        indices = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    if not all(i.isdigit() for i in indices):  # GPU UUIDs: NVML identity by index is unknown, so run them as one
        return [Slot(f"cuda ({visible})", here, {}), _cpu_slot()]
    slots = []
    try:
        for i in indices:
            os.environ["CUDA_VISIBLE_DEVICES"] = i
            slots.append(Slot(f"gpu {i}", detect(), {"CUDA_VISIBLE_DEVICES": i}))
    finally:
        _restore("CUDA_VISIBLE_DEVICES", visible)
    return [*slots, _cpu_slot()]


def _cpu_slot() -> Slot:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        return Slot("cpu", detect(), {"CUDA_VISIBLE_DEVICES": ""}, cpu=True)
    finally:
        _restore("CUDA_VISIBLE_DEVICES", visible)


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _same_machine(machine: Machine, row: dict[str, Any]) -> bool:
    if machine.gpu_name or row["gpu_name"]:
        return machine.gpu_name == row["gpu_name"]
    return machine.host == row["host"]


class LocalExecutor:
    """Runs on this host: one thread per GPU, each running its queue one fresh process at a time; on a host
    without a GPU, one run at a time (a CPU run uses every core)."""

    name = "local"

    def __init__(self, slots: list[Slot] | None = None):
        self.slots = slots if slots is not None else local_slots()
        self.has_gpu = any(not s.cpu for s in self.slots)

    def where(self) -> str:
        gpus = [f"{s.name}: {s.machine.gpu_name}" for s in self.slots if not s.cpu]
        return ", ".join(gpus) if gpus else f"CPU ({self.slots[0].machine.cpu_model}), one run at a time"

    def fits(self, slot: Slot, gpu: str) -> bool:
        if gpu == "cpu":
            return slot.cpu
        if slot.cpu and self.has_gpu:
            return False  # `auto` and GPU requirements go to the GPUs; the CPU slot only takes `cpu` runs
        try:
            check_gpu(gpu, slot.machine)
            return True
        except GpuMismatchError:
            return False

    def placeable(self, run: PlannedRun) -> str | None:
        if any(self.fits(s, run.spec.gpu) for s in self.slots):
            return None
        return f"needs gpu {run.spec.gpu!r}; this host has {self.where()} (run it where that GPU is, or with --executor ray)"

    def accepts(self, run: PlannedRun, row: dict[str, Any]) -> bool:
        return any(self.fits(s, run.spec.gpu) and _same_machine(s.machine, row) for s in self.slots)

    def run(self, runs: list[PlannedRun]) -> Iterator[Event]:
        pending, lock, events = list(runs), threading.Lock(), queue.Queue()

        def take(slot: Slot) -> PlannedRun | None:
            with lock:
                for i, run in enumerate(pending):
                    if self.fits(slot, run.spec.gpu):
                        return pending.pop(i)
            return None

        def work(slot: Slot) -> None:
            from quantbench.runner import execute

            try:
                while (run := take(slot)) is not None:
                    events.put(Event("started", run, where=slot.name))
                    try:
                        result = execute(run.spec, machine=slot.machine, echo=False, env=slot.env)
                    except Exception as e:  # the run is lost, not the sweep
                        result = failed_result(run.spec, "error", f"{type(e).__name__}: {e}")
                    events.put(Event("finished", run, result, slot.name))
            finally:
                events.put(None)

        busy = [s for s in self.slots if any(self.fits(s, r.spec.gpu) for r in runs)]
        for slot in busy:
            threading.Thread(target=work, args=(slot,), name=f"sweep-{slot.name}", daemon=True).start()
        for _ in busy:
            while (event := events.get()) is not None:
                yield event

    def close(self) -> None:
        pass


# -- the driver ---------------------------------------------------------------------------------------------------
@dataclass
class SweepOutcome:
    planned: int = 0
    skipped: int = 0  # already finished (same config hash, status ok)
    unplaceable: list[tuple[PlannedRun, str]] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)  # stored by this sweep, in the order they finished
    ok: int = 0
    failed: int = 0


class _Display:
    """One progress line for the whole matrix, and one line per finished run above it."""

    def __init__(self, console: Console, total: int):
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[running]} in flight · [green]{task.fields[ok]} ok[/] · "
                       "[red]{task.fields[failed]} failed[/]"),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("sweep", total=total, running=0, ok=0, failed=0)
        self.running = self.ok = self.failed = 0

    def __enter__(self) -> _Display:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, event: Event) -> None:
        self.running += 1
        self.progress.update(self.task, running=self.running)

    def finished(self, event: Event) -> None:
        run = event.result.run
        self.running -= 1
        if run["status"] == "ok":
            self.ok += 1
            seconds = (run["finished_at"] - run["created_at"]).total_seconds()
            self.progress.console.print(f"[green]✓[/] {event.run.label} [dim]({event.where}, {seconds:.1f} s)[/]")
        else:
            self.failed += 1
            first = (run.get("error") or "").strip().splitlines()[:1]
            self.progress.console.print(f"[red]✗ {event.run.label}: {run['failure']}[/] [dim]({event.where})[/] "
                                        + (first[0][:200] if first else ""))
        self.progress.update(self.task, advance=1, running=self.running, ok=self.ok, failed=self.failed)


def _quantize(source: str, scheme: str, out: str, options: dict[str, Any]) -> None:
    """In a fresh process: quantize into a staging dir, then rename it into place (a crash leaves no half
    checkpoint that a later sweep would take for a finished one)."""
    import shutil

    from quantbench.quantize import quantize

    target = Path(out)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        quantize(source, scheme, staging, progress=False, **options)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make(make: Make) -> None:
    if make.source is None:
        from quantbench.quantize import default_variant

        default_variant(make.scheme)  # cached; quantizes in its own child process on first use
        return
    # A plain child interpreter, not a multiprocessing spawn: spawn re-runs whatever `__main__` is (under
    # Streamlit's AppTest or an embedding app that is not importable), and auto-round must not touch this process.
    args = json.dumps([str(make.source), make.scheme, str(make.out), dict(make.options)])
    code = "import json, sys; from quantbench.sweep import _quantize; _quantize(*json.loads(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise QuantbenchError(f"quantize exited with status {done.returncode}: {tail[0]}")
    if not _ready(make.out):
        raise QuantbenchError(f"quantize finished but {make.out} holds no checkpoint")


def make_missing(runs: list[PlannedRun], console: Console) -> dict[Make, str]:
    """Make each missing quantized checkpoint once, before the runs that need it, each quantization in a fresh
    process (auto-round and ModelOpt patch transformers on import). Returns why each failed one failed."""
    failed: dict[Make, str] = {}
    for make in dict.fromkeys(r.make for r in runs if r.make is not None):
        if make.out is not None and _ready(make.out):
            continue
        what = f"the {make.scheme} variant of {make.model}" + (f" → {make.out}" if make.out else " (cached)")
        with console.status(f"quantbench quantize: {what} …"):
            try:
                _make(make)
                console.print(f"[green]ready:[/] {what}")
            except Exception as e:  # every run that needed it becomes a failed row saying why
                failed[make] = f"could not make {what} with quantbench quantize: {type(e).__name__}: {e}"
                console.print(f"[red]{failed[make]}[/]")
    return failed


def run_sweep(sweep: Sweep, executor: Any, store: Store, *, rerun: bool = False,
              console: Console | None = None) -> SweepOutcome:
    """Plan, skip what is finished, make missing variants, run the rest on `executor`, store every result."""
    console = console or Console(stderr=True)
    runs = plan(sweep)
    todo, skipped = split_finished(runs, store, executor.accepts, rerun)
    outcome = SweepOutcome(planned=len(runs), skipped=len(skipped))
    placeable = []
    for run in todo:
        why = executor.placeable(run)
        if why:
            outcome.unplaceable.append((run, why))
        else:
            placeable.append(run)
    console.print(f"[bold]sweep {sweep.name}[/]: {len(runs)} runs planned, {len(skipped)} already finished"
                  + (f", {len(outcome.unplaceable)} cannot be placed" if outcome.unplaceable else "")
                  + f"; {len(placeable)} to run on {executor.where()}")
    for run, why in outcome.unplaceable:
        console.print(f"[yellow]not run:[/] {run.label}: {why}")

    def store_result(result: RunResult) -> None:
        outcome.run_ids.append(store.write_run(result))
        if result.run["status"] == "ok":
            outcome.ok += 1
        else:
            outcome.failed += 1

    unmade = make_missing(placeable, console)
    with _Display(console, len(placeable)) as display:
        ready = []
        for run in placeable:
            if run.make in unmade:
                event = Event("finished", run, failed_result(run.spec, "error", unmade[run.make]), "quantize")
                store_result(event.result)
                display.started(event)
                display.finished(event)
            else:
                ready.append(run)
        for event in executor.run(ready):
            if event.kind == "started":
                display.started(event)
            else:
                store_result(event.result)  # the driver is the only DuckDB writer
                display.finished(event)
    return outcome


def print_summary(store: Store, outcome: SweepOutcome, out: Console | None = None) -> None:
    """The runs this sweep stored, then the which-quant report for each GPU they ran on."""
    out = out or Console()
    if not outcome.run_ids:
        out.print(f"Nothing ran: {outcome.skipped} of {outcome.planned} runs were already finished "
                  f"(--rerun runs them again), {len(outcome.unplaceable)} could not be placed.")
        return
    from quantbench.cli import runs_table

    df = store.read("SELECT * FROM run_summary WHERE run_id IN (SELECT unnest(?::UUID[])) ORDER BY created_at",
                    [outcome.run_ids])
    out.print(runs_table(df, f"sweep: {outcome.ok} ok, {outcome.failed} failed, {outcome.skipped} already "
                             f"finished — stored in {store.path}"))
    try:
        from quantbench.report import report_for_this_machine
    except ImportError:
        return
    for gpu, host in dict.fromkeys(zip(df.gpu_name.map(_text), df.host.map(_text), strict=True)):
        try:
            out.print(report_for_this_machine(store, gpu or "cpu", None if gpu else host), markup=False, soft_wrap=True)
        except QuantbenchError as e:
            out.print(f"report for {gpu or f'CPU ({host})'}: {e}", markup=False)


def cli_sweep(path: str | os.PathLike[str], executor: str = "local", address: str | None = None,
              rerun: bool = False, db: str | os.PathLike[str] | None = None,
              parquet_dir: str | None = None) -> SweepOutcome:
    """`quantbench sweep FILE [--executor local|ray] [--address auto] [--rerun] [--db PATH] [--parquet-dir DIR]`.
    Returns the outcome (the CLI exits 1 when outcome.failed)."""
    sweep = load_sweep(path)
    if executor == "local":
        for option, value in (("--address", address), ("--parquet-dir", parquet_dir)):
            if value:
                raise ConfigError(f"{option} is for --executor ray; remove it (a local sweep stores into --db)")
        ex: Any = LocalExecutor()
    elif executor == "ray":
        from quantbench.sweep_ray import RayExecutor

        ex = RayExecutor(address=address, parquet_dir=parquet_dir, **sweep.ray)
    else:
        raise ConfigError(f"--executor {executor!r}: use local or ray")
    store = Store(db)
    try:
        outcome = run_sweep(sweep, ex, store, rerun=rerun)
    finally:
        ex.close()
    print_summary(store, outcome)
    return outcome
