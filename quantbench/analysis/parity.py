"""Parity of one run against a reference: which runs to compare, and the comparison itself.

The reference of a run is the latest successful BF16 run (`backend='bf16'`, not a noise floor) of the same model,
suite and GPU — the same GPU name, or for CPU runs the same host — preferring a run marked `--reference`, then a
bfloat16 one over a float32 run of the bf16 backend. Its noise floor is the latest `noise_floor` run
of that model, suite and GPU: BF16 under a second, equally valid kernel. Identical inputs are a precondition: the
same suite hash and tokenizer; anything else is refused with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from quantbench.analysis import stats as an
from quantbench.analysis.stats import ParityError
from quantbench.models import lineage
from quantbench.store import Store, queries


# -- runs ----------------------------------------------------------------------------------------------------
def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame of stored rows as dicts, with None (not NaN, NA or NaT) where a value is missing."""
    return [{k: (None if _missing(v) else v) for k, v in row.items()} for row in df.to_dict("records")]


def _missing(v: Any) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # lists, dicts
        return False


def resolve_run(store: Store, run_id: str) -> dict[str, Any]:
    """The run whose id is `run_id` or starts with it (the 13 characters the tables print are enough)."""
    key = run_id.strip().lower()
    df = queries.runs_by_id_prefix(store, key)
    if df.empty:
        raise ParityError(f"run {run_id!r}: no run with that id in {store.path}; `quantbench runs` lists the runs")
    if len(df) > 1:
        ids = ", ".join(df["run_id"].astype(str))
        raise ParityError(f"run {run_id!r} is ambiguous ({ids}); give more characters of the id")
    return records(df)[0]


def load_answers(store: Store, run_id: str) -> pd.DataFrame:
    df = queries.answers(store, run_id)
    df["gold"] = df["gold"].astype(object).where(df["gold"].notna(), None)
    return df


def is_cpu(run: dict[str, Any]) -> bool:
    return run.get("device") == "cpu" or not run.get("gpu_name")


def gpu_key(run: dict[str, Any]) -> tuple[str, str]:
    """What "the same GPU" means: the GPU's name, or for a CPU run the host it ran on."""
    return ("cpu", str(run.get("host"))) if is_cpu(run) else ("gpu", str(run["gpu_name"]))


def gpu_label(run: dict[str, Any]) -> str:
    if is_cpu(run):
        return f"CPU ({run.get('host')})"
    fam = run.get("gpu_family")
    return f"{run['gpu_name']} ({fam})" if fam else str(run["gpu_name"])


def spec_of(run: dict[str, Any]) -> dict[str, Any]:
    spec = run.get("spec")
    if isinstance(spec, str):
        return json.loads(spec)
    return spec or {}


def describe(run: dict[str, Any]) -> str:
    """A run in one line: variant, kernel, id prefix."""
    return f"{run.get('variant') or run.get('backend')} [{run.get('kernel_path') or '?'}] {str(run['run_id'])[:13]}"


def reference_rank(run: dict[str, Any]) -> tuple:
    """Among eligible BF16 runs: one marked `--reference` first, then a bfloat16 one (not a float32 run of the
    bf16 backend), then the latest."""
    return (run.get("role") == "reference", run.get("variant") == "bf16", run.get("created_at"))


def _best_matching(runs: list[dict[str, Any]], like: dict[str, Any], rank,
                   any_gpu: bool = False) -> dict[str, Any] | None:
    same = [r for r in runs if gpu_key(r) == gpu_key(like)]
    pool = same or (runs if any_gpu else [])
    return max(pool, key=rank, default=None)


def find_reference(store: Store, run: dict[str, Any], any_gpu: bool = False) -> dict[str, Any] | None:
    """The BF16 reference of a run: an ok `bf16`-backend run, not a noise floor, of the same model and suite on
    the same GPU (any GPU when `any_gpu` and none ran here, e.g. BF16 did not fit), ranked by `reference_rank`."""
    ref = _best_matching(
        records(queries.bf16_reference_runs(store, run.get("model_id"), run.get("suite_hash"), str(run["run_id"]))),
        run, reference_rank, any_gpu,
    )
    if ref is not None or run.get("backend") == "bf16":
        return ref
    # A variant made elsewhere: the BF16 run of the base its evidence names or matches (quantbench.models.lineage).
    bf16 = records(queries.bf16_trained_runs_of_suite(store, run.get("suite_hash")))
    matches, how = lineage.pair(run, bf16)
    pool = [r for r in matches if gpu_key(r) == gpu_key(run)] or (matches if any_gpu else [])
    ref = max(pool, key=reference_rank, default=None)
    return None if ref is None else {**ref, "paired_by": how, "paired_base": run.get("base_model")}


def find_noise_floor(store: Store, reference: dict[str, Any]) -> dict[str, Any] | None:
    """The latest ok noise-floor run of the reference's model and suite on its GPU."""
    return _best_matching(
        records(queries.noise_floor_runs(store, reference.get("model_id"), reference.get("suite_hash"),
                                         str(reference["run_id"]))),
        reference, lambda r: r.get("created_at"),
    )


def check_comparable(cand: dict[str, Any], ref: dict[str, Any], allow_synthetic: bool = False) -> None:
    """Refuse comparisons whose answers would not mean what parity claims."""
    if str(cand["run_id"]) == str(ref["run_id"]):
        raise ParityError(f"run {cand['run_id']} is its own reference; pass --reference with another run")
    for name, run in (("candidate", cand), ("reference", ref)):
        if run.get("status") != "ok":
            raise ParityError(f"{name} run {run['run_id']} failed ({run.get('failure')}): it has no answers to compare")
        if run.get("weights") == "synthetic" and not allow_synthetic:
            raise ParityError(
                f"{name} run {run['run_id']} has synthetic (random) weights: its answers say nothing about model "
                "quality, only speed and memory; compare runs of a trained model or a real checkpoint"
            )
    if cand.get("suite_hash") != ref.get("suite_hash"):
        raise ParityError(
            f"suite_hash differs (candidate {cand.get('suite_hash')} on suite {cand.get('suite_id')}, reference "
            f"{ref.get('suite_hash')} on suite {ref.get('suite_id')}): parity needs identical inputs; run both on the same suite"
        )
    tc, tr = cand.get("tokenizer_hash"), ref.get("tokenizer_hash")
    if tc and tr and tc != tr:
        raise ParityError(
            f"tokenizer_hash differs (candidate {tc}, reference {tr}): the prompts were tokenized differently, so the "
            "inputs are not identical; quantize the candidate from the reference's checkpoint with its tokenizer"
        )


# -- the comparison ------------------------------------------------------------------------------------------
@dataclass
class FloorStats:
    run: dict[str, Any]
    agreement: an.Agreement
    tv: an.Dist
    tv_ci: an.MeanCI
    per_question: pd.DataFrame | None = None  # pair(reference, floor): the verdict pairs it with the candidate's


@dataclass
class Comparison:
    candidate: dict[str, Any]
    reference: dict[str, Any]
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

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-question table, JSON-ready."""
        keep = ("run_id", "variant", "backend", "kernel_path", "weight_format", "model_id", "suite_id", "suite_hash",
                "gpu_name", "gpu_family", "host", "device", "role", "created_at")
        brief = lambda run: {k: str(run.get(k)) if k in ("run_id", "created_at") else run.get(k) for k in keep}  # noqa: E731
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
        })


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


def floor_stats(ref: dict[str, Any], ref_answers: pd.DataFrame, floor: dict[str, Any], floor_answers: pd.DataFrame,
                seed: int = 0, allow_synthetic: bool = False) -> FloorStats:
    """The noise floor: how far the reference moves under a second, equally valid kernel."""
    check_comparable(floor, ref, allow_synthetic)
    fp = an.pair(ref_answers, floor_answers)
    if fp.empty:
        raise ParityError(f"noise-floor run {floor['run_id']} answered no question in common with the reference")
    return FloorStats(floor, an.agreement(fp), an.distribution(fp["tv"]), an.bootstrap_mean(fp["tv"], seed), fp)


def floor_note(floor: FloorStats | None, margins: an.Margins | None = None) -> str | None:
    if floor is None or floor.tv.max > 0:
        return None
    return (f"the noise-floor run answered exactly as the reference (TV 0 on all {floor.tv.n} questions): here the "
            "second kernel adds no noise, so the verdict rests on the stated margins "
            f"({(margins or an.Margins()).describe()})")


def compare_loaded(cand: dict[str, Any], cand_answers: pd.DataFrame, ref: dict[str, Any], ref_answers: pd.DataFrame,
                   floor: FloorStats | None = None, *, reference_how: str = "given", seed: int = 0,
                   allow_synthetic: bool = False, margins: an.Margins | None = None) -> Comparison:
    """The comparison of runs already loaded (the report reuses the reference's answers and floor across rows)."""
    check_comparable(cand, ref, allow_synthetic)
    paired = an.pair(ref_answers, cand_answers)
    if paired.empty:
        raise ParityError(
            f"runs {cand['run_id']} and {ref['run_id']} answered no question in common (record_id + question); "
            "run both on the same suite and the same --limit"
        )
    keys = ["record_id", "question"]
    n_both = len(paired)
    notes = []
    if cand.get("weights") == "synthetic" or ref.get("weights") == "synthetic":
        notes.append("synthetic (random) weights: numerical parity of the kernels only, not model quality")
    if gpu_key(ref) != gpu_key(cand):
        notes.append(f"reference ran on {gpu_label(ref)}, the candidate on {gpu_label(cand)}")
    if floor_note(floor, margins):
        notes.append(floor_note(floor, margins))
    tv_ci = an.bootstrap_mean(paired["tv"], seed)
    agree = an.agreement(paired)
    return Comparison(
        candidate=cand, reference=ref, reference_how=reference_how, per_question=paired,
        n_candidate_only=len(cand_answers.drop_duplicates(keys)) - n_both,
        n_reference_only=len(ref_answers.drop_duplicates(keys)) - n_both,
        agreement=agree, tv=an.distribution(paired["tv"]), tv_ci=tv_ci, kl=an.distribution(paired["kl"]),
        dp=an.distribution(paired["dp"]), flips=an.flips(paired), buckets=an.confidence_buckets(paired),
        accuracy=_accuracy_table(ref_answers, cand_answers), paired=an.paired_accuracy(paired, seed), floor=floor,
        verdict=an.parity_verdict(paired, floor.per_question if floor else None, margins, seed),
        notes=notes,
    )


def compare(store: Store, candidate_run_id: str, reference_run_id: str | None = None,
            noise_floor_run_id: str | None = None, *, seed: int = 0, allow_synthetic: bool = False,
            any_gpu_reference: bool = False, margins: an.Margins | None = None) -> Comparison:
    """Compare a run with its reference (default: the BF16 run of its model, suite and GPU) and noise floor."""
    cand = resolve_run(store, candidate_run_id)
    if cand.get("status") != "ok":  # before looking for its reference: a failed run may not know its model
        first = str(cand.get("error") or "").strip().splitlines()
        raise ParityError(f"run {cand['run_id']} failed ({cand.get('failure') or 'error'}"
                          + (f": {first[0][:200]}" if first else "") + "): it has no answers to compare; "
                          "`quantbench runs` lists the runs and which of them succeeded")
    if reference_run_id:
        ref, how = resolve_run(store, reference_run_id), "given"
    else:
        ref = find_reference(store, cand, any_gpu=any_gpu_reference)
        if ref is None:
            raise ParityError(
                f"no BF16 reference for run {cand['run_id']}: no successful bf16 run of model {cand.get('model_id')!r} "
                f"on suite {cand.get('suite_id')!r} (hash {cand.get('suite_hash')}) on {gpu_label(cand)}; run "
                "`quantbench run --backend bf16` with the same model and suite, or pass --reference RUN"
            )
        how = "same GPU" if gpu_key(ref) == gpu_key(cand) else "other GPU"
        if ref.get("paired_by"):
            how += f"; paired with its base by {lineage.how_text(ref['paired_by'], ref.get('paired_base'))}"
    ref_answers = load_answers(store, str(ref["run_id"]))
    floor_run = resolve_run(store, noise_floor_run_id) if noise_floor_run_id else find_noise_floor(store, ref)
    floor = None
    if floor_run is not None:
        floor = floor_stats(ref, ref_answers, floor_run, load_answers(store, str(floor_run["run_id"])), seed,
                            allow_synthetic)
    return compare_loaded(cand, load_answers(store, str(cand["run_id"])), ref, ref_answers, floor,
                          reference_how=how, seed=seed, allow_synthetic=allow_synthetic, margins=margins)
