"""Parity of stored runs (`compare`) and the which-quant report, on hand-made runs in a temporary store."""

import datetime as dt
import io
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from quantbench import report
from quantbench.analysis import parity, recommend
from quantbench.analysis.margins import Margins
from quantbench.analysis.stats import ParityError
from quantbench.errors import ConfigError, QuantbenchError
from quantbench.report import Rules
from quantbench.run.record import RunResult, uuid7
from quantbench.store import Store

T0 = dt.datetime(2026, 11, 29, 12, tzinfo=dt.UTC)
MB = 1_000_000
GPU = dict(device="cuda:0", gpu_name="NVIDIA H200", gpu_family="hopper", host="gpu-box")


class Lab:
    """A store plus a fixed set of questions; variants are the reference's probabilities, perturbed."""

    def __init__(self, path, n=300, seed=0):
        self.store, self.t = Store(path), 0
        rng = np.random.default_rng(seed)
        self.questions = []
        for i in range(n):
            k = int(rng.integers(2, 5))
            self.questions.append((f"r{i:03d}", f"bench{i % 3}", [f"o{j}" for j in range(k)], rng.normal(0, 1.5, k)))

    def answers(self, noise=0.0, flatten=0.0, seed=1):
        """noise: on the logits (flips near-ties, like another kernel or a coarse quant); flatten: mix with
        uniform (keeps every top answer, as zeroed scales or a 2-bit quant might)."""
        rng, out = np.random.default_rng(seed), []
        for i, (rid, bench, opts, logits) in enumerate(self.questions):
            lg = logits + rng.normal(0, noise, len(logits)) if noise else logits
            p = np.exp(lg - lg.max())
            p = (1 - flatten) * p / p.sum() + flatten / len(p)
            gold = opts[int(np.argmax(logits))] if i % 4 else opts[-1]
            out.append(dict(record_id=rid, benchmark=bench, question="action", options=opts, probs=p.tolist(),
                            top=opts[int(np.argmax(p))], gold=gold, method="label_logit", truncated=False))
        return out

    def run(self, answers=None, ms=10.0, batch=1, **fields):
        self.t += 1
        row = dict(run_id=str(uuid7()), status="ok", created_at=T0 + dt.timedelta(minutes=self.t), backend="bf16",
                   variant="bf16", weight_format="bfloat16", kernel_path="transformers experts=grouped_mm",
                   model_id="tiny-moe", weights="trained", suite_id="builtin", suite_hash="s1", tokenizer_hash="t1",
                   device="cpu", gpu_family="cpu", host="box", role="candidate", disk_bytes=100 * MB,
                   model_tensor_bytes=50 * MB, host_rss_peak_bytes=900 * MB, host_rss_peak_source="vmhwm")
        row.update(fields)
        lat = [dict(seq=i, phase="suite", record_id="r000", model_ms=ms + 0.1 * i, prep_ms=0.5, tokens=90, batch=batch)
               for i in range(10)]
        ok = row["status"] == "ok"
        return self.store.write_run(RunResult(row, (self.answers() if answers is None else answers) if ok else [],
                                              lat if ok else []))


def build_cpu_lab(path):
    """BF16 reference, its noise floor, and three quants: close to BF16, flattened, and answer-flipping."""
    lab = Lab(path)
    ids = {
        "bf16": lab.run(ms=14),
        "floor": lab.run(lab.answers(noise=0.05), kernel_path="transformers experts=eager", role="noise_floor"),
        "int4": lab.run(lab.answers(noise=0.04, seed=5), ms=30, backend="int4", variant="int4",
                        weight_format="int4 w4a16 g128", kernel_path="quantbench grouped", native="native",
                        model_tensor_bytes=20 * MB, host_rss_peak_bytes=400 * MB),
        "nvfp4": lab.run(lab.answers(flatten=0.5), ms=40, backend="nvfp4", variant="nvfp4-packed",
                         weight_format="nvfp4 w4a4 g16", kernel_path="quantbench grouped", native="emulated",
                         model_tensor_bytes=25 * MB, host_rss_peak_bytes=500 * MB),
        "int2": lab.run(lab.answers(noise=1.5, seed=9), ms=20, backend="int4", variant="int2",
                        weight_format="int2", kernel_path="quantbench grouped", native="native",
                        model_tensor_bytes=10 * MB, host_rss_peak_bytes=300 * MB),
    }
    return lab, ids


@pytest.fixture(scope="module")
def cpu_lab_template(tmp_path_factory):
    return build_cpu_lab(tmp_path_factory.mktemp("lab") / "r.duckdb")


@pytest.fixture
def cpu_lab(cpu_lab_template, tmp_path):
    """A private copy of the module's store (writing five runs takes longer than copying a file)."""
    lab, ids = cpu_lab_template
    path = tmp_path / "r.duckdb"
    shutil.copy(lab.store.path, path)
    copy = Lab(path)
    copy.t = lab.t
    return copy, ids


# -- compare -------------------------------------------------------------------------------------------------
def test_an_exact_copy_of_the_reference_is_indistinguishable_with_full_agreement(cpu_lab):
    lab, ids = cpu_lab
    copy = lab.run(lab.answers(), backend="int4", variant="copy")
    c = parity.compare(lab.store, copy)
    assert c.reference.run_id == ids["bf16"] and c.reference_how == "same GPU"
    assert c.floor.run.run_id == ids["floor"]
    assert (c.agreement.k, c.agreement.n) == (300, 300)
    assert c.tv.max == 0.0 and c.kl.max == 0.0
    assert c.verdict.label == "indistinguishable"
    assert c.paired.mean.mean == 0.0


def test_flattened_probabilities_are_worse_than_the_floor_though_no_answer_flips(cpu_lab):
    lab, ids = cpu_lab
    c = parity.compare(lab.store, ids["nvfp4"])
    assert c.agreement.rate == 1.0
    assert c.verdict.label == "worse"
    assert c.tv_ci.lo > c.floor.tv_ci.hi
    assert c.dp.mean < -0.1  # the candidate is much less sure of the reference's answers


def test_a_variant_that_flips_answers_is_worse_on_agreement(cpu_lab):
    lab, ids = cpu_lab
    c = parity.compare(lab.store, ids["int2"])
    assert c.agreement.hi < c.floor.agreement.lo
    assert c.verdict.label == "worse"
    assert c.flips.ref_right_cand_wrong > c.flips.ref_wrong_cand_right
    # Flips concentrate in near-ties: the lowest-margin bucket agrees least.
    rates = c.buckets.set_index("margin")["rate"]
    assert rates.iloc[0] < rates.iloc[-1]


def test_the_default_reference_is_the_latest_bf16_run_on_the_same_gpu(cpu_lab):
    lab, ids = cpu_lab
    lab.run(host="other-box")  # newer, other host
    lab.run(role="noise_floor", kernel_path="transformers experts=eager")  # newer, but a floor
    lab.run(suite_hash="s2")  # newer, other suite
    lab.run(status="failed", failure="oom")
    assert parity.compare(lab.store, ids["int4"]).reference.run_id == ids["bf16"]
    newer = lab.run()
    assert parity.compare(lab.store, ids["int4"]).reference.run_id == newer


def test_a_run_marked_reference_wins_and_bfloat16_beats_a_float32_run_of_the_bf16_backend(cpu_lab):
    lab, ids = cpu_lab
    lab.run(variant="float32", weight_format="float32")  # newer, but not BF16
    assert parity.compare(lab.store, ids["int4"]).reference.run_id == ids["bf16"]
    marked = lab.run(role="reference")
    lab.run()  # newer, not marked
    assert parity.compare(lab.store, ids["int4"]).reference.run_id == marked
    assert report.build_report(lab.store)[0].reference.run_id == marked


def test_compare_takes_an_explicit_reference_and_an_id_prefix(cpu_lab):
    lab, ids = cpu_lab
    c = parity.compare(lab.store, ids["int4"][:13], reference_run_id=ids["floor"])
    assert c.reference.run_id == ids["floor"] and c.reference_how == "given"
    with pytest.raises(ParityError, match="ambiguous"):
        parity.compare(lab.store, ids["int4"][:4])
    with pytest.raises(ParityError, match="no run with that id"):
        parity.compare(lab.store, "ffffffff")


@pytest.mark.parametrize("fields, message", [
    (dict(suite_hash="s2"), "suite_hash differs"),
    (dict(tokenizer_hash="t2"), "tokenizer_hash differs"),
    (dict(weights="synthetic"), "synthetic"),
    (dict(status="failed", failure="oom"), r"failed \(oom\)"),
])
def test_compare_refuses_runs_whose_inputs_or_weights_differ(cpu_lab, fields, message):
    lab, ids = cpu_lab
    other = lab.run(backend="int4", variant="int4", **fields)
    with pytest.raises(ParityError, match=message):
        parity.compare(lab.store, other, reference_run_id=ids["bf16"])


def test_without_any_bf16_run_compare_says_how_to_make_one(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=20)
    rid = lab.run(backend="int4", variant="int4")
    with pytest.raises(ParityError, match="quantbench run --backend bf16"):
        parity.compare(lab.store, rid)


def test_cli_compare_prints_the_verdict_and_writes_valid_json(cpu_lab):
    from typer.testing import CliRunner

    from quantbench.cli import app

    lab, ids = cpu_lab
    db = ["--db", str(lab.store.path)]
    done = CliRunner().invoke(app, ["compare", ids["nvfp4"], *db])
    assert done.exit_code == 0, done.output
    out = " ".join(done.stdout.split())  # rich wraps at the console's width
    assert "Verdict: worse" in out and "mean over benchmarks" in out
    assert "margins: card: agreement within 2 points and mean TV within 0.01 of the noise floor" in out
    assert "95% interval [" in out and "→ worse: wholly beyond the margin" in out
    done = CliRunner().invoke(app, ["compare", ids["int4"], "--format", "json", *db])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert data["agreement"]["n"] == 300 and data["noise_floor"]["run"]["run_id"] == ids["floor"]
    assert data["verdict"] == "indistinguishable" and data["verdict_margins"] == {"agreement": 0.02, "tv": 0.01, "accuracy": None, "name": "card"}
    agree, tv = data["verdict_excess"]
    assert agree["statistic"] == "disagreement" and agree["lo"] <= 0 < agree["hi"] <= 0.02 and tv["hi"] <= 0.01
    bad = CliRunner().invoke(app, ["compare", ids["int4"], "--format", "xml", *db])
    assert bad.exit_code == 2 and "--format 'xml': use table or json" in " ".join(bad.stderr.split())


def test_the_margin_flags_change_the_verdict_and_refuse_nonsense(cpu_lab):
    from typer.testing import CliRunner

    from quantbench.cli import app
    lab, ids = cpu_lab
    worse = parity.compare(lab.store, ids["nvfp4"])
    tv = worse.verdict.parts[1]
    assert worse.verdict.label == "worse" and tv.lo > 0.01
    flat = report.flat_rows(report.build_report(lab.store)).set_index("variant")  # csv and json carry the figures
    assert flat.at["nvfp4-packed", "verdict"] == "worse"
    assert flat.at["nvfp4-packed", "excess_mean_tv_lo"] == pytest.approx(tv.lo)
    wide = parity.compare(lab.store, ids["nvfp4"], margins=Margins(tv=tv.hi + 0.01))
    assert wide.verdict.label == "different, within margin"
    db = ["--db", str(lab.store.path)]
    result = CliRunner().invoke(app, ["compare", ids["nvfp4"], "--margin-tv", str(tv.hi + 0.01), *db],
                                terminal_width=250)
    assert result.exit_code == 0 and "Verdict: different, within margin" in result.output
    result = CliRunner().invoke(app, ["report", "--margin-tv", str(tv.hi + 0.01), *db], terminal_width=250)
    assert result.exit_code == 0
    nvfp4 = next(line for line in result.output.splitlines() if line.startswith("| nvfp4-packed "))
    assert "| different, within margin |" in nvfp4 and "worse than the noise floor" not in nvfp4
    result = CliRunner().invoke(app, ["report", "--margin-agreement", "2", *db])
    assert result.exit_code != 0 and "--margin-agreement 2.0: give a fraction between 0 and 1" in result.output


# -- report --------------------------------------------------------------------------------------------------
def rows_of(rep):
    return {r.label: r for r in rep.rows}


def test_the_report_recommends_the_smallest_variant_that_passes_the_quality_rules(cpu_lab):
    lab, ids = cpu_lab
    [rep] = report.build_report(lab.store)
    rows = rows_of(rep)
    assert list(rows) == ["bf16", "int2", "int4", "nvfp4-packed"]  # the noise floor is not a row
    assert rep.recommended is rows["int4"]
    assert rows["int4"].comparison.verdict.label == "indistinguishable"
    assert "worse than the noise floor by more than the margin" in rows["nvfp4-packed"].excluded
    assert any(e.startswith("agreement") for e in rows["int2"].excluded)
    assert rows["bf16"].is_reference and rows["bf16"].best_for.startswith("Reference quality")
    assert rep.rule.startswith("the smallest weights in host memory among variants with agreement with BF16 ≥ 95.0%")


def test_changing_a_rule_changes_the_recommendation_and_says_which_rule(cpu_lab):
    lab, _ = cpu_lab
    strict = report.build_report(lab.store, rules=Rules(min_agreement=0.999))[0]
    assert strict.recommended.label == "bf16"  # int4's 98–99% no longer passes; the reference always does
    fast = report.build_report(lab.store, rules=Rules(objective="latency"))[0]
    assert fast.recommended.label == "bf16" and "lowest p50 latency" in fast.rule
    budget = report.build_report(lab.store, rules=Rules(vram_budget_gib=0.3))[0]  # 322 MB: only int2 fits
    assert budget.recommended is None and budget.rule.startswith("no variant passes")
    assert "over the 0.3 GiB budget" in rows_of(budget)["int4"].best_for
    loose = report.build_report(lab.store, rules=Rules(min_agreement=0.5, use_noise_floor=False,
                                                       prefer_native=False))[0]
    assert loose.recommended.label == "int2"


def test_an_emulated_variant_gives_way_to_a_native_one_only_when_preferred(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=60)
    lab.run()
    lab.run(lab.answers(), backend="nvfp4", variant="nvfp4", native="emulated", model_tensor_bytes=10 * MB)
    lab.run(lab.answers(), backend="int4", variant="int4", native="native", model_tensor_bytes=20 * MB)
    assert report.build_report(lab.store)[0].recommended.label == "int4"
    assert report.build_report(lab.store, rules=Rules(prefer_native=False))[0].recommended.label == "nvfp4"


def test_the_markdown_table_has_the_card_columns_and_cpu_memory_labels(cpu_lab):
    lab, ids = cpu_lab
    lab.run(backend="fp8", variant="fp8", host_rss_peak_bytes=None, model_tensor_bytes=None, disk_bytes=None)
    text = report.render(report.build_report(lab.store), "markdown")
    header = next(line for line in text.splitlines() if line.startswith("| Variant"))
    assert header == ("| Variant | Format | Size on disk | Weights (host memory) | Peak host RSS | Latency p50 / p90 "
                      "(per decision) | Energy per decision | Agrees with BF16 (95% CI) | TV | Verdict | Δ accuracy vs BF16 | Native here? | "
                      "Best for | Kernel |")
    assert "VRAM" not in header
    fp8 = next(line for line in text.splitlines() if line.startswith("| fp8 "))
    assert fp8.count("n/a") >= 3 and " 0 B" not in fp8  # unknown is n/a, never 0
    assert "| 14.4 / 14.8 ms |" in text  # bf16's p50 / p90, in tenths below 100 ms
    assert "Noise floor: BF16 against itself" in text
    assert "**Recommended: int4**, picked by the rule: the smallest weights in host memory" in text
    lines = text.splitlines()
    start = lines.index(header)
    table = [line for line in lines[start:lines.index("", start)] if not line.startswith("|---")]
    assert len(table) > 2 and len({line.count(" | ") for line in table}) == 1  # every row has the same cells


def test_synthetic_weights_show_speed_and_memory_but_no_quality(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=30)
    for backend, size in (("bf16", 60), ("int4", 20)):
        lab.run(backend=backend, variant=backend, weights="synthetic", model_id="synthetic-qwen3-30b-a3b",
                model_tensor_bytes=size * MB, **GPU, mem_weights_bytes=size * MB, mem_nvml_peak_bytes=2 * size * MB)
    [rep] = report.build_report(lab.store)
    assert rep.recommended is None and "synthetic" in rep.rule
    assert all(r.comparison is None for r in rep.rows)
    text = report.render([rep], "markdown")
    assert text.count(report.SYNTHETIC_NOTE) == 2 and "Reference quality" not in text
    assert "| 57.2 MiB | 114.4 MiB |" in text  # VRAM (weights), Peak VRAM of bf16


def test_one_table_per_gpu_with_a_summary_and_gpu_filters(cpu_lab):
    lab, ids = cpu_lab
    lab.run(**GPU, mem_weights_bytes=60 * MB, mem_nvml_peak_bytes=None, mem_peak_reserved_bytes=70 * MB)
    lab.run(lab.answers(noise=0.02, seed=3), backend="int4", variant="int4", native="native", **GPU,
            mem_weights_bytes=20 * MB, mem_nvml_peak_bytes=30 * MB)
    lab.run(backend="nvfp4", variant="nvfp4-packed", status="failed", failure="oom", **GPU)
    reps = report.build_report(lab.store)
    assert [r.gpu for r in reps] == ["NVIDIA H200 (hopper)", "CPU (box)"]
    h200 = rows_of(reps[0])
    assert h200["nvfp4-packed"].best_for == "failed here (oom)"
    assert reps[0].recommended.label == "int4" and reps[0].floor is None  # no floor run on the H200
    text = report.render(reps, "markdown")
    assert "### Recommended per GPU" in text and "| NVIDIA H200 (hopper) | tiny-moe | builtin | int4 |" in text
    assert "| VRAM (weights) | Peak VRAM |" in text and "66.8 MiB*" in text  # torch reserved, marked
    assert "No noise-floor run" in text
    assert [r.gpu for r in report.build_report(lab.store, gpu="hopper")] == ["NVIDIA H200 (hopper)"]
    assert [r.gpu for r in report.build_report(lab.store, gpu="h200")] == ["NVIDIA H200 (hopper)"]
    assert [r.gpu for r in report.build_report(lab.store, gpu="cpu")] == ["CPU (box)"]
    assert report.build_report(lab.store, gpu="blackwell") == []


def test_a_gpu_without_bf16_borrows_the_reference_from_another_gpu_and_says_so(cpu_lab):
    lab, ids = cpu_lab
    lab.run(lab.answers(noise=0.02, seed=3), backend="int4", variant="int4", **GPU, mem_weights_bytes=20 * MB)
    [rep] = report.build_report(lab.store, gpu="hopper")
    assert rep.reference.run_id == ids["bf16"]
    assert "†" in report.cells(rep.rows[0], rep)["Agrees with BF16 (95% CI)"]
    assert any("CPU (box)" in n for n in rep.notes)
    [strict] = report.build_report(lab.store, gpu="hopper", cross_gpu_reference=False)
    assert strict.recommended is None and "no BF16 reference" in strict.rule


def test_csv_and_json_carry_the_raw_figures(cpu_lab):
    lab, ids = cpu_lab
    reps = report.build_report(lab.store)
    csv = pd.read_csv(io.StringIO(report.render(reps, "csv")))
    int4 = csv.set_index("variant").loc["int4"]
    assert int4["recommended"] and int4["weights_memory_bytes"] == 20 * MB and int4["n_questions"] == 300
    assert int4["run_id"] == ids["int4"]
    data = json.loads(report.render(reps, "json", Rules()))
    assert data["rules"]["min_agreement"] == 0.95
    assert data["reports"][0]["recommended"] == "int4"
    assert data["reports"][0]["noise_floor"]["run_id"] == ids["floor"]
    assert {r["variant"] for r in data["reports"][0]["rows"]} == {"bf16", "int2", "int4", "nvfp4-packed"}
    with pytest.raises(ConfigError, match="--format"):
        report.render(reps, "html")


def test_report_for_this_machine_and_report_text(cpu_lab):
    lab, _ = cpu_lab
    text = report.report_for_this_machine(lab.store, "cpu", host="box")
    assert text.startswith("### tiny-moe on CPU (box)")
    assert report.report_for_this_machine(lab.store, "NVIDIA H200").startswith("No successful or failed runs")
    # a percentage is read as one
    assert "**Recommended: bf16**" in report.report_text(db=str(lab.store.path), min_agreement=99.9)
    with pytest.raises(QuantbenchError, match="the store has: CPU \\(box\\): tiny-moe"):
        report.report_text(db=str(lab.store.path), gpu="blackwell")
    with pytest.raises(ConfigError, match="--min-agreement"):
        report.report_text(db=str(lab.store.path), min_agreement=-1)


def test_rows_that_cannot_be_compared_or_only_failed_say_why(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=20)
    lab.run()
    lab.run(backend="int4", variant="int4", tokenizer_hash="other")
    lab.run(backend="nvfp4", variant="nvfp4", status="failed", failure="oom", **GPU)
    cpu, = report.build_report(lab.store, gpu="cpu")
    assert rows_of(cpu)["int4"].quality.startswith("not comparable (tokenizer_hash differs")
    assert cpu.recommended.label == "bf16"
    gpu, = report.build_report(lab.store, gpu="hopper")
    assert gpu.recommended is None and gpu.rule == "no recommendation: every variant failed here"


def test_a_floor_identical_to_the_reference_is_called_out(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=40)
    lab.run()
    lab.run(role="noise_floor", kernel_path="transformers experts=eager")  # bit-identical, as on a CPU
    rid = lab.run(lab.answers(noise=0.001), backend="bf16", variant="float32", weight_format="float32")
    c = parity.compare(lab.store, rid)
    # 40 questions: a 2-point agreement margin is beyond what they can show, even for a near-copy.
    assert c.floor.tv.max == 0 and c.verdict.label == "inconclusive" and c.verdict.n_needed == 189
    # TV: float32 vs bfloat16 moves every question a little, detectably, but far inside the 0.01 margin.
    assert c.verdict.parts[1].label == "different, within margin" and c.verdict.parts[1].hi < 0.002
    assert any("answered exactly as the reference" in n and "agreement within 2 points" in n for n in c.notes)
    assert "Note: the noise-floor run answered exactly" in report.render(report.build_report(lab.store))


def test_since_leaves_out_older_runs_and_a_bad_date_names_the_flag(cpu_lab):
    lab, ids = cpu_lab
    [everything] = report.build_report(lab.store)
    newest = max(r.created_at for r in recommend.stored_runs(lab.store))
    later = (newest + dt.timedelta(minutes=1)).isoformat()
    assert report.build_report(lab.store, since=later) == []
    [same] = report.build_report(lab.store, since=(T0 - dt.timedelta(days=1)).date().isoformat())
    assert [r.label for r in same.rows] == [r.label for r in everything.rows]
    with pytest.raises(ConfigError, match="--since 'last week'"):
        report.build_report(lab.store, since="last week")


def test_latency_cells_keep_tenths_below_100_ms():
    # a 12 ms goal needs 11.8 and 12.3 told apart; seconds-long paths need no tenths
    assert [report.fmt_ms(x) for x in (0.44, 11.84, 12.3, 99.94, 387.1, 1291.2, None)] == [
        "0.4", "11.8", "12.3", "99.9", "387", "1,291", "n/a"]


# -- issue #22 item 10: failed runs without a model are a list, not a table ----------------------------------
def test_a_run_that_failed_before_its_model_was_known_is_listed_not_tabled(cpu_lab):
    lab, ids = cpu_lab
    bad = lab.run(status="failed", failure="load_error", model_id=None, suite_id=None, suite_hash=None,
                  variant=None, weight_format=None, kernel_path=None, backend="int4",
                  error="/nowhere: no config.json; --model must be a checkpoint directory\nTraceback ...")
    reps = report.build_report(lab.store)
    assert [(r.gpu, r.model_id) for r in reps] == [("CPU (box)", "tiny-moe")]
    assert [r.run_id for r in reps.failed] == [bad]
    text = report.render(reps, "markdown")
    assert "None" not in text
    assert text.count("Size on disk is in GB") == 1  # the footnotes once: one table
    assert f"{bad[:13]} int4 on CPU (box): load_error: /nowhere: no config.json; --model must be a checkpoint" in text
    assert "### Failed runs (1)" in text
    data = json.loads(report.render(reps, "json"))
    assert [f["run_id"] for f in data["failed_runs"]] == [bad] and data["failed_runs"][0]["failure"] == "load_error"
    with pytest.raises(ParityError, match=r"failed \(load_error: /nowhere: no config.json.*`quantbench runs`"):
        parity.compare(lab.store, bad)


def test_compare_of_an_unknown_run_points_to_quantbench_runs(cpu_lab):
    lab, _ = cpu_lab
    with pytest.raises(ParityError, match="no run with that id .*; `quantbench runs` lists the runs"):
        parity.compare(lab.store, "nosuchrun")


# -- issue #22 item 15: `quantbench runs` names the model and flags random-weight accuracy ---------------------
def test_runs_lists_the_model_and_marks_the_accuracy_of_random_weights(tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    lab = Lab(tmp_path / "r.duckdb", n=8)
    lab.run(model_id="tiny-moe")
    lab.run(model_id="synthetic-qwen3-30b-a3b-2l-seed0", weights="synthetic", backend="int4", variant="int4")
    result = CliRunner().invoke(app, ["runs", "--db", str(lab.store.path)], terminal_width=250)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    [trained] = [ln for ln in lines if "tiny-moe" in ln]
    [synthetic] = [ln for ln in lines if "synthetic-qwen3-30b-a3b-2l-seed0" in ln]
    assert [c.strip() for c in lines[2].split("┃")[1:4]] == ["run", "status", "model"]
    # one accuracy everywhere: the mean over benchmarks (8 questions: 3/3, 2/3 and 2/2 right), not the 7 of 8 pooled
    assert "88.9% " in trained and "87.5%" not in trained and "random weights" not in trained
    assert "accuracy (mean over benchmarks)" in " ".join(result.output.split())
    assert "88.9% (random weights*)" in synthetic
    assert "* random (synthetic) weights: speed and memory only; their accuracy is chance" in result.output


# -- issue #22 item 11: the newest run of each variant, history behind --all, a cross-GPU matrix -----------------
def test_the_default_view_keeps_the_newest_kernel_generation_of_each_variant_and_all_keeps_history(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=40)
    h200 = dict(GPU, mem_weights_bytes=60 * MB, mem_nvml_peak_bytes=900 * MB)
    lab.run(**h200, kernel_path="transformers experts=grouped_mm +cuda-graph")
    int4 = dict(backend="int4", variant="int4", weight_format="int4 w4a16 g128", native="native", **GPU,
                mem_weights_bytes=20 * MB, mem_nvml_peak_bytes=800 * MB)
    old = lab.run(ms=30, kernel_path="quantbench grouped-moe triton-fused-int4 +cuda-graph", **int4)
    new = lab.run(ms=12, kernel_path="quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope +cuda-graph", **int4)
    loop = lab.run(ms=900, kernel_path="auto-round per-expert loop qlinear_tritonv2_zp", **int4)
    eager = lab.run(**h200, kernel_path="transformers experts=eager")  # another kernel, not a newer generation
    [rep] = report.build_report(lab.store)
    rows = {r.label: r.run.run_id for r in rep.rows}
    assert rows == {"bf16 (transformers grouped_mm)": rows["bf16 (transformers grouped_mm)"],
                    "bf16 (transformers eager)": eager, "int4 (quantbench engine)": new,
                    "int4 (auto-round loop)": loop}
    assert old not in rows.values()
    assert rep.recommended.label == "int4 (quantbench engine)"
    text = report.render([rep])
    assert text.splitlines()[4].endswith("| Best for | Kernel |")
    assert "| quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope +cuda-graph |" in text
    [everything] = report.build_report(lab.store, history=True)
    assert old in {r.run.run_id for r in everything.rows} and len(everything.rows) == 5
    assert "int4 (quantbench grouped-moe triton-fused-int4 +cuda-graph)" in [r.label for r in everything.rows]


def test_a_variant_that_ran_under_one_implementation_is_named_by_its_variant_alone(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=40)
    lab.run(**GPU, mem_weights_bytes=60 * MB)
    for gen in ("triton-fused-int4", "gluon-wgmma-int4 +fused rmsnorm+rope", "gluon-wgmma-int4 +fused rmsnorm+rope+qkv"):
        lab.run(backend="int4", variant="int4", native="native", kernel_path=f"quantbench grouped-moe {gen}",
                mem_weights_bytes=20 * MB, **GPU)
    [rep] = report.build_report(lab.store)
    assert [r.label for r in rep.rows] == ["bf16", "int4"]
    assert rep.recommended.label == "int4" and rep.recommended.run.kernel_path.endswith("rmsnorm+rope+qkv")
    assert "**Recommended: int4**, picked by the rule" in report.render([rep])


def test_one_kernel_over_two_checkpoints_of_a_variant_is_two_rows_named_by_their_formats(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=20)
    kernel = "quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope"
    for fmt in ("int4 w4a16 g128 sym (RTN in memory)", "int4 w4a16 g128 sym (auto_round:auto_gptq)"):
        lab.run(backend="int4", variant="int4", kernel_path=kernel, weight_format=fmt, **GPU)
    labels = [r.label for r in report.build_report(lab.store)[0].rows]
    assert len(labels) == 2 and len(set(labels)) == 2, labels
    assert all(label.startswith(f"int4 ({kernel}; int4 w4a16") for label in labels), labels


def test_an_older_build_of_the_embedded_fixture_is_history(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=20)
    lab.run(model_id="quantbench-fixture-moe-93597e4d")
    lab.run(model_id="quantbench-fixture-moe-9af210da")
    lab.run(model_id="my-model")
    assert [r.model_id for r in report.build_report(lab.store)] == ["my-model", "quantbench-fixture-moe-9af210da"]
    assert [r.model_id for r in report.build_report(lab.store, history=True)] == [
        "my-model", "quantbench-fixture-moe-93597e4d", "quantbench-fixture-moe-9af210da"]
    assert [r.model_id for r in report.build_report(lab.store, model="93597e4d")] == [
        "quantbench-fixture-moe-93597e4d"]  # asked for by name: shown


def test_the_cross_gpu_matrix_answers_which_quant_on_which_gpu(cpu_lab):
    lab, ids = cpu_lab
    lab.run(**GPU, mem_weights_bytes=60 * MB, ms=2.0)
    lab.run(lab.answers(noise=0.02, seed=3), backend="int4", variant="int4", native="native", **GPU, ms=1.5,
            mem_weights_bytes=20 * MB)
    lab.run(backend="nvfp4", variant="nvfp4-packed", status="failed", failure="oom", **GPU)
    reps = report.build_report(lab.store)
    [m] = report.gpu_matrices(reps)
    assert m.gpus == ["NVIDIA H200 (hopper)", "CPU (box)"]
    assert m.picks == {"NVIDIA H200 (hopper)": "int4", "CPU (box)": "int4"}
    assert m.cells["int4"]["NVIDIA H200 (hopper)"] == "⭐ 1.9 ms · 19.1 MiB · 99.7% agree"
    assert m.cells["bf16"]["CPU (box)"] == "14.4 ms · 47.7 MiB · reference"
    assert m.cells["nvfp4-packed"] == {"NVIDIA H200 (hopper)": "failed (oom)",
                                       "CPU (box)": "40.5 ms · 23.8 MiB · 100.0% agree"}
    assert "int2" not in m.cells or "NVIDIA H200 (hopper)" not in m.cells["int2"]
    text = report.render(reps)
    assert "### Which quant on which GPU: tiny-moe (suite builtin)" in text
    assert "| **Pick** | **int4** | **int4** |" in text
    assert "| int2 | not run |" in text
    assert json.loads(report.render(reps, "json"))["gpu_matrices"][0]["picks"]["CPU (box)"] == "int4"
    assert report.gpu_matrices(report.build_report(lab.store, gpu="cpu")) == []  # one GPU: the table says it all
    assert "### Which quant on which GPU" in report.report_text(db=str(lab.store.path), history=True)


def test_a_store_read_without_migrating_shows_the_one_accuracy_too(tmp_path):
    """A store keeps the view definitions of the quantbench that wrote it (read-only opens never migrate): the
    older run_accuracy view pooled the gold questions; `runs` computes the mean over benchmarks itself."""
    import duckdb

    from quantbench.analysis.select import RunFilter, summaries
    from quantbench.store import queries

    lab = Lab(tmp_path / "r.duckdb", n=8)
    lab.run(model_id="tiny-moe")
    con = duckdb.connect(str(lab.store.path))
    con.execute("CREATE OR REPLACE VIEW run_accuracy AS SELECT run_id, count(*) AS n_answers, count(gold) AS n_gold, "
                "avg(CASE WHEN gold IS NOT NULL THEN (top = gold)::INTEGER END) AS accuracy FROM answers GROUP BY run_id")
    con.close()
    assert lab.store.read("SELECT accuracy FROM run_summary")["accuracy"].tolist() == [7 / 8]  # the old view: pooled
    assert [r.accuracy for r in queries.stored_runs(lab.store)] == pytest.approx([(2 / 3 + 1 + 1) / 3])
    assert [r.accuracy for r in summaries(lab.store, RunFilter())] == pytest.approx([(2 / 3 + 1 + 1) / 3])  # `runs`
