"""The `quantbench` command. Each subcommand is a thin wrapper: the work lives in the module it names."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from quantbench import limits
from quantbench.errors import ConfigError, QuantbenchError
from quantbench.term import console, rule

app = typer.Typer(
    help="Which quant of a mixture-of-experts model should I use on this GPU? Measured, reproducibly.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Tables are meant to be read whole: when stdout is a file or a pipe, don't squeeze them into 80 columns.
out = console()
err = console(stderr=True)

DbOpt = Annotated[Path, typer.Option("--db", help="Results store (DuckDB). Default: $QUANTBENCH_DB or ./results.duckdb")]


def _db(db: Path | None) -> Path:
    from quantbench.store import default_db

    return Path(db) if db else Path(default_db())


def _fail(e: Exception) -> None:
    err.print(f"[bold red]error:[/] {e}", soft_wrap=True)  # one line: the terminal wraps it, a pipe or log keeps it whole
    raise typer.Exit(2)


def _spec(**kw):
    from quantbench.run.spec import RunSpec

    return RunSpec(**kw)


def _execute_and_store(spec, db: Path) -> tuple[str, str]:
    from quantbench.run.runner import execute, stop_on_signals, stop_requested
    from quantbench.store import Store

    with stop_on_signals():  # SIGTERM / SIGHUP / Ctrl-C: the child is killed, the run stored as interrupted
        result = execute(spec)
        run_id = Store(db).write_run(result)
    if signum := stop_requested():
        err.print(f"[red]stopped by {signal.Signals(signum).name}:[/] run {run_id} stored in {db} as failed: interrupted",
                  soft_wrap=True)
        raise typer.Exit(128 + signum)
    return run_id, result.run.status


def _declared_options() -> dict:
    """{name: FieldInfo} of every setting an installed backend declares; a name two backends declare is one flag,
    so its type must agree."""
    from quantbench.run.backend import backend_names
    from quantbench.run.spec import options_class

    out: dict = {}
    for backend in backend_names():
        for name, info in options_class(backend).model_fields.items():
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

    def option_params(self) -> list:
        """The backend flags, made by typer from a signature built from the declarations (same help rendering)."""
        if self._options is None:
            import inspect

            from quantbench.run.spec import choices, declared, flag_of

            params = []
            for name, info in _declared_options().items():
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

    def get_params(self, ctx):
        """The command's own flags with each backend flag after the flag its declaration names."""
        from quantbench.run.spec import declared

        anchors = {name: declared(info).get("after") for name, info in _declared_options().items()}
        pending = list(self.option_params())
        out = []

        def place(param) -> None:
            out.append(param)
            for option in [o for o in pending if anchors.get(o.name) in param.opts]:
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
    from pydantic import ValidationError

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


@app.command(cls=RunCommand)
def run(
    ctx: typer.Context,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8 | http (see `quantbench backends`)")] = "bf16",
    model: Annotated[str | None, typer.Option(help="Checkpoint dir. Default: the embedded fixture (or its variant)")] = None,
    suite: Annotated[str | None, typer.Option(help="Suite JSONL. Default: the built-in suite")] = None,
    gpu: Annotated[str, typer.Option(help="auto | cpu | ampere | ada | hopper | blackwell | part of a GPU name")] = "auto",
    db: DbOpt = None,
    device: Annotated[str | None, typer.Option(help="torch device (default cuda:0 when there is a GPU)")] = None,
    dtype: Annotated[str, typer.Option(help="bfloat16 | float32 | float16 (compute dtype)")] = "bfloat16",
    concurrency: Annotated[int, typer.Option(help="Requests in flight (http) or batched per forward pass (throughput mode)")] = 1,
    shape: Annotated[str | None, typer.Option(help="Synthetic real-shape model, e.g. qwen3-30b-a3b (random weights)")] = None,
    layers: Annotated[int | None, typer.Option(help="Synthetic shape: number of layers")] = None,
    noise_floor: Annotated[bool, typer.Option(help="Run the BF16 reference under the second kernel (eager) as the noise floor")] = False,
    reference: Annotated[bool, typer.Option(help="Mark this run as the reference for parity")] = False,
    base_model: Annotated[str | None, typer.Option(help="The BF16 model this variant was made from (its checkpoint dir or model id): the report compares the variant with that model's BF16 run")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code (off by default)")] = False,
    max_options: Annotated[int, typer.Option(help="Largest number of options a question may have (past 26 they are numbered and scored by continuation)")] = limits.DEFAULT_MAX_OPTIONS,
    max_tokens: Annotated[int | None, typer.Option(help="Prompt token limit (default: the model's context)")] = None,
    truncate: Annotated[bool, typer.Option(help="Cut over-long states to fit (recorded per answer) instead of failing")] = False,
    method: Annotated[str, typer.Option(help="auto (label logits when possible) | continuation")] = "auto",
    warmup: Annotated[int, typer.Option(help="Untimed warm-up decisions")] = 3,
    latency_min_decisions: Annotated[int, typer.Option(help="Latency phase: at least this many timed decisions")] = 20,
    latency_min_seconds: Annotated[float, typer.Option(help="Latency phase: and at least this many seconds")] = 2.0,
    limit: Annotated[int | None, typer.Option(help="Only the first N records of the suite")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds before the run is killed (a `timeout` row)")] = 1800.0,
) -> None:
    """Run one variant on the suite in a fresh process and store every answer, latency and memory figure."""
    if noise_floor:
        if backend != "bf16":
            _fail(QuantbenchError("--noise-floor runs the BF16 reference under a second kernel; use it with --backend bf16"))
        experts_impl, dtype = noise_floor_kernel(gpu)
    role = "noise_floor" if noise_floor else "reference" if reference else "candidate"
    try:
        flags = ctx.meta["backend_options"]
        options = backend_settings(backend, flags, **({"experts_impl": experts_impl} if noise_floor else {}))
        if base_model is not None:
            from quantbench.models.lineage import resolve_given_base

            base_model = resolve_given_base(base_model)
        spec = _spec(backend=backend, model=model, suite=suite, gpu=gpu, device=device, dtype=dtype, base_model=base_model,
                     concurrency=concurrency, shape=shape, layers=layers, role=role,
                     trust_remote_code=trust_remote_code, max_options=max_options, max_tokens=max_tokens,
                     truncate=truncate, method=method, warmup=warmup,
                     latency_min_decisions=latency_min_decisions, latency_min_seconds=latency_min_seconds, limit=limit,
                     timeout_s=timeout, **options)
        from quantbench.report.tables import runs_table  # lazy: a fast --help
        from quantbench.run.backend import get_backend
        from quantbench.run.runner import preflight
        from quantbench.store import Store, queries

        # Refused now, in a second, not after the child's imports or the suite: a store that can't take the run,
        # a --model or --suite that can't be read.
        Store(_db(db)).check_writable()
        preflight(spec)
        get_backend(backend)  # an unknown backend is an error before anything is spawned
        run_id, status = _execute_and_store(spec, _db(db))

        out.print(runs_table(queries.run_summary(Store(_db(db)), run_id), f"run stored in {_db(db)}"))
        if status != "ok":
            row = queries.run_error(Store(_db(db)), run_id)
            err.print(f"[red]{row.error.iloc[0].splitlines()[0]}[/]")
            raise typer.Exit(1)
    except QuantbenchError as e:
        _fail(e)


def noise_floor_kernel(gpu: str) -> tuple[str, str]:
    """(experts_impl, dtype) of the noise-floor run: the same BF16 weights through a second, equally valid kernel.

    On a GPU that is transformers' `eager` experts loop instead of `grouped_mm` (the card's floor). On a CPU the
    two compute bit-identical answers, which would make a floor of zero noise, so there the second kernel is
    float32 arithmetic over the same bf16 weights: what bf16 rounding alone moves."""
    from quantbench.run.machine import detect

    on_cpu = gpu.strip().lower() == "cpu" or not detect().has_gpu
    return ("grouped_mm", "float32") if on_cpu else ("eager", "bfloat16")


DEMO_VARIANTS = [
    ("bf16 (reference)", dict(backend="bf16", role="reference")),
    ("bf16 noise floor (second kernel)", dict(backend="bf16", role="noise_floor")),
    ("int4", dict(backend="int4")),
    ("nvfp4 packed", dict(backend="nvfp4", nvfp4_mode="packed")),
    ("nvfp4 unpacked", dict(backend="nvfp4", nvfp4_mode="unpacked")),
    ("fp8", dict(backend="fp8")),
]


@app.command()
def demo(
    db: DbOpt = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N records of the suite")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Run only these backends (repeatable)")] = None,
) -> None:
    """Build the embedded default model if needed, run every variant on it, store the results, print the table."""
    from quantbench.models.fixture import default_model_dir
    from quantbench.report.tables import runs_table  # lazy: a fast --help
    from quantbench.run.backend import backend_names
    from quantbench.store import Store, queries

    path = _db(db)
    try:
        Store(path).check_writable()  # before minutes of building and running
        err.print(f"[bold]embedded default model:[/] {default_model_dir()}")
        installed = set(backend_names())
        ids, failed = [], []
        for label, kw in DEMO_VARIANTS:
            if kw["backend"] not in installed or (only and kw["backend"] not in only):
                continue
            rule(err, f"[bold]{label}")
            if kw.get("role") == "noise_floor":
                kw = dict(kw, **dict(zip(("experts_impl", "dtype"), noise_floor_kernel("auto"), strict=True)))
            run_id, status = _execute_and_store(_spec(limit=limit, timeout_s=1800.0, **kw), path)
            ids.append(run_id)
            if status != "ok":
                failed.append((label, run_id))
        df = queries.run_summaries(Store(path), ids)
        out.print(runs_table(df, f"quantbench demo — stored in {path}"))
        from quantbench.report import report_for_this_machine
        from quantbench.run.machine import detect

        # Plain print: the report is markdown meant to be pasted, so no wrapping or markup from rich.
        # It covers this demo's runs only: an older run of the store never stands in for a variant that failed now.
        model = next(iter(df.loc[df["status"] == "ok", "model_id"].dropna()), None)
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
    from quantbench.report.tables import stored_value  # lazy: a fast --help
    from quantbench.store import queries

    lines = [f"**{len(failed)} of {n_runs} variants failed in this demo** (the whole errors: "
             "`quantbench runs`, the dashboard's Runs page):", ""]
    for label, run_id in failed:
        row = queries.run_failure(store, run_id).iloc[0]
        first = (stored_value(row["error"]) or "no error message stored").strip().splitlines()[0]
        lines.append(f"- {label}: failed ({stored_value(row['failure']) or 'error'}): {first} (run {run_id[:13]})")
    return "\n".join(lines) + "\n"


@app.command()
def backends() -> None:
    """List installed backends (entry points) and what each can do on this machine."""
    from quantbench.run.backend import backend_names, get_backend
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


@app.command()
def runs(
    db: DbOpt = None,
    last: Annotated[int, typer.Option(help="Show the newest N runs")] = 30,
) -> None:
    """List stored runs, one self-describing row each."""
    from quantbench.report.tables import runs_table  # lazy: a fast --help
    from quantbench.store import Store, queries

    try:
        df = queries.newest_run_summaries(Store(_db(db)), last)
    except QuantbenchError as e:
        _fail(e)
    out.print(runs_table(df, f"runs in {_db(db)}"))


@app.command()
def migrate(db: DbOpt = None) -> None:
    """Bring a results store from an older quantbench up to this schema version (in place, keeping every row)."""
    from quantbench.store import Store

    try:
        store = Store(_db(db))
        before = store.schema_version()
        after = store.migrate()
        out.print(f"{store.path}: schema version {before} → {after}")
    except QuantbenchError as e:
        _fail(e)


@app.command()
def fixture(
    rebuild: Annotated[bool, typer.Option(help="Build again even if cached")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write the checkpoint here instead of the cache")] = None,
    shape: Annotated[str | None, typer.Option(help="Instead: the same family at a real shape (qwen3-30b-a3b) with "
                                                   "seeded random weights, written to --out (weights: synthetic)")] = None,
    layers: Annotated[int | None, typer.Option(help="--shape: number of layers (default: the real model's)")] = None,
    seed: Annotated[int, typer.Option(help="--shape: the random weights' seed")] = 0,
) -> None:
    """Build (or show) the embedded default model: a small trained Qwen3-MoE with its own tokenizer."""
    from quantbench.models.fixture import find_or_build
    from quantbench.models.synthetic import SYNTHETIC_SHAPES, save_synthetic, synthetic_id

    try:
        if shape is None:
            if layers is not None:
                raise ConfigError("--layers applies to --shape only: the embedded model's layers are part of its recipe")
            info = find_or_build(rebuild, out_dir)
            out.print(f"fixture [bold]{info.model_id}[/] at {info.path}")
            how = f"built in {info.train_seconds:.0f} s of training" if info.train_seconds is not None else "cached"
            out.print(f"{how}; {info.parameters / 1e6:.1f} M parameters, {info.size_bytes / 2**20:.1f} MiB "
                      "(bf16 safetensors)")
            table = Table("family", "held-out accuracy", title="built-in suite (never trained on)")
            for family, acc in info.accuracy.items():
                table.add_row(family, f"{acc:.1%}")
            table.add_row("[bold]mean[/]", f"[bold]{info.overall:.1%}[/]")
            out.print(table)
            return
        if shape not in SYNTHETIC_SHAPES:
            raise ConfigError(f"--shape {shape!r}: use one of {', '.join(sorted(SYNTHETIC_SHAPES))}")
        if out_dir is None:
            raise ConfigError("--shape writes a checkpoint (61 GB at 48 layers): give --out DIR")
        if layers is not None and layers < 1:
            raise ConfigError(f"--layers {layers}: give at least 1")
        with err.status(f"building {synthetic_id(shape, layers, seed)} …"):
            path = save_synthetic(shape, out_dir, layers=layers, seed=seed)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        out.print(f"{synthetic_id(shape, layers, seed)} (random weights: speed and memory only) at {path}, "
                  f"{size / 1e9:.2f} GB")
    except QuantbenchError as e:
        _fail(e)


@app.command()
def quantize(
    model: Annotated[str | None, typer.Option(help="BF16 checkpoint dir. Default: the embedded fixture")] = None,
    scheme: Annotated[str, typer.Option(help="int4 (AutoRound W4A16) | nvfp4 (ModelOpt) | fp8 (ModelOpt)")] = "int4",
    out_dir: Annotated[Path, typer.Option("--out", help="Where the quantized checkpoint goes (a new dir)")] = ...,
    iters: Annotated[int, typer.Option(help="int4: 0 = RTN (fast), 200 = SignRound")] = 0,
    nsamples: Annotated[int, typer.Option(help="Calibration samples (rendered decision records)")] = 128,
    seqlen: Annotated[int, typer.Option(help="Calibration sequence length (tokens)")] = 512,
    group_size: Annotated[int, typer.Option(help="int4 group size")] = 128,
    experts_only: Annotated[bool, typer.Option("--experts-only/--all", help="Quantize only the MoE experts (as the card)")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists")] = False,
    shape: Annotated[str | None, typer.Option(help="int4: quantize the synthetic model of `run --shape` (e.g. "
                                              "qwen3-30b-a3b) from memory instead of a checkpoint")] = None,
    layers: Annotated[int | None, typer.Option(help="--shape: its number of layers (default: the real one)")] = None,
    seed: Annotated[int, typer.Option(help="--shape: the seed of its random weights (as `run --seed`)")] = 0,
    opt_rtn: Annotated[bool, typer.Option("--opt-rtn/--plain-rtn", help="int4 with --iters 0: auto-round's "
                                          "optimized RTN (its default: a search per group, which it skips for MoE "
                                          "experts) or plain round-to-nearest (its disable_opt_rtn: no "
                                          "calibration pass)")] = True,
) -> None:
    """Make a quantized variant with the library that owns the format (auto-round, nvidia-modelopt)."""
    from quantbench.models.quantize import quantize as do_quantize

    try:
        if model is not None and shape is not None:
            raise ConfigError("give --model or --shape, not both")
        if model is None and shape is None:
            from quantbench.models.fixture import default_model_dir

            model = str(default_model_dir())
        path = do_quantize(model, scheme, out_dir, iters=iters, nsamples=nsamples, seqlen=seqlen,
                           group_size=group_size, experts_only=experts_only, overwrite=overwrite, shape=shape,
                           layers=layers, weights_seed=seed, opt_rtn=opt_rtn)
        out.print(f"[green]quantized[/] {model or shape} → [bold]{path}[/] ({scheme}); run it with "
                  f"`quantbench run --backend {scheme} --model {path}`")
    except QuantbenchError as e:
        _fail(e)


MARGIN_AGREEMENT_HELP = ("Verdict: top-answer agreement a variant may lose beyond the noise floor's and still count "
                         "as equivalent, a fraction (0.02 = 2 points)")
MARGIN_TV_HELP = "Verdict: mean total variation a variant may add beyond the noise floor's and still count as equivalent"


@app.command()
def compare(
    run_id: Annotated[str, typer.Argument(help="Candidate run id (or a unique prefix)")],
    reference: Annotated[str | None, typer.Option(help="Reference run (default: BF16 of the same model, suite, GPU)")] = None,
    noise_floor: Annotated[str | None, typer.Option(help="Noise-floor run (default: the reference's)")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
    margin_agreement: Annotated[float, typer.Option(help=MARGIN_AGREEMENT_HELP)] = 0.02,
    margin_tv: Annotated[float, typer.Option(help=MARGIN_TV_HELP)] = 0.01,
    db: DbOpt = None,
) -> None:
    """Parity of one run with its BF16 reference, beside the noise floor, with a verdict."""
    from quantbench.analysis.parity import compare as compare_runs  # lazy: a fast --help
    from quantbench.analysis.stats import Margins, ParityError
    from quantbench.report.tables import print_comparison
    from quantbench.store import Store

    try:
        if fmt not in ("table", "json"):
            raise ParityError(f"--format {fmt!r}: use table or json")
        comp = compare_runs(Store(_db(db)), run_id, reference, noise_floor, margins=Margins(margin_agreement, margin_tv))
        if fmt == "json":
            print(json.dumps(comp.to_dict(), indent=2, default=str))
        else:
            print_comparison(comp)
    except QuantbenchError as e:
        _fail(e)


@app.command()
def report(
    fmt: Annotated[str, typer.Option("--format", help="markdown | csv | json")] = "markdown",
    gpu: Annotated[str | None, typer.Option(help="A GPU family (hopper, cpu …) or part of a GPU name")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model id")] = None,
    vram_budget_gib: Annotated[float | None, typer.Option(help="Rule: peak memory must fit this budget (GiB)")] = None,
    min_agreement: Annotated[float | None, typer.Option(help="Rule: minimum agreement with BF16 (0.95 or 95)")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs made at or after this date / ISO time (UTC)")] = None,
    history: Annotated[bool, typer.Option("--all", help="Every kernel generation's newest run and every fixture build, not only the newest of each variant")] = False,
    margin_agreement: Annotated[float, typer.Option(help=MARGIN_AGREEMENT_HELP)] = 0.02,
    margin_tv: Annotated[float, typer.Option(help=MARGIN_TV_HELP)] = 0.01,
    db: DbOpt = None,
) -> None:
    """The "Which quant should I use?" table, one per GPU, from the store."""
    from quantbench.report import report_text  # lazy: a fast --help

    try:
        # Plain print: the report is meant to be pasted (a model card), so no wrapping or markup from rich.
        print(report_text(str(_db(db)), fmt, gpu, model, vram_budget_gib, min_agreement, since=since,
                          history=history, margin_agreement=margin_agreement, margin_tv=margin_tv), end="")
    except QuantbenchError as e:
        _fail(e)


@app.command()
def export(
    out_path: Annotated[str, typer.Option("--out", help="Parquet file (or folder) to write")] = "results.parquet",
    db: DbOpt = None,
) -> None:
    """Export the store to Parquet, to share results with other machines."""
    from quantbench.report.tables import print_exported  # lazy: a fast --help
    from quantbench.store import Store
    from quantbench.store.transfer import export as export_runs

    try:
        store = Store(_db(db))
        print_exported(store, export_runs(store, out_path))
    except QuantbenchError as e:
        _fail(e)


@app.command()
def merge(
    sources: Annotated[list[str], typer.Argument(help="Parquet files, other .duckdb stores, or folders of them")],
    db: DbOpt = None,
) -> None:
    """Merge results from other machines into this store (idempotent: merging twice adds nothing)."""
    from quantbench.report.tables import print_merged  # lazy: a fast --help
    from quantbench.store import Store
    from quantbench.store.transfer import PartialMergeError
    from quantbench.store.transfer import merge as merge_sources

    store = Store(_db(db))
    try:
        summary = merge_sources(store, sources)
    except PartialMergeError as e:  # the sources before the failing one are in: say what they added
        print_merged(store, e.summary)
        _fail(e)
    except QuantbenchError as e:
        _fail(e)
    print_merged(store, summary)


@app.command()
def serve(
    model: Annotated[str | None, typer.Option(help="Checkpoint dir. Default: the embedded fixture (or its variant)")] = None,
    backend: Annotated[str, typer.Option(help="bf16 | int4 | nvfp4 | fp8")] = "bf16",
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless told otherwise)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port")] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar="QUANTBENCH_API_KEY", help="Require this key on every request")] = None,
    demo: Annotated[bool, typer.Option(help="Answer one built-in decision, print it, exit")] = False,
    allow_truncation: Annotated[bool, typer.Option(help="Cut over-long states instead of answering 413")] = False,
    max_batch: Annotated[int, typer.Option(help="Most requests batched into one forward pass")] = 16,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the checkpoint's own Python code")] = False,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body (413 past it)")] = limits.DEFAULT_MAX_BODY_BYTES,
    max_questions: Annotated[int, typer.Option(help="Most questions per request (413 past it)")] = limits.DEFAULT_MAX_QUESTIONS,
    max_options: Annotated[int, typer.Option(help="Most options of one question (422 past it; past 26 they are numbered and scored by continuation)")] = limits.DEFAULT_MAX_OPTIONS,
    max_total_options: Annotated[int, typer.Option(help="Most options over all questions of a request, yes/no counting two (413 past it)")] = limits.DEFAULT_MAX_TOTAL_OPTIONS,
    max_request_tokens: Annotated[int, typer.Option(help="Most tokens of a request's sequences, padded (413 past it); also the most per batched forward pass")] = limits.DEFAULT_MAX_REQUEST_TOKENS,
    request_timeout: Annotated[float, typer.Option(help="Seconds from a request's headers to its answer: 408 while its body is read, 504 after (the request is dropped)")] = limits.DEFAULT_REQUEST_TIMEOUT_S,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection may take to send a request's headers before it is closed")] = limits.DEFAULT_HEADER_TIMEOUT_S,
) -> None:
    """Serve the SystemOne decision API (POST /v1/systemone, GET /healthz) over HTTP."""
    from quantbench.server import cli_serve

    try:
        raise typer.Exit(cli_serve(model, backend, host, port, api_key, demo, allow_truncation, max_batch,
                                   trust_remote_code, max_body_bytes=max_body_bytes, max_questions=max_questions,
                                   max_options=max_options, max_total_options=max_total_options,
                                   max_request_tokens=max_request_tokens, request_timeout_s=request_timeout,
                                   header_timeout_s=header_timeout) or 0)
    except QuantbenchError as e:
        _fail(e)


@app.command()
def sweep(
    path: Annotated[Path, typer.Argument(help="sweep.toml (see examples/sweep.toml)")],
    executor: Annotated[str, typer.Option(help="local | ray")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (ray executor), e.g. auto")] = None,
    rerun: Annotated[bool, typer.Option(help="Run again even when an identical run is stored")] = False,
    parquet_dir: Annotated[str | None, typer.Option(help="Ray: each task writes Parquet here (merge later)")] = None,
    db: DbOpt = None,
) -> None:
    """Run a matrix of models × variants × GPUs, one fresh process per run, locally or on Ray."""
    from quantbench.run.runner import stop_on_signals, stop_requested
    from quantbench.sweep import cli_sweep

    try:
        with stop_on_signals():  # SIGTERM / SIGHUP / Ctrl-C: runs in flight are stored as interrupted
            outcome = cli_sweep(path, executor, address, rerun, str(_db(db)), parquet_dir)
    except QuantbenchError as e:
        _fail(e)
    if signum := stop_requested():
        err.print(f"[red]stopped by {signal.Signals(signum).name}:[/] the runs in flight were stored as interrupted")
        raise typer.Exit(128 + signum)
    if getattr(outcome, "failed", 0):
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
