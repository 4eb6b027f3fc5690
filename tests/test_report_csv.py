"""`report --format csv` and the runs that failed before their model was known (which no table holds)."""

from __future__ import annotations

import io
import json

import pandas as pd

from quantbench import report
from tests.test_report import Lab, cpu_lab_template  # noqa: F401  (cpu_lab's own fixture)
from tests.test_report import cpu_lab as cpu_lab  # noqa: F401  (a fixture)


def test_the_csv_of_a_store_whose_every_run_failed_before_loading_has_its_header_and_those_runs(tmp_path):
    """`report --format csv` printed nothing, not even a header, on a store whose every run failed before its model
    was known, while the markdown listed them and the JSON had them as failed_runs: the csv has them as rows too."""
    from typer.testing import CliRunner

    from quantbench.cli import app

    lab = Lab(tmp_path / "r.duckdb", n=4)
    model_less = dict(status="failed", model_id=None, suite_id=None, suite_hash=None, variant=None,
                      weight_format=None, kernel_path=None)
    load = lab.run(**model_less, failure="load_error", backend="int4",
                   error="/nowhere: no config.json; --model must be a checkpoint directory\nTraceback ...")
    crash = lab.run(**model_less, failure="crashed", backend="bf16", error="child died of SIGABRT")
    done = CliRunner().invoke(app, ["report", "--db", str(lab.store.path), "--gpu", "all", "--format", "csv"])
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("gpu,gpu_family,host,model_id,suite_id,suite_hash,variant,backend,")
    df = pd.read_csv(io.StringIO(done.stdout))
    assert df["run_id"].tolist() == [r["run_id"] for r in json.loads(report.render(
        report.build_report(lab.store), "json"))["failed_runs"]]  # the runs the JSON lists, in its order
    assert sorted(df["run_id"]) == sorted([load, crash]) and set(df["row_kind"]) == {"failed"}
    rows = df.set_index("run_id")
    assert rows.loc[load, ["status", "failure", "backend", "gpu", "host"]].tolist() == [
        "failed", "load_error", "int4", "CPU (box)", "box"]
    assert rows.loc[load, "error"] == "/nowhere: no config.json; --model must be a checkpoint directory"
    assert rows["model_id"].isna().all() and not rows["recommended"].any()


def test_the_csv_lists_the_runs_that_failed_before_loading_after_the_tables_rows(cpu_lab):
    lab, ids = cpu_lab
    bad = lab.run(status="failed", failure="load_error", model_id=None, suite_id=None, suite_hash=None,
                  variant=None, weight_format=None, kernel_path=None, backend="int4", error="no config.json")
    reps = report.build_report(lab.store)
    text = report.render(reps, "csv")
    df = pd.read_csv(io.StringIO(text))
    assert df["run_id"].tolist() == [*(r.run.run_id for r in reps[0].rows), bad]
    assert df["row_kind"].tolist() == ["decision"] * len(reps[0].rows) + ["failed"]
    assert df["error"].tolist()[-1] == "no config.json" and df["error"].iloc[:-1].isna().all()
    # the table's rows read as before: the failed rows' one column of their own (error) comes after the old ones
    before = report.render(list(reps), "csv").splitlines()  # a plain list: the tables without the failed runs
    assert text.splitlines()[0] == before[0] + ",error"
    assert text.splitlines()[1:len(before)] == [line + "," for line in before[1:]]
    assert "100000000.0" not in text  # integers stay integers beside the failed row
