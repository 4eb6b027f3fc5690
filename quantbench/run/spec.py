"""What defines one run: the settings every backend shares (`RunSpec`) and the settings one backend declares for
itself (its `Options`, a `BackendOptions` subclass in the backend's own module).

A backend declares each of its settings once, with `opt(...)`: default, allowed values (the annotation: a
`Literal` lists them), help text, the `run` flag, the part of the sweep label it adds, whether it changes what a
run measures (`hashed`) and whether it is a secret. The CLI's `run` flags, the sweep file's keys and checks, the
variant labels, the config hash (`quantbench.run.runner.spec_hash`) and the stored `spec` column are derived from
those declarations, so a new option is a change to one backend's file.

A RunSpec is built from the flat form every caller and every stored row uses (`RunSpec(backend="nvfp4",
nvfp4_mode="unpacked")`): the settings the backend declares become `spec.options`.
"""

from __future__ import annotations

import copy
import os
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from quantbench.errors import ConfigError
from quantbench.limits import MEDIA_LIMITS, Limits
from quantbench.run.settings import GENERIC

# The stored `spec` column, the export parquet and every spec.json were written in this flat layout before the
# options moved into the backends. `RunSpec.flat()` keeps it, so stored rows, their hashes and `from_dict` of an
# old row stay as they are. Frozen: a new option goes after it, never into it.
LEGACY_LAYOUT = ("backend", "model", "suite", "gpu", "device", "dtype", "experts_impl", "fast_moe", "nvfp4_mode",
                 "nvfp4_activations", "endpoint", "concurrency", "api_key", "base_model", "shape", "layers", "role",
                 "trust_remote_code", "max_options", "max_tokens", "truncate", "method", "cuda_graph", "fused_ops",
                 "warmup", "latency_min_decisions", "latency_min_seconds", "limit", "timeout_s", "seed", "notes",
                 "extra")
# What the flat layout holds for an option the run's backend does not declare (a bf16 row says nvfp4_mode
# "packed", as every row did before). Frozen with the layout.
LEGACY_OPTION_DEFAULTS: dict[str, Any] = {"experts_impl": "grouped_mm", "fast_moe": True, "nvfp4_mode": "packed",
                                          "nvfp4_activations": "on", "endpoint": None, "api_key": None,
                                          "cuda_graph": "auto", "fused_ops": "auto"}
SECRET_MASK = "***"
ENTRY_POINT_GROUP = "quantbench.backends"


def opt(default: Any, help: str, *, flag: str | None = None, label: str | None = None, label_always: bool = False,
        after: str | None = None, envvar: str | None = None, hashed: bool = True, secret: bool = False,
        **constraints: Any) -> Any:
    """Declare one backend setting.

    flag: the `run` flag (default `--<name with dashes>`; `--a/--no-a` for a boolean). after: the flag it follows
    in `run --help`. label: a format string for the sweep label (e.g. "-{}"), added when the value is not the
    default, or always with label_always. hashed: the value changes what a run measures, so a value other than
    the default makes another configuration. secret: masked in the stored spec, never in a sweep file.
    constraints: pydantic's (ge=0, gt=0, ...), which the sweep file's checks follow."""
    extra = dict(flag=flag, label=label, label_always=label_always, after=after, envvar=envvar, hashed=hashed,
                 secret=secret)
    return Field(default, description=help, json_schema_extra=extra, **constraints)


def generic(name: str) -> Any:
    """A generic RunSpec field as quantbench.run.settings declares it (its default; its flag's help)."""
    return Field(GENERIC[name].default, description=GENERIC[name].help)


def declared(info: FieldInfo) -> dict[str, Any]:
    """The `opt(...)` declaration of one field (flag, label, after, envvar, hashed, secret)."""
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flag_of(name: str, info: FieldInfo) -> str:
    """The `run` flag of an option, without a `/--no-x` part."""
    return (declared(info).get("flag") or "--" + name.replace("_", "-")).partition("/")[0]


class BackendOptions(BaseModel):
    """The settings one backend declares. A backend without any uses this class as its `Options`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def label(self) -> str:
        """The part of a sweep variant's default label these settings add (e.g. "-unpacked")."""
        parts = []
        for name, info in type(self).model_fields.items():
            how, value = declared(info), getattr(self, name)
            if how.get("label") and (how.get("label_always") or value != info.default):
                parts.append(how["label"].format(value))
        return "".join(parts)

    def hashed_changes(self) -> dict[str, Any]:
        """The settings that change what a run measures and differ from their default."""
        return {name: getattr(self, name) for name, info in type(self).model_fields.items()
                if declared(info).get("hashed", True) and getattr(self, name) != info.default}

    def stored(self) -> dict[str, Any]:
        """The settings as stored on a run row: secrets masked."""
        data = self.model_dump()
        for name, info in type(self).model_fields.items():
            if declared(info).get("secret") and data[name]:
                data[name] = SECRET_MASK
        return data


class EngineOptions(BackendOptions):
    """What quantbench's TransformersEngine does with any local torch model (quantbench.engine.scoring)."""

    cuda_graph: Literal["auto", "off"] = opt(
        "auto", "GPU: auto (replay the decision forward from CUDA graphs where it can be) | off", after="--method")
    fused_ops: Literal["auto", "off"] = opt(
        "auto", "GPU: auto (RMSNorm and rotary as one Triton kernel each, q/k/v as one GEMM, each where its probe "
        "matches transformers') | off", after="--cuda-graph")


class GroupedMoeOptions(EngineOptions):
    """What the quantized backends (int4, nvfp4, fp8) share: whose code runs their experts."""

    fast_moe: bool = opt(True, "quantbench's grouped-MoE engine (--no-fast-moe: the library's own path)",
                         flag="--fast-moe/--no-fast-moe", after="--experts-impl")


def installed_backends() -> dict[str, Any]:
    """The installed backends' entry points by name. Each call reads every installed distribution's metadata
    (50 ms on a loaded 2-core VM): a caller that looks up several backends passes one call's result along."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def backend_class(name: str, installed: dict[str, Any] | None = None) -> type:
    """An installed backend's class by entry-point name, or any class by import path (`package.module:Class`)."""
    if ":" in name:
        module, _, cls = name.partition(":")
        try:
            return getattr(import_module(module), cls)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"--backend {name!r}: cannot import it ({e}); give `package.module:Class`") from e
    eps = installed_backends() if installed is None else installed
    if name not in eps:
        raise ConfigError(
            f"--backend {name!r} is not installed; installed backends: {', '.join(sorted(eps)) or 'none'} "
            "(is quantbench installed with `pip install -e .`?)"
        )
    return eps[name].load()


def is_remote(backend: str | None, installed: dict[str, Any] | None = None) -> bool:
    """Whether a backend declares `remote = True` (quantbench.run.backend.Backend): it answers through a server at
    its `endpoint` and loads no local weights. Asked by what it changes, never by the backend's name. False for a
    backend that does not import (it fails where it is loaded)."""
    try:
        return getattr(backend_class(backend or "", installed), "remote", False) is True
    except ConfigError:
        return False


def options_class(backend: str | None, installed: dict[str, Any] | None = None) -> type[BackendOptions]:
    """The Options a backend declares (imports the backend's module)."""
    cls = backend_class(backend or "", installed)
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and issubclass(options, BackendOptions)):
        raise ConfigError(f"--backend {backend!r}: {cls.__name__} declares no settings; give it `Options = "
                          "quantbench.run.spec.BackendOptions` (or a subclass declaring its own)")
    return options


def choices(info: FieldInfo) -> tuple[Any, ...] | None:
    """The allowed values of an option declared as a `Literal`."""
    return get_args(info.annotation) if get_origin(info.annotation) is Literal else None


def options_error(e: ValidationError, options: type[BackendOptions], backend: str, *, flag: bool = False) -> ConfigError:
    """pydantic's first complaint about an Options value, as one line naming the setting (or flag) and the fix."""
    first = e.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else "?"
    info = options.model_fields.get(name)
    where = flag_of(name, info) if flag and info else name
    allowed = choices(info) if info else None
    fix = f"use one of {', '.join(map(str, allowed))}" if allowed else first["msg"][:1].lower() + first["msg"][1:]
    return ConfigError(f"{where} {first.get('input')!r} (backend {backend}): {fix}")


class RunSpec(BaseModel):
    """Everything that defines one run. Serialised to JSON (flat) for the child process; hashed for sweeps."""

    backend: str
    model: str | None = None  # checkpoint dir; None = the embedded default model (or its variant for this backend)
    suite: str | None = None  # JSONL path; None = the built-in suite
    gpu: str = "auto"  # auto | cpu | a family (ampere, ada, hopper, blackwell) | a GPU name substring
    device: str | None = None  # torch device; None = cuda:0 when there is a GPU, else cpu
    dtype: str = generic("dtype")  # compute dtype (float32 only when asked, e.g. for exact CPU comparisons)
    concurrency: int = generic("concurrency")  # records per forward_many: requests in flight (http) or batched
    base_model: str | None = None  # the BF16 model this variant was made from (model id; `run --base-model`)
    shape: str | None = None  # synthetic real-shape model (e.g. "qwen3-30b-a3b") instead of the fixture
    layers: int | None = generic("layers")  # synthetic shape: override the layer count (smaller speed runs)
    role: str = generic("role")  # candidate | reference | noise_floor
    trust_remote_code: bool = False
    max_options: int = generic("max_options")  # quantbench.limits
    # the media limits a suite's parts are checked and decoded with (quantbench.limits.MEDIA_LIMITS: `run
    # --max-media-bytes` ...), only those that differ from their default; a limit only refuses, never changes an
    # answer, so it is not part of the config hash
    media_limits: dict[str, int] = Field(default_factory=dict)
    max_tokens: int | None = generic("max_tokens")
    truncate: bool = False
    method: str = generic("method")  # auto | continuation
    warmup: int = generic("warmup")
    latency_min_decisions: int = generic("latency_min_decisions")
    latency_min_seconds: float = generic("latency_min_seconds")
    limit: int | None = generic("limit")  # answer only the first N records of the suite
    timeout_s: float = generic("timeout_s")
    seed: int = generic("seed")
    notes: str = ""
    extra: dict[str, Any] = Field(default_factory=dict)
    options: BackendOptions = Field(default_factory=BackendOptions)  # the backend's own settings (its Options)

    GENERIC: ClassVar[tuple[str, ...]]

    @model_validator(mode="before")
    @classmethod
    def _backend_options(cls, data: Any) -> Any:
        """The flat form: every setting that is not generic belongs to the backend's Options."""
        if not isinstance(data, dict):
            return data
        data = {k: os.fspath(v) if k in ("model", "suite") and isinstance(v, os.PathLike) else v
                for k, v in data.items()}
        given = {k: data.pop(k) for k in list(data) if k not in cls.GENERIC and k != "options"}
        options = data.get("options")
        if isinstance(options, BackendOptions):
            given = {**options.model_dump(), **given}
        elif isinstance(options, dict):
            given = {**options, **given}
        backend = data.get("backend")
        try:
            options_cls = options_class(backend)
        except ConfigError:
            if given:  # no backend to say what these are: the error names the backend and the fix
                raise
            data["options"] = BackendOptions()  # an unknown backend fails where it is loaded, as a failed run
            return data
        own = options_cls.model_fields
        for key in [k for k in given if k not in own]:
            if key in LEGACY_OPTION_DEFAULTS and given[key] == LEGACY_OPTION_DEFAULTS[key]:
                del given[key]  # the flat layout's filler for a setting this backend lacks (old rows, spec.json)
        foreign = [k for k in given if k not in own]
        if foreign:
            raise ConfigError(f"{', '.join(sorted(foreign))} is not a setting of backend {backend}; "
                              f"its settings: {', '.join(own) or 'none'}")
        try:
            data["options"] = options_cls.model_validate(given)
        except ValidationError as e:
            raise options_error(e, options_cls, str(backend)) from None
        return data

    @model_validator(mode="after")
    def _known_media_limits(self) -> RunSpec:
        unknown = sorted(set(self.media_limits) - set(MEDIA_LIMITS))
        if unknown:
            raise ConfigError(f"media_limits: unknown limit(s) {unknown}; known: {', '.join(MEDIA_LIMITS)}")
        self.limits()  # each limit's own check (ConfigError naming its flag)
        return self

    def limits(self) -> Limits:
        """The request limits a suite is checked and its media decoded with: --max-options and the media limits."""
        return Limits(max_options=self.max_options, **self.media_limits)

    def flat(self) -> dict[str, Any]:
        """Today's flat dict (LEGACY_LAYOUT order, options this backend lacks at their old defaults, then any
        option declared since): what spec.json, the stored `spec` column and the config hash read."""
        generic = {name: copy.deepcopy(getattr(self, name)) for name in self.GENERIC}
        options = self.options.model_dump()
        out = {k: generic[k] if k in generic else options[k] if k in options else LEGACY_OPTION_DEFAULTS[k]
               for k in LEGACY_LAYOUT}
        out.update({k: v for k, v in options.items() if k not in out})
        # a generic setting added since the layout froze, only where it is set: a row of a run that leaves it at
        # its default keeps today's keys (the stored `spec` column)
        out.update({k: v for k, v in generic.items() if k not in out and v != type(self).model_fields[k].get_default(
            call_default_factory=True)})
        return out

    def to_dict(self) -> dict[str, Any]:
        return self.flat()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        try:
            own = set(options_class(data.get("backend")).model_fields)
        except ConfigError:
            own = set()  # an unknown backend fails where it is loaded, as a failed run
        known = set(cls.GENERIC) | set(LEGACY_OPTION_DEFAULTS) | own
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown run setting(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)


RunSpec.GENERIC = tuple(name for name in RunSpec.model_fields if name != "options")


# -- the noise floor's second kernel ----------------------------------------------------------------------------
NOISE_FLOOR_SETTINGS = ("experts_impl", "dtype")  # what the second kernel sets; a sweep variant naming either keeps it


def noise_floor_kernel(gpu: str, has_gpu: bool) -> tuple[str, str]:
    """(experts_impl, dtype) of the noise-floor run on a machine with or without a GPU: the same BF16 weights
    through a second, equally valid kernel.

    On a GPU that is transformers' `eager` experts loop instead of `grouped_mm` (the card's floor). On a CPU the
    two compute bit-identical answers, which would make a floor of zero noise, so there the second kernel is
    float32 arithmetic over the same bf16 weights: what bf16 rounding alone moves. `run --noise-floor`, `demo` and
    a sweep's noise-floor variant all take it from here."""
    on_cpu = gpu.strip().lower() == "cpu" or not has_gpu
    return ("grouped_mm", "float32") if on_cpu else ("eager", "bfloat16")


def as_noise_floor(spec: RunSpec, has_gpu: bool) -> RunSpec:
    """`spec` under the noise floor's second kernel of a machine with (or without) a GPU."""
    kernel = dict(zip(NOISE_FLOOR_SETTINGS, noise_floor_kernel(spec.gpu, has_gpu), strict=True))
    return RunSpec.from_dict({**spec.to_dict(), **kernel})
