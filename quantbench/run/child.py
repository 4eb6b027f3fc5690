"""The child process of one run: load one variant, answer the suite, time it, write a result file.

Run as `python -m quantbench.run.child SPEC.json RESULT.json` by `quantbench.run.runner`. A fresh process per variant is
not optional: once auto_round is imported, transformers loads plain MoE checkpoints with random experts
(NOTES.md), and memory figures are only honest in a process that loaded nothing else.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from quantbench.errors import LoadError, QuantbenchError, RequestError, classify
from quantbench.models import experts_claim, lineage
from quantbench.models.checkpoint import planted_info, tensor_bytes
from quantbench.protocol import QuestionAnswer, modality_of, non_finite_answer, refuse_unread_media
from quantbench.protocol.suite import load_suite
from quantbench.run.backend import LoadedVariant, get_backend
from quantbench.run.energy import EnergyMeter
from quantbench.run.kernel import kernel_ran, planned_kernel
from quantbench.run.machine import LoadProbe, detect
from quantbench.run.memory import MemoryTracker
from quantbench.run.record import (
    AnswerRow,
    EnergyFacts,
    LatencyRow,
    LineageFacts,
    LoadFacts,
    MachineFacts,
    Measured,
    MemoryFacts,
    SuiteFacts,
    progress_file,
    result_files,
)
from quantbench.run.scorer import with_checkpoint_scorer
from quantbench.run.spec import RunSpec
from quantbench.term import LineProgress

# The parent pipes stderr to keep a tail for failed rows; it asks for live progress when it has a terminal.
console = Console(stderr=True, force_terminal=os.environ.get("QUANTBENCH_TTY") == "1" or None)


class Timer:
    """Model time of one forward: CUDA events + synchronize on a GPU, perf_counter on the CPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def __call__(self, fn, *args):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            out = fn(*args)
            end.record()
            torch.cuda.synchronize()
            return out, start.elapsed_time(end)
        t0 = time.perf_counter()
        out = fn(*args)
        return out, (time.perf_counter() - t0) * 1e3


def _progress() -> Progress:
    return LineProgress(  # to a file or a pipe: a plain line every 10 s instead of nothing until the end
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    )


def _answer_suite(loaded: LoadedVariant, records, timer: Timer, spec: RunSpec, out: dict[str, Any],
                  energy: EnergyMeter | None = None, load: LoadProbe | None = None) -> None:
    """Answer every record (timed), then keep timing until the latency phase's stop rules hold; `energy` reads
    the GPU's energy counter around that whole timed phase (and over an idle second before it).

    With `spec.concurrency` n > 1, records go n at a time through `forward_many`: a remote server gets n requests
    in flight (each timed end to end by the client), a local model answers them in one batched forward pass
    (throughput mode: each decision's time is the whole batch's, and `batch` says n)."""
    engine = loaded.engine
    answers: list[AnswerRow] = out["answers"]
    latencies: list[LatencyRow] = out["latencies"]
    measured: Measured = out["run"]
    n = max(1, spec.concurrency)

    # The run's tokenizer_hash: sha256 of the token ids the model was given for every suite prompt, in suite
    # order. Two runs with equal hashes saw identical inputs, whatever made them (tokenizer files, chat template,
    # truncation); parity refuses runs whose hashes differ. Only local engines see their ids (`rows`): a
    # remote server's run leaves it empty.
    digest, hashed = hashlib.sha256(), True

    def decide(chunk, cold: bool = False, suite: bool = False) -> list[tuple[Any, float, float, int, int]]:
        try:
            return _decide(chunk, cold, suite)
        except RequestError as e:  # a problem of the record (its media, its length, a server's 4xx): name it
            if e.field.startswith("record"):
                raise
            which = f"record {chunk[0].id}" if len(chunk) == 1 else f"one of records {', '.join(r.id for r in chunk)}"
            raise RequestError(f"{which}: {e.field}", e.problem, e.fix) from e

    def _decide(chunk, cold: bool, suite: bool) -> list[tuple[Any, float, float, int, int]]:
        nonlocal hashed
        t0 = time.perf_counter()
        prepared = [engine.prepare(r.request) for r in chunk]
        prep_ms = (time.perf_counter() - t0) * 1e3 / len(chunk)
        if suite and hashed:
            hashed = all(isinstance(p.rows, list) for p in prepared)
            if hashed:
                for record, p in zip(chunk, prepared, strict=True):
                    digest.update(json.dumps([record.id, p.rows], separators=(",", ":")).encode())
        if not cold:  # the cold decision keeps its one-time costs; no other one does (a CUDA graph to capture)
            engine.warm(prepared)
        if len(chunk) == 1:
            result, ms = timer(engine.forward, prepared[0])
            results, times = [result], [ms]
        else:
            results, ms = timer(engine.forward_many, prepared)
            times = [p.client_ms or ms for p in prepared]
        return [(res, prep_ms, t, engine.tokens(p), len(chunk)) for res, p, t in zip(results, prepared, times, strict=True)]

    def chunks(items):
        return [items[i : i + n] for i in range(0, len(items), n)]

    def timed(phase: str, record, prep_ms: float, model_ms: float, tokens: int, batch: int) -> None:
        latencies.append(LatencyRow(seq=len(latencies), phase=phase, record_id=record.id, model_ms=model_ms,
                                    prep_ms=prep_ms, tokens=tokens, batch=batch))
        energy.mark(len(latencies))  # a counter sample between decisions, every 0.1 s at most

    # Cold: the first decision after load (kernel compilation, allocator growth, autotuning), kept apart.
    measured.cold_ms = decide(records[:1], cold=True)[0][2]
    for i in range(spec.warmup):
        decide([records[(i * n + j + 1) % len(records)] for j in range(n)])

    energy = energy or EnergyMeter(None)
    load = load or LoadProbe()
    energy.idle()
    energy.start()  # the timed phase: every decision whose latency is stored
    load.start()
    with _progress() as progress:
        task = progress.add_task(f"{loaded.info.variant}: suite", total=len(records))
        for chunk in chunks(records):
            for record, (result, prep_ms, model_ms, tokens, batch) in zip(chunk, decide(chunk, suite=True),
                                                                          strict=True):
                timed("suite", record, prep_ms, model_ms, tokens, batch)
                modality = modality_of(record.request)
                for q, ans in result.items():
                    refuse_non_finite(record.id, q, ans)
                    answers.append(AnswerRow(
                        record_id=record.id, benchmark=record.benchmark, modality=modality, question=q,
                        options=list(ans.probabilities), probs=list(ans.probabilities.values()), top=ans.top,
                        gold=(record.gold or {}).get(q), method=ans.method, truncated=ans.truncated,
                    ))
            progress.advance(task, len(chunk))
        if hashed and records:
            measured.tokenizer_hash = digest.hexdigest()

        # Latency phase: keep timing decisions until both stop rules hold (at least N decisions, S seconds), and,
        # on a GPU with an energy counter, until its power has settled for long enough (quantbench.run.energy).
        need_n = max(0, spec.latency_min_decisions - len(records))
        t_start = time.perf_counter()
        need_s = max(0.0, spec.latency_min_seconds - sum(lat.model_ms for lat in latencies) / 1e3 / n)
        if need_n or need_s or energy.needs_more():
            task = progress.add_task(f"{loaded.info.variant}: latency", total=None)
            i = 0
            while i < need_n or time.perf_counter() - t_start < need_s or energy.needs_more():
                chunk = [records[(i + j) % len(records)] for j in range(n)]
                for record, (_, prep_ms, model_ms, tokens, batch) in zip(chunk, decide(chunk), strict=True):
                    timed("latency", record, prep_ms, model_ms, tokens, batch)
                i += n
                progress.advance(task, n)
    energy.stop(decisions=len(latencies), forward_s=sum(lat.model_ms / lat.batch for lat in latencies) / 1e3)
    load.stop()
    out["run"].load = LoadFacts(**load.facts())


def refuse_non_finite(record_id: str, question: str, answer: QuestionAnswer) -> None:
    """A non-finite probability is no answer (protocol.non_finite_answer): it fails the run, naming the record,
    the question and what to check, instead of a run stored `ok` with answers that meant nothing."""
    problem = non_finite_answer(question, answer)
    if problem:
        raise QuantbenchError(f"record {record_id}: {problem}: check the checkpoint, or run with --dtype bfloat16 / "
                              "float32")


def save_progress(measured: Measured, progress: Path | None) -> None:
    """Write what the run knows so far where the parent reads it if this process is killed (a timeout, a stop
    signal, a crash) before its result file: the row of an interrupted run keeps its suite and variant instead of
    failing "before its model or suite was known". Whole or not at all (written aside, then renamed)."""
    if progress is None:
        return
    tmp = progress.with_suffix(".tmp-progress")
    try:
        tmp.write_text(json.dumps(measured.model_dump(), default=str))
        tmp.replace(progress)
    except OSError:  # a full disk: the run goes on; only a row of a run killed later would miss these facts
        pass


def run(spec: RunSpec, out: dict[str, Any], progress: Path | None = None) -> None:
    """Do one run in this process, filling `out` with its rows (the parent completes and stores them). Each part
    of `out["run"]` (a Measured) is set as soon as it is known: a run that fails keeps what it learnt, and one
    killed keeps what was saved to `progress` (save_progress) by then."""
    from transformers.utils import logging as hf_logging  # lazy: transformers' import costs seconds

    hf_logging.disable_progress_bar()  # our own progress display is enough; theirs floods a piped stderr
    measured: Measured = out["run"]
    machine = detect(with_torch=True)
    device = spec.device or machine.device
    spec.device = device
    measured.machine = MachineFacts(**machine.as_row())
    measured.device = device
    suite = load_suite(spec.suite, limits=spec.limits(), limit=spec.limit)  # what it answers; the hash is the file's
    records = suite.first(spec.limit)
    measured.suite = SuiteFacts.of(suite, spec.limit)
    save_progress(measured, progress)

    try:  # is the variant what it claims? its experts' tensors against the backend (quantbench.models.experts_claim)
        experts = experts_claim.check_spec(spec.backend, spec.model, spec.shape)
    except LoadError as e:
        measured.extra = {"experts": getattr(e, "record", None)}
        raise
    mem = MemoryTracker(device, machine.nvml_index)
    mem.before_load()
    t0 = time.perf_counter()
    with console.status(f"loading {spec.backend} …"):
        # a checkpoint that names its own scorer answers through it (quantbench.run.scorer), whatever the backend
        loaded = with_checkpoint_scorer(get_backend(spec.backend).load(spec, machine), spec)
        loaded.engine.synchronize()
    measured.load_s = time.perf_counter() - t0
    mem.after_load()
    info = loaded.info
    planted = planted_info(info.model_path)
    if planted is not None:  # a planted regression (quantbench plant) is never mistaken for the variant it copies
        info.variant = f"{info.variant}+planted-{planted['tower']}"
        info.weight_format = f"{info.weight_format}; planted: {planted['tower']} tower {planted['mode']}"
        info.extra = {**info.extra, "planted": planted}
    measured.variant = info
    extra = {**info.extra, "load_note": info.load_note} if info.load_note else dict(info.extra)
    if experts is not None:
        extra["experts"] = experts
    measured.extra = extra
    if loaded.model is not None:
        measured.model_tensor_bytes = tensor_bytes(loaded.model)
    # how the report finds its BF16 base
    measured.lineage = LineageFacts(**lineage.evidence(info.model_path, spec.base_model))
    save_progress(measured, progress)  # the variant is known: a run killed from here on lands in its table

    if loaded.model is not None:  # a local model: media it has no input for is refused (a server says it itself)
        for record in records:
            refuse_unread_media(record.request, loaded.engine.modalities, where=f"record {record.id}: ")
    # A remote backend (no model here) is timed by the wall clock: CUDA events would time this GPU, idle.
    kernel = planned_kernel(loaded)
    energy = EnergyMeter.for_run(device, machine.nvml_index, loaded.model is not None, loaded.engine.synchronize)
    _answer_suite(loaded, records, Timer(device if loaded.model is not None else "cpu"), spec, out, energy)
    measured.energy = EnergyFacts(**vars(energy.figures))
    extra["energy"] = energy.extra()
    kernel, ran = kernel_ran(loaded, kernel, device)  # what ran, not only what was planned
    extra.update(ran)
    measured.kernel_path = str(kernel)
    measured.memory = MemoryFacts(**vars(mem.finish()))


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Be killed (SIGKILL) the moment the parent `quantbench` process dies, however it dies.

    The runner starts this process in a session of its own (so a timeout can kill its whole group), which also
    means no terminal hang-up or group signal reaches it: without this, a killed parent leaves it computing (and
    holding GPU memory) with nobody to store its result. The parent passes its pid: a parent that died before the
    prctl (this process imports for seconds first) is caught by comparing it with the current parent."""
    expected = int(os.environ.get("QUANTBENCH_PARENT_PID", "0") or 0)
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            console.print(f"[yellow]warning:[/] prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()}): "
                          "this run will not stop by itself if quantbench is killed")
    if expected and os.getppid() != expected:
        os._exit(1)  # the parent is already gone: nobody would store this run
    if not sys.platform.startswith("linux") and expected:  # no prctl: watch the parent instead

        def watch() -> None:
            while os.getppid() == expected:
                time.sleep(0.5)
            os.killpg(0, signal.SIGKILL)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    die_with_parent()
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    with open(result_path.with_suffix(".faulthandler"), "w") as fh:
        faulthandler.enable(file=fh)  # a segfault in a kernel still leaves a Python traceback for the row
        spec = RunSpec.from_dict(json.loads(spec_path.read_text()))
        out: dict[str, Any] = {"run": Measured(), "answers": [], "latencies": []}
        try:
            run(spec, out, progress_file(result_path))
            result = {"run": out["run"].model_dump(), "status": "ok",
                      "answers": [a.model_dump() for a in out["answers"]],
                      "latencies": [lat.model_dump() for lat in out["latencies"]]}
            code = 0
        except BaseException as exc:  # every failure becomes a `failed` row, never a lost run
            # Keep what identifies the run (machine, suite, variant); drop partial answers: no half-written runs.
            result = {"run": out["run"].model_dump(), "status": "failed", "failure": classify(exc),
                      "error": f"{type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))}
            console.print(f"[red]run failed ({result['failure']}):[/] {type(exc).__name__}: {exc}")
            code = 1
        if not write_result(json.dumps(result, default=str), result_path):
            code = 1
    return code


def write_result(text: str, result_path: Path) -> bool:
    """Write the result where the parent reads it (quantbench.run.record.result_files), whole or not at all
    (aside, then renamed); False, having said why, where no place could hold it. Before, a full temporary disk
    lost a finished run: an OSError traceback and a row saying the child "died (exit status 1)"."""
    for path in result_files(result_path):
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            tmp.replace(path)  # the parent sees a whole result file or none
            if path != result_path:
                console.print(f"the run's result went to {path} instead (the parent reads it there)")
            return True
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            console.print(f"[red]cannot write the run's result to {path}:[/] {e.strerror or e}")
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
