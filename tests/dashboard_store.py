"""A small results store for the dashboard's tests and screenshots: made-up figures, real store rows.

Three machines (a CPU host, an NVIDIA H200, an RTX PRO 6000 Blackwell), one model and suite, the variants
bf16 (reference), bf16 under the eager kernel (noise floor), int4, nvfp4-packed and fp8, one failed run (out of
memory) and one run on synthetic weights (a second model id). Every candidate's answers are the reference's with
a chosen number of top answers flipped, so agreement is known exactly: 1 - flips / N_QUESTIONS.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store
from quantbench.store.load import LoadRunRecord, LoadStepRecord, write_load

MODEL = "teststore/moe-a3b"
SYNTHETIC_MODEL = "teststore/synthetic-moe-a3b"
SUITE = ("default", "suitehash0001")
N_QUESTIONS = 200
N_LATENCY = 40  # extra timed decisions in the latency phase
OPTIONS = ["A", "B", "C", "D"]
BENCHMARKS = ["nli", "arith", "tool_choice", "safety"]
GIB = 1 << 30

H200 = {"device": "cuda:0", "gpu_name": "NVIDIA H200", "gpu_family": "hopper", "gpu_cc": "9.0", "gpu_sm_count": 132,
        "gpu_memory_bytes": 141 * 10**9, "driver_version": "580.95.05", "cuda_version": "13.0", "host": "h200-box"}
BLACKWELL = {"device": "cuda:0", "gpu_name": "NVIDIA RTX PRO 6000 Blackwell", "gpu_family": "blackwell",
             "gpu_cc": "12.0", "gpu_sm_count": 188, "gpu_memory_bytes": 97 * 10**9, "driver_version": "580.95.05",
             "cuda_version": "13.0", "host": "rtx-box"}
CPU = {"device": "cpu", "gpu_name": None, "gpu_family": "cpu", "host": "ci-runner"}

# (machine, backend, variant, kernel, format, native, role, flips, p50 ms, weights GiB, disk GB)
VARIANTS: list[tuple] = [
    (H200, "bf16", "bf16", "grouped_mm", "bf16", "native", "reference", 0, 85.0, 56.9, 61.1),
    (H200, "bf16", "bf16", "eager", "bf16", "native", "noise_floor", 5, 630.0, 56.9, 61.1),
    (H200, "int4", "int4", "grouped_int4", "int4-g128", "native", "candidate", 5, 62.0, 16.4, 16.9),
    (H200, "nvfp4", "nvfp4-packed", "dequant_w4a16", "nvfp4", "emulated", "candidate", 18, 98.0, 17.6, 18.2),
    (H200, "fp8", "fp8", "fp8_blockwise", "fp8-e4m3", "native", "candidate", 3, 70.0, 29.8, 31.0),
    (BLACKWELL, "bf16", "bf16", "grouped_mm", "bf16", "native", "reference", 0, 120.0, 56.9, 61.1),
    (BLACKWELL, "int4", "int4", "grouped_int4", "int4-g128", "native", "candidate", 13, 78.0, 16.4, 16.9),
    (BLACKWELL, "nvfp4", "nvfp4-packed", "nvfp4_native", "nvfp4", "native", "candidate", 8, 66.0, 17.6, 18.2),
    (BLACKWELL, "fp8", "fp8", "fp8_blockwise", "fp8-e4m3", "native", "candidate", 4, 81.0, 29.8, 31.0),
    (CPU, "bf16", "bf16", "grouped_mm", "bf16", None, "reference", 0, 9.0, 0.05, 0.05),
    (CPU, "bf16", "bf16", "eager", "bf16", None, "noise_floor", 2, 14.0, 0.05, 0.05),
    (CPU, "int4", "int4", "dequant_bf16", "int4-g128", "emulated", "candidate", 6, 11.0, 0.02, 0.02),
]


def _t(minutes: int) -> dt.datetime:
    return dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.UTC) + dt.timedelta(minutes=minutes)


def reference_answers(seed: int = 0) -> list[dict[str, Any]]:
    """N_QUESTIONS answers with confident and near-tie questions; gold on three of the four benchmarks."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(N_QUESTIONS):
        bench = BENCHMARKS[i % len(BENCHMARKS)]
        probs = rng.dirichlet(np.full(len(OPTIONS), 0.6 if i % 3 else 3.0))
        top = OPTIONS[int(np.argmax(probs))]
        gold = None if bench == "tool_choice" else (top if rng.random() < 0.7 else OPTIONS[int(rng.integers(4))])
        rows.append({"record_id": f"{bench}-{i:03d}", "benchmark": bench, "question": f"{bench} question {i}: pick",
                     "options": OPTIONS, "probs": [float(p) for p in probs], "top": top, "gold": gold,
                     "method": "label_logit", "truncated": False})
    return rows


def candidate_answers(reference: list[dict[str, Any]], flips: int, seed: int) -> list[dict[str, Any]]:
    """The reference's answers slightly perturbed, with exactly `flips` top answers swapped to the runner-up
    (on the nearest ties first, where a different kernel flips first)."""
    rng = np.random.default_rng(seed)
    margins = [sorted(a["probs"])[-1] - sorted(a["probs"])[-2] for a in reference]
    flip = set(np.argsort(margins, kind="stable")[:flips].tolist())
    out = []
    for i, a in enumerate(reference):
        exact = np.asarray(a["probs"])
        order = np.argsort(exact)[::-1]
        want = OPTIONS[int(order[1])] if i in flip else a["top"]
        if i in flip:
            exact = exact.copy()
            exact[order[0]], exact[order[1]] = exact[order[1]] - 0.005, exact[order[0]] + 0.005
        noisy = np.clip(exact * np.exp(rng.normal(0, 0.03, exact.size)), 1e-6, None)
        noisy = noisy / noisy.sum()
        p = noisy if OPTIONS[int(np.argmax(noisy))] == want else exact  # the noise must not add or undo a flip
        out.append({**a, "probs": [float(x) for x in p], "top": want})
    return out


def latencies(p50: float, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    rows = []
    for seq in range(N_QUESTIONS + N_LATENCY):
        phase = "suite" if seq < N_QUESTIONS else "latency"
        rows.append({"seq": seq, "phase": phase, "record_id": f"r{seq % N_QUESTIONS:03d}",
                     "model_ms": float(p50 * rng.lognormal(0, 0.12)), "prep_ms": float(rng.uniform(0.3, 0.9)),
                     "tokens": int(rng.integers(300, 520)), "batch": 1})
    return rows


def run_row(machine: dict[str, Any], minutes: int, **kw: Any) -> dict[str, Any]:
    row = {"run_id": str(uuid7()), "status": "ok", "created_at": _t(minutes), "finished_at": _t(minutes + 3),
           "model_id": MODEL, "weights": "trained", "suite_id": SUITE[0], "suite_hash": SUITE[1],
           "tokenizer_hash": "tok0001", "n_records": N_QUESTIONS, "n_questions": N_QUESTIONS, "os": "Linux",
           "python_version": "3.12.3", "torch_version": "2.11.0", "transformers_version": "5.17.0",
           "auto_round_version": "0.16.1", "modelopt_version": "0.47.0", "quantbench_version": "0.1.0",
           "quantbench_git_rev": "89e0127", "compute_dtype": "bfloat16", **machine}
    row.update(kw)
    return row


def _memory(machine: dict[str, Any], weights_gib: float, disk_gb: float) -> dict[str, Any]:
    weights = int(weights_gib * GIB)
    if machine is CPU:
        return {"model_tensor_bytes": weights, "host_rss_peak_bytes": weights + int(1.4 * GIB),
                "disk_bytes": int(disk_gb * 10**9)}
    return {"mem_weights_bytes": weights, "mem_peak_allocated_bytes": weights + int(2.1 * GIB),
            "mem_peak_reserved_bytes": weights + int(3.0 * GIB), "mem_nvml_peak_bytes": weights + int(3.6 * GIB),
            "experts_bytes": int(weights * 0.93), "disk_bytes": int(disk_gb * 10**9)}


POWER_W = {"NVIDIA H200": (450.0, 120.0), "NVIDIA RTX PRO 6000 Blackwell": (520.0, 90.0)}  # (busy, idle)


def _energy(machine: dict[str, Any], variant: str, p50: float) -> dict[str, Any]:
    """GPU energy of the timed phase (made-up power, the decisions' time); none on a CPU, and none for the H200's
    nvfp4-packed run, whose phase was too short (as quantbench.run.energy stores it)."""
    if machine is CPU:
        return {}
    if machine is H200 and variant == "nvfp4-packed":
        return {"energy_phase_s": 1.6, "energy_decisions": N_QUESTIONS + N_LATENCY,
                "extra": {"energy": {"note": "not measured: the timed phase took 1.60 s, under the 2 s the energy "
                                             "counter needs (it updates every ~20-100 ms); raise --latency-min-seconds"}}}
    busy, idle = POWER_W[machine["gpu_name"]]
    n = N_QUESTIONS + N_LATENCY
    phase_s = n * p50 / 1e3 * 1.05  # the forward passes and the gaps between them
    return {"energy_j_per_decision": busy * phase_s / n, "energy_mean_w": busy, "energy_phase_s": phase_s,
            "energy_decisions": n, "energy_idle_w": idle}


def build(path: str | Path) -> Store:
    """Write the whole test store at `path` (which must not exist) and return it."""
    store = Store(path)
    ref = reference_answers()
    for i, (machine, backend, variant, kernel, fmt, native, role, flips, p50, weights, disk) in enumerate(VARIANTS):
        answers = ref if flips == 0 else candidate_answers(ref, flips, seed=100 + i)
        run = run_row(machine, 10 * i, backend=backend, variant=variant, kernel_path=kernel, weight_format=fmt,
                      native=native, role=role, load_s=round(4 + weights / 3, 2), cold_ms=p50 * 7.5,
                      **_memory(machine, weights, disk), **_energy(machine, variant, p50))
        store.write_run(RunResult(run=run, answers=answers, latencies=latencies(p50, seed=200 + i)))
    # BF16 under the batched_mm kernel needs ~93 GiB on top of the weights: out of memory on the 96 GB card.
    store.write_run(RunResult(run=run_row(
        BLACKWELL, 200, status="failed", failure="oom", backend="bf16", variant="bf16", kernel_path="batched_mm",
        weight_format="bf16", native="native", role="candidate", n_records=None, n_questions=None,
        error="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity "
              "of 94.97 GiB of which 1.12 GiB is free.\n\nTraceback (most recent call last):\n  ...")))
    # The 30B-A3B shape with random weights: speed and memory only.
    store.write_run(RunResult(
        run=run_row(H200, 210, model_id=SYNTHETIC_MODEL, weights="synthetic", backend="bf16", variant="bf16",
                    kernel_path="grouped_mm", weight_format="bf16", native="native", role="reference",
                    load_s=0.8, cold_ms=640.0, **_memory(H200, 56.9, 0.0)),
        answers=candidate_answers(ref, 0, seed=7), latencies=latencies(85.0, seed=300)))
    return store


BATCHED_SUITE = ("s64", "suitehash0064")  # a suite the H200 ran only batched (`run --concurrency N`)
BATCHED_MODEL = "teststore/batched-only-moe"  # a model whose every run is batched
# (model, suite, variant, kernel, decisions a pass, ms a pass, weights GiB)
BATCHED: list[tuple] = [
    (MODEL, BATCHED_SUITE, "int4", "grouped_int4", 16, 112.0, 16.4),
    (MODEL, BATCHED_SUITE, "int4", "grouped_int4", 32, 220.0, 16.4),
    (MODEL, BATCHED_SUITE, "fp8", "fp8_blockwise", 16, 131.0, 29.8),
    (BATCHED_MODEL, SUITE, "int4", "grouped_int4", 16, 112.0, 16.4),
]


def add_batched_only(store: Store, minutes: int = 400) -> list[str]:
    """Groups with only batched runs on the H200: the test model on BATCHED_SUITE, and BATCHED_MODEL on the usual
    suite. Each latency row is a decision timed by its whole pass, as a batched run stores it."""
    ids = []
    for i, (model, suite, variant, kernel, batch, pass_ms, weights) in enumerate(BATCHED):
        lat = [{**row, "batch": batch} for row in latencies(pass_ms, seed=500 + i)]
        energy = {"energy_j_per_decision": 450.0 * pass_ms / 1e3 / batch, "energy_mean_w": 450.0,
                  "energy_phase_s": 3.0, "energy_decisions": len(lat), "energy_idle_w": 120.0}
        run = run_row(H200, minutes + 10 * i, model_id=model, suite_id=suite[0], suite_hash=suite[1],
                      backend=variant, variant=variant, kernel_path=kernel, weight_format=variant, native="native",
                      role="candidate", **_memory(H200, weights, weights), **energy)
        ids.append(store.write_run(RunResult(run=run, answers=candidate_answers(reference_answers(), 3, seed=600 + i),
                                             latencies=lat)))
    return ids


def append_run(store: Store, minutes: int = 300) -> str:
    """One more run, as a concurrent `quantbench run` would write it."""
    return store.write_run(RunResult(
        run=run_row(CPU, minutes, backend="fp8", variant="fp8", kernel_path="dequant_bf16", weight_format="fp8-e4m3",
                    native="emulated", role="candidate", **_memory(CPU, 0.03, 0.03)),
        answers=candidate_answers(reference_answers(), 4, seed=9), latencies=latencies(10.0, seed=9)))


def build_only_failed(path: str | Path) -> Store:
    store = Store(path)
    store.write_run(RunResult(run=run_row(H200, 0, status="failed", failure="load_error", backend="int4",
                                          variant="int4", error="LoadError: experts.0.gate_proj.qweight missing")))
    return store


def build_empty(path: str | Path) -> Store:
    store = Store(path)
    store.migrate()
    return store


def build_old_schema(path: str | Path) -> Store:
    """A store left at schema version 1 with one run, as an older quantbench wrote it."""
    store = Store(path)
    store.migrate(target=1)
    con = duckdb.connect(str(path))
    try:
        con.execute("INSERT INTO runs (run_id, status, created_at, backend) VALUES (?, 'ok', now(), 'bf16')",
                    [str(uuid7())])
    finally:
        con.close()
    return store


# The INT4 load run on the H200: (clients, decisions/s, p50 ms, p99 ms) per step
LOAD_STEPS = [(1, 56.3, 17.6, 20.1), (8, 71.6, 110.0, 120.0), (32, 95.1, 335.0, 372.0), (128, 66.1, 1263.0, 8307.0)]


def write_load_run(store: Store) -> str:
    """One `quantbench load` run against an INT4 server, as the load generator stores it."""
    now = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
    run = LoadRunRecord(created_at=now, finished_at=now, endpoint="http://127.0.0.1:8000", mode="closed",
                        requests_from="quantbench-default-v1", n_distinct_requests=364, server_model="synthetic",
                        server_variant="int4", server_kernel_path="quantbench grouped-moe gluon +cuda-graph",
                        server_gpu="NVIDIA H200", saturation=32.0, peak_decisions_per_s=95.1, host="h200-box")
    steps = [LoadStepRecord(step=i, concurrency=c, sent=500, ok=500, duration_s=500 / t, offered_per_s=t,
                            decisions_per_s=t, p50_ms=p50, p99_ms=p99, errors={"503": 238} if c == 128 else {})
             for i, (c, t, p50, p99) in enumerate(LOAD_STEPS)]
    return write_load(store, run, steps)


def build_only_load(path: str | Path) -> Store:
    """A store that `quantbench load` wrote to and no `quantbench run` ever did."""
    store = build_empty(path)
    write_load_run(store)
    return store
