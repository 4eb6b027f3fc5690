"""Parity of one run against a reference: which runs to compare, and the comparison itself.

The reference of a run is the latest successful BF16 run (`backend='bf16'`, not a noise floor) of the same model,
suite and GPU — the same GPU name, or for CPU runs the same host — preferring a run marked `--reference`, then a
bfloat16 one over a float32 run of the bf16 backend. Its noise floor is the latest `noise_floor` run
of that model, suite and GPU: BF16 under a second, equally valid kernel. Identical inputs are a precondition: the
same suite hash and tokenizer; anything else is refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from quantbench.analysis import significance as sig
from quantbench.analysis import stats as an
from quantbench.analysis.margins import Margins
from quantbench.analysis.significance import CellTests
from quantbench.analysis.stats import ParityError
from quantbench.models import lineage
from quantbench.protocol import MODALITIES
from quantbench.store import Store, queries
from quantbench.store.records import StoredRun


# -- runs ----------------------------------------------------------------------------------------------------
def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame of stored rows (load runs, sources: not runs, which are read as StoredRun) as dicts, with None
    (not NaN, NA or NaT) where a value is missing."""
    return [{k: (None if _missing(v) else v) for k, v in row.items()} for row in df.to_dict("records")]


def _missing(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # lists, dicts
        return False


def resolve_run(store: Store, run_id: str) -> StoredRun:
    """The run whose id is `run_id` or starts with it (the 13 characters the tables print are enough)."""
    key = run_id.strip().lower()
    found = queries.runs_by_id_prefix(store, key)
    if not found:
        raise ParityError(f"run {run_id!r}: no run with that id in {store.path}; `quantbench runs` lists the runs")
    if len(found) > 1:
        ids = ", ".join(r.run_id for r in found)
        raise ParityError(f"run {run_id!r} is ambiguous ({ids}); give more characters of the id")
    return found[0]


def load_answers(store: Store, run_id: str) -> pd.DataFrame:
    df = queries.answers(store, run_id)
    df["gold"] = df["gold"].astype(object).where(df["gold"].notna(), None)
    return df


def gpu_key(run: StoredRun) -> tuple[str, str]:
    """What "the same GPU" means: the GPU's name, or for a CPU run the machine it ran on: its host name, CPU model,
    logical CPUs and machine id (two VMs both called `vm` are two machines; a run stored before the machine id was
    recorded is known by what it has)."""
    if not run.is_cpu:
        return ("gpu", str(run.gpu_name))
    parts = [str(run.host)] + [str(v) for v in (run.cpu_model, run.cpu_cores, run.machine_id) if v is not None]
    return ("cpu", " | ".join(parts))


def machine_text(run: StoredRun) -> str:
    """A CPU machine in a few words: `vm: AMD EPYC, 2 CPUs, machine 3d1219c7`."""
    bits = [str(run.cpu_model)] if run.cpu_model is not None else []
    if run.cpu_cores is not None:
        bits.append(f"{int(run.cpu_cores)} CPUs")
    if run.machine_id is not None:
        bits.append(f"machine {str(run.machine_id)[:8]}")
    return f"{run.host}" + (f": {', '.join(bits)}" if bits else "")


def gpu_label(run: StoredRun) -> str:
    if run.is_cpu:
        return f"CPU ({machine_text(run)})"
    fam = run.gpu_family
    return f"{run.gpu_name} ({fam})" if fam else str(run.gpu_name)


def describe(run: StoredRun) -> str:
    """A run in one line: variant, kernel, id prefix."""
    return f"{run.variant or run.backend} [{run.kernel_path or '?'}] {run.run_id[:13]}"


def reference_rank(run: StoredRun) -> tuple:
    """Among eligible BF16 runs: one marked `--reference` first, then a bfloat16 one (not a float32 run of the
    bf16 backend), then the latest."""
    return (run.role == "reference", run.variant == "bf16", run.created_at)


def _best_matching(runs: list[StoredRun], like: StoredRun, rank, any_gpu: bool = False) -> StoredRun | None:
    same = [r for r in runs if gpu_key(r) == gpu_key(like)]
    pool = same or (runs if any_gpu else [])
    return max(pool, key=rank, default=None)


def find_reference(store: Store, run: StoredRun, any_gpu: bool = False) -> StoredRun | None:
    """The BF16 reference of a run: an ok `bf16`-backend run, not a noise floor, of the same model and suite on
    the same GPU (any GPU when `any_gpu` and none ran here, e.g. BF16 did not fit), ranked by `reference_rank`.
    A reference found by lineage says how (`paired_by`) and which base the run named (`paired_base`)."""
    ref = _best_matching(queries.bf16_reference_runs(store, run.model_id, run.suite_hash, run.run_id), run,
                         reference_rank, any_gpu)
    if ref is not None or run.backend == "bf16":
        return ref
    # A variant made elsewhere: the BF16 run of the base its evidence names or matches (quantbench.models.lineage).
    matches, how = lineage.pair(run, queries.bf16_trained_runs_of_suite(store, run.suite_hash))
    pool = [r for r in matches if gpu_key(r) == gpu_key(run)] or (matches if any_gpu else [])
    ref = max(pool, key=reference_rank, default=None)
    return None if ref is None else replace(ref, paired_by=how, paired_base=run.base_model)


def find_noise_floor(store: Store, reference: StoredRun) -> StoredRun | None:
    """The latest ok noise-floor run of the reference's model and suite on its GPU."""
    return _best_matching(queries.noise_floor_runs(store, reference.model_id, reference.suite_hash,
                                                   reference.run_id), reference, lambda r: r.created_at)


def check_comparable(cand: StoredRun, ref: StoredRun, allow_synthetic: bool = False) -> None:
    """Refuse comparisons whose answers would not mean what parity claims."""
    if cand.run_id == ref.run_id:
        raise ParityError(f"run {cand.run_id} is its own reference; pass --reference with another run")
    for name, run in (("candidate", cand), ("reference", ref)):
        if run.status != "ok":
            raise ParityError(f"{name} run {run.run_id} failed ({run.failure}): it has no answers to compare")
        if run.weights == "synthetic" and not allow_synthetic:
            raise ParityError(
                f"{name} run {run.run_id} has synthetic (random) weights: its answers say nothing about model "
                "quality, only speed and memory; compare runs of a trained model or a real checkpoint"
            )
    if cand.suite_hash != ref.suite_hash:
        raise ParityError(
            f"suite_hash differs (candidate {cand.suite_hash} on suite {cand.suite_id}, reference "
            f"{ref.suite_hash} on suite {ref.suite_id}): parity needs identical inputs; run both on the same suite"
        )
    tc, tr = cand.tokenizer_hash, ref.tokenizer_hash
    if tc and tr and tc != tr:
        raise ParityError(
            f"tokenizer_hash differs (candidate {tc}, reference {tr}): the prompts were tokenized differently, so the "
            "inputs are not identical; quantize the candidate from the reference's checkpoint with its tokenizer"
        )
    # The tensors quantization leaves alone (embeddings, norms, router; quantbench.models.lineage) differ: the
    # candidate was made from other BF16 weights (another build of a model id that once did not name its weights),
    # so its flips measure the other model, not the quantization. A variant of the H200 store read `worse`.
    sc, sr = cand.shared_tensors_hash, ref.shared_tensors_hash
    if sc and sr and sc != sr:
        raise ParityError(
            f"shared tensors differ (candidate {sc[:12]}, reference {sr[:12]}): the candidate's embeddings, norms and "
            "router weights are not the reference's, so it was not made from these BF16 weights; run BF16 from the "
            "checkpoint it was quantized from, or quantize it again from this one"
        )


# -- the comparison ------------------------------------------------------------------------------------------
@dataclass
class FloorStats:
    run: StoredRun
    agreement: an.Agreement
    tv: an.Dist
    tv_ci: an.MeanCI
    per_question: pd.DataFrame | None = None  # pair(reference, floor): the verdict pairs it with the candidate's


@dataclass
class Comparison:
    candidate: StoredRun
    reference: StoredRun
    reference_how: str  # given | same GPU | other GPU
    per_question: pd.DataFrame
    n_candidate_only: int
    n_reference_only: int
    agreement: an.Agreement
    tv: an.Dist
    tv_ci: an.MeanCI
    kl: an.Dist
    dp: an.Dist
    flips: an.Flips
    buckets: pd.DataFrame
    accuracy: pd.DataFrame  # per benchmark: n_gold / accuracy of each run on every question it answered
    paired: an.PairedAccuracy
    floor: FloorStats | None
    verdict: an.Verdict
    notes: list[str] = field(default_factory=list)
    modalities: list[ModalityParity] = field(default_factory=list)  # one per modality present, in MODALITIES order
    tests: CellTests | None = None  # McNemar, TOST, MDD, TV / KL tails, flips by BF16's margin (the whole)

    def cells(self) -> list[CellTests]:
        """The cells this comparison puts in a report: one per modality when there are several, else the whole."""
        if self.per_modality:
            return [m.tests for m in self.modalities if m.tests is not None]
        return [self.tests] if self.tests is not None else []

    @property
    def per_modality(self) -> bool:
        """More than one modality among the questions: the figures and verdicts per modality say more than the
        overall ones (a tower broken on pictures hides among text questions)."""
        return len(self.modalities) > 1

    def flagged(self) -> list[ModalityParity]:
        """The modalities on which the variant is `worse` (beyond the margin), whatever the overall verdict."""
        return [m for m in self.modalities if m.verdict.label == an.WORSE]

    def verdict_short(self) -> str:
        """The verdict for a table cell: the overall one, or with several modalities the pooled one (what the
        recommendation reads) and then each modality's (`all: different, within margin; text: indistinguishable;
        image: inconclusive`): a cell of the modalities alone read as contradicting the notes' pooled verdict."""
        if not self.per_modality:
            return self.verdict.short()
        return "; ".join([f"all: {self.verdict.short()}"] + [f"{m.modality}: {m.verdict.short()}"
                                                              for m in self.modalities])

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-question table, JSON-ready."""
        keep = ("run_id", "variant", "backend", "kernel_path", "weight_format", "model_id", "suite_id", "suite_hash",
                "gpu_name", "gpu_family", "host", "device", "role", "created_at")
        brief = lambda run: {k: str(getattr(run, k)) if k in ("run_id", "created_at") else getattr(run, k)  # noqa: E731
                             for k in keep}
        return clean_json({
            "candidate": brief(self.candidate), "reference": brief(self.reference),
            "reference_how": self.reference_how, "n_candidate_only": self.n_candidate_only,
            "n_reference_only": self.n_reference_only, "agreement": asdict(self.agreement), "tv": asdict(self.tv),
            "tv_mean_ci": asdict(self.tv_ci), "kl": asdict(self.kl), "dp": asdict(self.dp), "flips": asdict(self.flips),
            "buckets": self.buckets.to_dict("records"), "accuracy": self.accuracy.to_dict("records"),
            "paired_accuracy": self.paired.by_benchmark.to_dict("records"),
            "paired_accuracy_mean": asdict(self.paired.mean) if self.paired.mean else None,
            "noise_floor": None if self.floor is None else {
                "run": brief(self.floor.run), "agreement": asdict(self.floor.agreement), "tv": asdict(self.floor.tv),
                "tv_mean_ci": asdict(self.floor.tv_ci)},
            "verdict": self.verdict.label, "verdict_reasons": list(self.verdict.reasons),
            "verdict_margins": asdict(self.verdict.margins) if self.verdict.margins else None,
            "verdict_excess": [asdict(p) for p in self.verdict.parts],
            "verdict_n_needed": self.verdict.n_needed, "notes": self.notes,
            "modalities": by_modality(self).to_dict("records"),
            "worse_on": [m.modality for m in self.flagged()],
            "tests": self.tests.as_dict() if self.tests else None,
            "tests_by_modality": {m.modality: m.tests.as_dict() for m in self.modalities if m.tests},
        })


@dataclass
class ModalityParity:
    """Parity on the questions of one modality (quantbench.protocol.modality_of): the same figures and the same
    verdict rule as the whole comparison, on that subset, with the noise floor's figures on the same questions."""

    modality: str
    agreement: an.Agreement
    tv_ci: an.MeanCI
    flips: an.Flips
    paired: an.PairedAccuracy
    verdict: an.Verdict
    floor_agreement: an.Agreement | None = None
    floor_tv_ci: an.MeanCI | None = None
    tests: CellTests | None = None  # McNemar, TOST, MDD, TV / KL tails and flips on this modality's questions


def _modality_rank(modality: str) -> tuple[int, str]:
    return (MODALITIES.index(modality) if modality in MODALITIES else len(MODALITIES), modality)


def modality_parity(paired: pd.DataFrame, floor: pd.DataFrame | None, margins: Margins | None = None,
                    seed: int = 0) -> list[ModalityParity]:
    """Per modality: agreement (Wilson), mean TV (bootstrap), flips, paired Δ accuracy (bootstrap) and the verdict
    against the floor on the same questions (stats.parity_verdict on the subset)."""
    modality = paired["modality"] if "modality" in paired else pd.Series("text", index=paired.index)
    out = []
    for key in sorted(modality.fillna("text").unique(), key=_modality_rank):
        sub = paired[modality.fillna("text") == key]
        fpair = None if floor is None else floor.merge(sub[["record_id", "question"]], on=["record_id", "question"])
        verdict = an.parity_verdict(sub, floor, margins, seed)
        out.append(ModalityParity(
            modality=str(key), agreement=an.agreement(sub), tv_ci=an.bootstrap_mean(sub["tv"], seed),
            flips=an.flips(sub), paired=an.paired_accuracy(sub, seed), verdict=verdict,
            floor_agreement=None if fpair is None or fpair.empty else an.agreement(fpair),
            floor_tv_ci=None if fpair is None or fpair.empty else an.bootstrap_mean(fpair["tv"], seed),
            tests=sig.cell_tests(sub, verdict),
        ))
    return out


MODALITY_COLUMNS = ["modality", "n", "agreement", "agreement_lo", "agreement_hi", "tv_mean", "tv_lo", "tv_hi",
                    "n_gold", "flips_right_to_wrong", "flips_wrong_to_right", "delta_accuracy", "delta_accuracy_lo",
                    "delta_accuracy_hi", "floor_agreement", "floor_tv_mean", "verdict", "verdict_short",
                    "verdict_n_needed", "verdict_reasons", *sig.FLAT_COLUMNS]


def by_modality(comparison: Comparison) -> pd.DataFrame:
    """The comparison per modality, one row each (the report, `compare --format json` and the dashboard share it):
    modality, n, agreement with its Wilson interval, mean TV with its bootstrap interval, flips on gold, paired
    Δ accuracy with its bootstrap interval (fractions, not points), the noise floor's agreement and TV on the same
    questions, and the verdict."""
    rows = []
    for m in comparison.modalities:
        d = m.paired.mean
        rows.append({
            "modality": m.modality, "n": m.agreement.n, "agreement": m.agreement.rate, "agreement_lo": m.agreement.lo,
            "agreement_hi": m.agreement.hi, "tv_mean": m.tv_ci.mean, "tv_lo": m.tv_ci.lo, "tv_hi": m.tv_ci.hi,
            "n_gold": m.flips.n_gold, "flips_right_to_wrong": m.flips.ref_right_cand_wrong,
            "flips_wrong_to_right": m.flips.ref_wrong_cand_right,
            "delta_accuracy": d.mean if d else None, "delta_accuracy_lo": d.lo if d else None,
            "delta_accuracy_hi": d.hi if d else None,
            "floor_agreement": m.floor_agreement.rate if m.floor_agreement else None,
            "floor_tv_mean": m.floor_tv_ci.mean if m.floor_tv_ci else None,
            "verdict": m.verdict.label, "verdict_short": m.verdict.short(), "verdict_n_needed": m.verdict.n_needed,
            "verdict_reasons": list(m.verdict.reasons), **sig.flat_columns(m.tests),
        })
    return pd.DataFrame(rows, columns=MODALITY_COLUMNS)


def modality_counts(answers: pd.DataFrame) -> dict[str, int]:
    """Questions per modality of one run's answers, in MODALITIES order."""
    if answers.empty:
        return {}
    counts = (answers["modality"].fillna("text") if "modality" in answers else pd.Series("text", index=answers.index)
              ).value_counts()
    return {str(k): int(counts[k]) for k in sorted(counts.index, key=_modality_rank)}


def coverage_text(counts: dict[str, int]) -> str:
    """Which modalities the figures cover, in questions: `text 436; image 40, audio 30, video 20`."""
    text = f"text {counts['text']}" if "text" in counts else ""
    media = ", ".join(f"{k} {n}" for k, n in counts.items() if k != "text")
    return "; ".join(p for p in (text, media) if p) or "no questions"


def clean_json(obj: Any) -> Any:
    """NaN → None, numpy scalars → Python, so json.dumps writes valid JSON."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, str):
        obj = obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def _accuracy_table(ref_answers: pd.DataFrame, cand_answers: pd.DataFrame) -> pd.DataFrame:
    r = an.accuracy_by_benchmark(ref_answers).rename(columns={"n_gold": "n_ref", "correct": "correct_ref",
                                                               "accuracy": "acc_ref"})
    c = an.accuracy_by_benchmark(cand_answers).rename(columns={"n_gold": "n_cand", "correct": "correct_cand",
                                                                "accuracy": "acc_cand"})
    return r.merge(c, on="benchmark", how="outer").sort_values("benchmark").reset_index(drop=True)


def floor_stats(ref: StoredRun, ref_answers: pd.DataFrame, floor: StoredRun, floor_answers: pd.DataFrame,
                seed: int = 0, allow_synthetic: bool = False) -> FloorStats:
    """The noise floor: how far the reference moves under a second, equally valid kernel."""
    check_comparable(floor, ref, allow_synthetic)
    fp = an.pair(ref_answers, floor_answers)
    if fp.empty:
        raise ParityError(f"noise-floor run {floor.run_id} answered no question in common with the reference")
    return FloorStats(floor, an.agreement(fp), an.distribution(fp["tv"]), an.bootstrap_mean(fp["tv"], seed), fp)


def floor_note(floor: FloorStats | None, margins: Margins | None = None) -> str | None:
    if floor is None or floor.tv.max > 0:
        return None
    return (f"the noise-floor run answered exactly as the reference (TV 0 on all {floor.tv.n} questions): here the "
            "second kernel adds no noise, so the verdict rests on the stated margins "
            f"({(margins or Margins()).describe()})")


def compare_loaded(cand: StoredRun, cand_answers: pd.DataFrame, ref: StoredRun, ref_answers: pd.DataFrame,
                   floor: FloorStats | None = None, *, reference_how: str = "given", seed: int = 0,
                   allow_synthetic: bool = False, margins: Margins | None = None) -> Comparison:
    """The comparison of runs already loaded (the report reuses the reference's answers and floor across rows)."""
    check_comparable(cand, ref, allow_synthetic)
    paired = an.pair(ref_answers, cand_answers)
    if paired.empty:
        raise ParityError(
            f"runs {cand.run_id} and {ref.run_id} answered no question in common (record_id + question); "
            "run both on the same suite and the same --limit"
        )
    keys = ["record_id", "question"]
    n_both = len(paired)
    notes = []
    if cand.weights == "synthetic" or ref.weights == "synthetic":
        notes.append("synthetic (random) weights: numerical parity of the kernels only, not model quality")
    if gpu_key(ref) != gpu_key(cand):
        notes.append(f"reference ran on {gpu_label(ref)}, the candidate on {gpu_label(cand)}")
    if floor_note(floor, margins):
        notes.append(floor_note(floor, margins))
    tv_ci = an.bootstrap_mean(paired["tv"], seed)
    agree = an.agreement(paired)
    floor_pq = floor.per_question if floor else None
    verdict = an.parity_verdict(paired, floor_pq, margins, seed)
    paired_acc = an.paired_accuracy(paired, seed)
    modalities = paired["modality"].fillna("text").unique() if "modality" in paired else ["text"]
    tests = sig.cell_tests(paired, verdict)
    if len(modalities) == 1:  # one modality: its figures are the whole comparison's (no second bootstrap)
        fpair = None if floor_pq is None else floor_pq.merge(paired[keys], on=keys)
        by_modality_ = [ModalityParity(
            str(modalities[0]), agree, tv_ci, an.flips(paired), paired_acc, verdict,
            None if fpair is None or fpair.empty else an.agreement(fpair),
            None if fpair is None or fpair.empty else an.bootstrap_mean(fpair["tv"], seed), tests)]
    else:
        by_modality_ = modality_parity(paired, floor_pq, margins, seed)
    return Comparison(
        candidate=cand, reference=ref, reference_how=reference_how, per_question=paired,
        n_candidate_only=len(cand_answers.drop_duplicates(keys)) - n_both,
        n_reference_only=len(ref_answers.drop_duplicates(keys)) - n_both,
        agreement=agree, tv=an.distribution(paired["tv"]), tv_ci=tv_ci, kl=an.distribution(paired["kl"]),
        dp=an.distribution(paired["dp"]), flips=an.flips(paired), buckets=an.confidence_buckets(paired),
        accuracy=_accuracy_table(ref_answers, cand_answers), paired=paired_acc, floor=floor,
        verdict=verdict, notes=notes, modalities=by_modality_, tests=tests,
    )


def compare(store: Store, candidate_run_id: str, reference_run_id: str | None = None,
            noise_floor_run_id: str | None = None, *, seed: int = 0, allow_synthetic: bool = False,
            any_gpu_reference: bool = False, margins: Margins | None = None) -> Comparison:
    """Compare a run with its reference (default: the BF16 run of its model, suite and GPU) and noise floor."""
    cand = resolve_run(store, candidate_run_id)
    if cand.status != "ok":  # before looking for its reference: a failed run may not know its model
        first = str(cand.error or "").strip().splitlines()
        raise ParityError(f"run {cand.run_id} failed ({cand.failure or 'error'}"
                          + (f": {first[0][:200]}" if first else "") + "): it has no answers to compare; "
                          "`quantbench runs` lists the runs and which of them succeeded")
    if reference_run_id:
        ref, how = resolve_run(store, reference_run_id), "given"
    else:
        ref = find_reference(store, cand, any_gpu=any_gpu_reference)
        if ref is None:
            raise ParityError(
                f"no BF16 reference for run {cand.run_id}: no successful bf16 run of model {cand.model_id!r} "
                f"on suite {cand.suite_id!r} (hash {cand.suite_hash}) on {gpu_label(cand)}; run "
                "`quantbench run --backend bf16` with the same model and suite, or pass --reference RUN"
            )
        how = "same GPU" if gpu_key(ref) == gpu_key(cand) else "other GPU"
        if ref.paired_by:
            how += f"; paired with its base by {lineage.how_text(ref.paired_by, ref.paired_base)}"
    ref_answers = load_answers(store, ref.run_id)
    floor_run = resolve_run(store, noise_floor_run_id) if noise_floor_run_id else find_noise_floor(store, ref)
    floor = None
    if floor_run is not None:
        floor = floor_stats(ref, ref_answers, floor_run, load_answers(store, floor_run.run_id), seed,
                            allow_synthetic)
    comparison = compare_loaded(cand, load_answers(store, cand.run_id), ref, ref_answers, floor,
                                reference_how=how, seed=seed, allow_synthetic=allow_synthetic, margins=margins)
    sig.holm_adjust(comparison.cells())  # across this comparison's own cells (its modalities)
    return comparison
