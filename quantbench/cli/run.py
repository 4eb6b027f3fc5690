"""The commands that measure: `run` (with its backend flags), `demo`, `backends` and `sweep`."""

from __future__ import annotations

import inspect
import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from quantbench import limits
from quantbench.cli.common import DbOpt, _db, _fail, err, out
from quantbench.cli.media_flags import (
    MaxAudioSeconds,
    MaxImagePixels,
    MaxMediaBytes,
    MaxMediaParts,
    MaxPartDecodedBytes,
    MaxRequestDecodedBytes,
    MaxVideoFrames,
    MaxVideoSeconds,
    media_limits,
)
from quantbench.errors import ConfigError, QuantbenchError
from quantbench.run.settings import GENERIC, MAX_REPEATS
from quantbench.term import rule


def generic_flag(name: str) -> typer.models.OptionInfo:
    """The `run` flag of a generic setting as quantbench.run.settings declares it (its flag and help)."""
    return typer.Option(GENERIC[name].flag, help=GENERIC[name].help)


def _spec(**kw):
    from quantbench.run.spec import RunSpec  # lazy: a fast --help

    return RunSpec(**kw)


def _execute_and_store(spec, db: Path, repeat: tuple[str, int, int] | None = None) -> tuple[str, str]:
    from quantbench.run.runner import (  # lazy: fast --help
        execute,
        finishing_write,
        stop_on_signals,
        stop_requested,
    )
    from quantbench.store import Store

    with stop_on_signals():  # SIGTERM / SIGHUP / Ctrl-C: the child is killed, the run stored as interrupted
        result = execute(spec, repeat=repeat)
        with finishing_write():  # a stop signal now lets the write finish (a second one interrupts it)
            run_id = Store(db).write_run(result)
    if signum := stop_requested():
        run = result.run
        how = ("as failed: interrupted" if run.failure == "interrupted" else
               f"whole ({run.status}{': ' + run.failure if run.failure else ''}): the signal came as it was being "
               "written, after the run had finished")
        err.print(f"[red]stopped by {signal.Signals(signum).name}:[/] run {run_id} stored in {escape(str(db))} {how}",
                  soft_wrap=True)
        raise typer.Exit(128 + signum)
    return run_id, result.run.status


def _declared_options() -> dict:
    """{name: FieldInfo} of every setting an installed backend declares; a name two backends declare is one flag,
    so its type must agree."""
    from quantbench.run.spec import installed_backends, options_class  # lazy: a fast --help

    out: dict = {}
    installed = installed_backends()  # once: each lookup reads every distribution's metadata
    for backend in sorted(installed):
        for name, info in options_class(backend, installed).model_fields.items():
            if name in out and out[name].annotation != info.annotation:
                raise TypeError(f"backend {backend} declares {name} as {info.annotation}, another as "
                                f"{out[name].annotation}: one `run` flag cannot be both")
            out.setdefault(name, info)
    return out


class RunCommand(typer.core.TyperCommand):
    """`run`, with one flag per setting an installed backend declares (its `Options`, quantbench.run.spec), each
    placed after the flag its declaration names. Built on first use: it imports the backends, which `quantbench
    --help` must not wait for."""

    _options: list | None = None
    _declared: dict | None = None

    def backend_declarations(self) -> dict:
        """_declared_options(), once per command: click asks for the params several times per invocation."""
        if self._declared is None:
            self._declared = _declared_options()
        return self._declared

    def option_params(self) -> list:
        """The backend flags, made by typer from a signature built from the declarations (same help rendering)."""
        if self._options is None:
            from quantbench.run.spec import choices, declared, flag_of  # lazy: a fast --help

            params = []
            for name, info in self.backend_declarations().items():
                how, allowed = declared(info), choices(info)
                option = typer.Option(how.get("flag") or flag_of(name, info), help=info.description,
                                      envvar=how.get("envvar"))
                hint = type(allowed[0]) if allowed else info.annotation  # a Literal is checked by the backend
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info.default,
                                                annotation=Annotated[hint, option]))

            def declared_options(**_: object) -> None: ...

            declared_options.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
            built = typer.Typer(add_completion=False)
            built.command()(declared_options)
            self._options = list(typer.main.get_command(built).params)
        return self._options

    def anchored_params(self) -> list:
        """(flag, the flag it follows) of every flag placed among the command's own: here the backend flags."""
        from quantbench.run.spec import declared  # lazy: a fast --help

        declarations = self.backend_declarations()
        return [(param, declared(declarations[param.name]).get("after")) for param in self.option_params()]

    def get_params(self, ctx):
        """The command's own flags with each anchored flag after the flag its declaration names."""
        placed = self.anchored_params()
        anchors = {id(param): after for param, after in placed}
        pending = [param for param, _ in placed]
        out = []

        def place(param) -> None:
            out.append(param)
            for option in [o for o in pending if anchors[id(o)] in param.opts]:
                pending.remove(option)
                place(option)

        for param in super().get_params(ctx):
            place(param)
        return out[:-1] + pending + out[-1:]  # no anchor found: after the command's own flags, before --help

    def invoke(self, ctx):
        flags = {p.name: p.opts[0] for p in self.option_params()}
        source = {name: getattr(ctx.get_parameter_source(name), "name", None) for name in flags}
        ctx.meta["backend_options"] = {  # name: (value, its flag, typed on the command line, from the environment)
            name: (ctx.params.pop(name), flags[name], source[name] == "COMMANDLINE", source[name] == "ENVIRONMENT")
            for name in list(ctx.params) if name in flags}
        return super().invoke(ctx)


def backend_settings(backend: str, flags: dict[str, tuple], **chosen: object) -> dict[str, object]:
    """The backend's own settings from the `run` flags, checked against its declared Options: a flag it does not
    declare is refused, naming the backend and its settings; an environment variable it does not declare is not
    its business."""
    from pydantic import ValidationError  # lazy: a fast --help

    from quantbench.run.spec import flag_of, options_class, options_error

    options = options_class(backend)
    own = options.model_fields
    refused = [flag for name, (_, flag, typed, _) in flags.items() if typed and name not in own]
    if refused:
        theirs = ", ".join(flag_of(name, info) for name, info in own.items()) or "none"
        raise ConfigError(f"{', '.join(refused)} {'is not a setting' if len(refused) == 1 else 'are not settings'} "
                          f"of backend {backend}; its settings: {theirs}")
    settings = {name: value for name, (value, _, typed, env) in flags.items() if name in own and (typed or env)}
    settings.update(chosen)
    try:
        options.model_validate(settings)
    except ValidationError as e:
        raise options_error(e, options, backend, flag=True) from None
    return settings


def run(
    ctx: typer.Context,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8 | http (see `quantbench backends`)")] = "bf16",
    model: Annotated[str | None, typer.Option(help="Checkpoint dir or hub id org/name[@revision]. Default: the embedded fixture (or its variant)")] = None,
    suite: Annotated[str | None, typer.Option(help="Suite JSONL, or quantbench-omni-v2 (the built-in media suite; quantbench-omni-v1: its first 169 records). Default: the built-in suite of --family")] = None,
    family: Annotated[str, typer.Option(help="text | omni: the embedded default model (and its variant for --backend) and the built-in suite used where --model / --suite are not given; omni: a trained Qwen3-Omni thinker and quantbench-omni-v2")] = "text",
    gpu: Annotated[str, typer.Option(help="auto | cpu | ampere | ada | hopper | blackwell | part of a GPU name")] = "auto",
    db: DbOpt = None,
    device: Annotated[str | None, typer.Option(help="torch device (default cuda:0 when there is a GPU)")] = None,
    dtype: Annotated[str, generic_flag("dtype")] = GENERIC["dtype"].default,
    concurrency: Annotated[int, generic_flag("concurrency")] = GENERIC["concurrency"].default,
    shape: Annotated[str | None, typer.Option(help="Synthetic real-shape model, e.g. qwen3-30b-a3b (random weights)")] = None,
    layers: Annotated[int | None, generic_flag("layers")] = GENERIC["layers"].default,
    noise_floor: Annotated[bool, typer.Option(help="Run the BF16 reference under the second kernel as the noise floor (on a GPU the eager experts; on a CPU, where both experts kernels answer alike, float32 arithmetic over the same weights)")] = False,
    reference: Annotated[bool, typer.Option(help="Mark this run as the reference for parity")] = False,
    base_model: Annotated[str | None, typer.Option(help="The BF16 model this variant was made from (its checkpoint dir or model id): the report compares the variant with that model's BF16 run")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code (off by default)")] = False,
    max_options: Annotated[int, generic_flag("max_options")] = GENERIC["max_options"].default,
    max_tokens: Annotated[int | None, generic_flag("max_tokens")] = GENERIC["max_tokens"].default,
    truncate: Annotated[bool, typer.Option(help="Cut over-long states to fit (recorded per answer) instead of failing")] = False,
    method: Annotated[str, generic_flag("method")] = GENERIC["method"].default,
    warmup: Annotated[int, generic_flag("warmup")] = GENERIC["warmup"].default,
    latency_min_decisions: Annotated[int, generic_flag("latency_min_decisions")] = GENERIC["latency_min_decisions"].default,
    latency_min_seconds: Annotated[float, generic_flag("latency_min_seconds")] = GENERIC["latency_min_seconds"].default,
    limit: Annotated[int | None, generic_flag("limit")] = GENERIC["limit"].default,
    timeout: Annotated[float, generic_flag("timeout_s")] = GENERIC["timeout_s"].default,
    repeat: Annotated[int, typer.Option(help="Run it N times, each in a fresh process on the same questions: the report gives latency p50 and energy per decision as mean ± a 95% t interval over the N, with their CV")] = 1,
    max_media_parts: MaxMediaParts = limits.DEFAULT_MAX_MEDIA_PARTS,
    max_media_bytes: MaxMediaBytes = limits.DEFAULT_MAX_MEDIA_BYTES,
    max_image_pixels: MaxImagePixels = limits.DEFAULT_MAX_IMAGE_PIXELS,
    max_audio_seconds: MaxAudioSeconds = limits.DEFAULT_MAX_AUDIO_SECONDS,
    max_video_frames: MaxVideoFrames = limits.DEFAULT_MAX_VIDEO_FRAMES,
    max_video_seconds: MaxVideoSeconds = limits.DEFAULT_MAX_VIDEO_SECONDS,
    max_part_decoded_bytes: MaxPartDecodedBytes = limits.DEFAULT_MAX_PART_DECODED_BYTES,
    max_request_decoded_bytes: MaxRequestDecodedBytes = limits.DEFAULT_MAX_REQUEST_DECODED_BYTES,
) -> None:
    """Run one variant on the suite in a fresh process and store every answer, latency and memory figure."""
    if noise_floor:
        if backend != "bf16":
            _fail(QuantbenchError("--noise-floor runs the BF16 reference under a second kernel; use it with --backend bf16"))
        experts_impl, dtype = noise_floor_kernel(gpu)
    role = "noise_floor" if noise_floor else "reference" if reference else "candidate"
    try:
        if not 1 <= repeat <= MAX_REPEATS:
            raise ConfigError(f"--repeat {repeat}: give the number of runs, 1 to {MAX_REPEATS} (3 gives a t interval)")
        flags = ctx.meta["backend_options"]
        options = backend_settings(backend, flags, **({"experts_impl": experts_impl} if noise_floor else {}))
        if base_model is not None:
            from quantbench.models.lineage import resolve_given_base  # lazy: a fast --help

            base_model = resolve_given_base(base_model)
        settings = dict(backend=backend, gpu=gpu, device=device, dtype=dtype, base_model=base_model,
                        concurrency=concurrency, shape=shape, layers=layers, role=role,
                        trust_remote_code=trust_remote_code, max_options=max_options, max_tokens=max_tokens,
                        truncate=truncate, method=method, warmup=warmup,
                        latency_min_decisions=latency_min_decisions, latency_min_seconds=latency_min_seconds,
                        limit=limit, timeout_s=timeout, **options,
                        media_limits=media_limits(max_media_parts=max_media_parts, max_media_bytes=max_media_bytes,
                                                  max_image_pixels=max_image_pixels,
                                                  max_audio_seconds=max_audio_seconds,
                                                  max_video_frames=max_video_frames,
                                                  max_video_seconds=max_video_seconds,
                                                  max_part_decoded_bytes=max_part_decoded_bytes,
                                                  max_request_decoded_bytes=max_request_decoded_bytes))
        from quantbench.run.backend import get_backend  # lazy: a fast --help
        from quantbench.run.checks import check_cache, check_spec
        from quantbench.run.machine import detect
        from quantbench.run.runner import preflight
        from quantbench.store import Store

        # Refused now, in a second, not after the child's imports, the suite or minutes of preparing the omni model:
        # an option this machine or the backend cannot take (--device, --gpu, --endpoint …), a store that can't take
        # the run, a --model or --suite that can't be read.
        check_spec(_spec(model=model, suite=suite, **settings), detect(), get_backend(backend))
        check_cache()
        Store(_db(db)).check_writable()
        if family != "text" or suite is not None:
            from quantbench.run.resolve import family_defaults  # lazy: a fast --help

            # the omni model and its variants are prepared here, by the parent, as resolve() prepares the text one
            model, suite = family_defaults(backend, family, model, suite, shape)
        spec = _spec(model=model, suite=suite, **settings)
        preflight(spec)
        ids, statuses = [], []
        repeat_id = _new_repeat_id() if repeat > 1 else None
        for index in range(1, repeat + 1):
            if repeat > 1:
                rule(err, f"[bold]repeat {index} of {repeat}")
            run_id, status = _execute_and_store(spec, _db(db), (repeat_id, index, repeat) if repeat_id else None)
            ids.append(run_id)
            statuses.append(status)

        from quantbench.report.tables import runs_table  # pandas: not before the checks above refuse
        from quantbench.store import queries

        title = f"run stored in {_db(db)}" if repeat == 1 else f"{repeat} runs stored in {_db(db)}"
        stored = queries.stored_runs_by_id(Store(_db(db)), ids)
        out.print(runs_table(stored, title))
        if repeat_id:
            from quantbench.analysis.repeats import repeat_summary_text

            print(repeat_summary_text(Store(_db(db)), repeat_id))
        if any(s != "ok" for s in statuses):
            for run in stored:
                if run.status != "ok":
                    first = (run.error or "no error message stored").splitlines()[0]
                    err.print(f"[red]{run.run_id[:13]}: {escape(first)}[/]", soft_wrap=True)
            raise typer.Exit(1)
    except QuantbenchError as e:
        _fail(e)


def _new_repeat_id() -> str:
    from quantbench.run.record import uuid7  # lazy: a fast --help

    return str(uuid7())


def noise_floor_kernel(gpu: str) -> tuple[str, str]:
    """(experts_impl, dtype) of a noise-floor run on this machine (quantbench.run.spec.noise_floor_kernel: eager
    experts on a GPU, float32 arithmetic on a CPU, where both experts kernels answer alike)."""
    from quantbench.run.machine import detect  # lazy: a fast --help
    from quantbench.run.spec import noise_floor_kernel as on_machine

    return on_machine(gpu, detect().has_gpu)


DEMO_VARIANTS = [
    ("bf16 (reference)", dict(backend="bf16", role="reference")),
    ("bf16 noise floor (second kernel)", dict(backend="bf16", role="noise_floor")),
    ("int4", dict(backend="int4")),
    ("nvfp4 packed", dict(backend="nvfp4", nvfp4_mode="packed")),
    ("nvfp4 unpacked", dict(backend="nvfp4", nvfp4_mode="unpacked")),
    ("fp8", dict(backend="fp8")),
]


def demo(
    db: DbOpt = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N records of the suite")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Run only these backends (repeatable)")] = None,
    family: Annotated[str, typer.Option(help="text: the embedded Qwen3-MoE on the built-in text suite | omni: the "
                                             "embedded Qwen3-Omni thinker on a slice of quantbench-omni-v2 (its "
                                             "first 169 of 796 records: text, image, audio and video decisions; the "
                                             "report per modality)")] = "text",
) -> None:
    """Build the embedded default model if needed, run every variant on it, store the results, print the table."""
    from quantbench.make.quantize import default_model_dir
    from quantbench.report.tables import runs_table  # lazy: a fast --help
    from quantbench.run.backend import backend_names
    from quantbench.store import Store, queries

    path = _db(db)
    try:
        demo_backends = list(dict.fromkeys(kw["backend"] for _, kw in DEMO_VARIANTS))
        unknown = [b for b in only or [] if b not in demo_backends]
        if unknown:
            raise ConfigError(f"--only {', '.join(unknown)}: not a backend of the demo; use {', '.join(demo_backends)}")
        from quantbench.run.settings import refusal  # lazy: a fast --help

        if why := refusal("limit", limit):  # before: 0 ran the whole suite, -2 all but its last 2 records
            raise ConfigError(why)
        from quantbench.run.checks import check_cache

        check_cache()  # where the embedded model is built
        Store(path).check_writable()  # before minutes of building and running
        err.print(f"[bold]embedded default model ({family}):[/] {escape(str(default_model_dir(family)))}")
        if family == "omni" and limit is None:
            from quantbench.protocol import omnisuite

            limit = omnisuite.SLICE
            err.print(f"[bold]suite:[/] the first {limit} of {omnisuite.DEFAULT}'s 796 records (10 per media family, "
                      "each variant's CPU emulation takes minutes): too few to decide a media verdict at the "
                      f"2-point margin (about 189 questions a modality would); `quantbench run --family omni` runs "
                      "all of them (200 per modality)", soft_wrap=True)
        installed = set(backend_names())
        ids, failed = [], []
        for label, kw in DEMO_VARIANTS:
            if kw["backend"] not in installed or (only and kw["backend"] not in only):
                continue
            rule(err, f"[bold]{label}")
            if kw.get("role") == "noise_floor":
                kw = dict(kw, **dict(zip(("experts_impl", "dtype"), noise_floor_kernel("auto"), strict=True)))
            if family != "text":
                from quantbench.run.resolve import family_defaults  # lazy: a fast --help

                # the model (or its variant for this backend) and the suite, prepared here as `run --family` does
                model, suite = family_defaults(kw["backend"], family, None, None)
                kw = dict(kw, model=model, suite=suite)
            run_id, status = _execute_and_store(_spec(limit=limit, timeout_s=1800.0, **kw), path)
            ids.append(run_id)
            if status != "ok":
                failed.append((label, run_id))
        stored = queries.stored_runs_by_id(Store(path), ids)
        out.print(runs_table(stored, f"quantbench demo — stored in {path}"))
        from quantbench.report import report_for_this_machine  # lazy: a fast --help
        from quantbench.run.machine import detect

        # Plain print: the report is markdown meant to be pasted, so no wrapping or markup from rich.
        # It covers this demo's runs only: an older run of the store never stands in for a variant that failed now.
        model = next((r.model_id for r in stored if r.status == "ok" and r.model_id is not None), None)
        if model is not None:
            print(report_for_this_machine(Store(path), detect().gpu_name or "cpu", model=model, run_ids=set(ids)))
        if failed:
            print(demo_failures(Store(path), failed, len(ids)))
            err.print(f"[red]demo: {len(failed)} of {len(ids)} variants failed[/] "
                      f"({', '.join(label for label, _ in failed)}); the reasons are above")
            raise typer.Exit(1)
    except QuantbenchError as e:
        _fail(e)


def demo_failures(store, failed: list[tuple[str, str]], n_runs: int) -> str:
    """A markdown list of the demo's failed variants, each with its failure and the first line of its error."""
    from quantbench.store import queries  # lazy: a fast --help

    lines = [f"**{len(failed)} of {n_runs} variants failed in this demo** (the whole errors: "
             "`quantbench runs`, the dashboard's Runs page):", ""]
    by_id = {r.run_id: r for r in queries.stored_runs_by_id(store, [run_id for _, run_id in failed])}
    for label, run_id in failed:
        run = by_id[run_id]
        first = (run.error or "no error message stored").strip().splitlines()[0]
        lines.append(f"- {label}: failed ({run.failure or 'error'}): {first} (run {run_id[:13]})")
    return "\n".join(lines) + "\n"


def backends() -> None:
    """List installed backends (entry points) and what each can do on this machine."""
    from quantbench.run.backend import backend_names, get_backend  # lazy: a fast --help
    from quantbench.run.machine import detect

    machine = detect()
    t = Table(title=f"backends on {machine.label}", title_justify="left")
    for col in ("backend", "available", "native here?", "what", "detail"):
        t.add_column(col)
    for name in backend_names():
        try:
            b = get_backend(name)
            a = b.availability(machine)
            t.add_row(name, "yes" if a.available else "[red]no[/]", a.native or "—", b.summary, a.detail)
        except Exception as e:  # a broken plugin is shown, not fatal
            t.add_row(name, "[red]error[/]", "—", "", f"{type(e).__name__}: {e}")
    out.print(t)


def sweep(
    path: Annotated[Path, typer.Argument(help="sweep.toml (see examples/sweep.toml)")],
    executor: Annotated[str, typer.Option(help="local | ray")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (ray executor), e.g. auto")] = None,
    rerun: Annotated[bool, typer.Option(help="Run again even when an identical run is stored")] = False,
    parquet_dir: Annotated[str | None, typer.Option(help="Ray: each task writes Parquet here (merge later)")] = None,
    db: DbOpt = None,
) -> None:
    """Run a matrix of models × variants × GPUs, one fresh process per run, locally or on Ray."""
    from quantbench.run.checks import check_cache  # lazy: a fast --help
    from quantbench.run.runner import stop_on_signals, stop_requested
    from quantbench.sweep import cli_sweep

    try:
        check_cache()
        with stop_on_signals():  # SIGTERM / SIGHUP / Ctrl-C: runs in flight are stored as interrupted
            outcome = cli_sweep(path, executor, address, rerun, str(_db(db)), parquet_dir)
    except QuantbenchError as e:
        _fail(e)
    if signum := stop_requested():
        left = getattr(outcome, "not_started", 0)  # the runs it never started: the same sweep again runs them
        stopped = getattr(outcome, "interrupted", 0)  # none when the signal came between runs or while it waited
        err.print(f"[red]stopped by {signal.Signals(signum).name}:[/] "
                  + (f"{stopped} run(s) in flight stored as interrupted" if stopped else "no run was in flight")
                  + (f"; {left} not started: run the same sweep again to run them (finished runs are skipped)"
                     if left else ""))
        raise typer.Exit(128 + signum)
    if getattr(outcome, "failed", 0) or getattr(outcome, "unsaved", None):  # a run kept aside is not stored
        raise typer.Exit(1)
