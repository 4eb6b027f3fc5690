"""Batched runs in the report (`run --concurrency N`: several decisions a forward pass): a throughput table beside
the per-decision one, never replacing its rows; a suite run only batched is that table alone, with the reason
and no pick; the csv's throughput rows after each group's per-decision rows."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from quantbench import report
from quantbench.analysis import recommend
from tests.stored import stored_run
from tests.test_report import GPU, MB, Lab


def test_a_batched_run_never_replaces_the_batch_1_row_and_is_reported_as_decisions_per_second(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=30)
    kw = dict(weights="synthetic", model_id="synthetic-qwen3-30b-a3b", **GPU, mem_weights_bytes=60 * MB)
    lab.run(ms=10, **kw)
    lab.run(ms=40, batch=8, **kw)  # newer: 8 decisions per 40 ms forward pass
    [rep] = report.build_report(lab.store)
    [row] = rep.rows
    assert row.p50 == pytest.approx(10.45)  # the batch-1 run's median, not the batch time
    # 10 timed decisions whose forward passes took 40 + 0.1 i ms for 8 each: 10 / (404.5 / 8 / 1000) per second
    [t] = rep.throughput
    assert (t["variant"], t["batch"], round(t["decisions_per_s"], 1)) == ("bf16", 8, 197.8)
    md = report.render([rep], "markdown")
    assert "| bf16 | 8 | 197.8 | 40.5 | " in md and "at batch 8" not in md  # a table row: 8 / 197.8 per s
    # the same variant under a second kernel at the same batch size is a second figure, named by its kernel:
    # 10 / (204.5 / 8 / 1000) per second
    lab.run(ms=20, batch=8, kernel_path="quantbench grouped-moe", **kw)
    [note] = report.throughput_notes(report.build_report(lab.store)[0].throughput)
    assert "bf16 (quantbench engine) at batch 8: 391.2/s" in note and "/s; bf16 (" in note


def section(md: str, heading_line: str) -> str:
    """The part of a markdown report from the table whose lines include `heading_line` to the next heading."""
    parts = md.split("\n### ")
    return next(p for p in parts if heading_line in p)


def test_a_suite_run_only_batched_is_its_throughput_table_with_the_reason_and_no_pick(tmp_path):
    """A suite run only with `run --concurrency N` has no batch-1 run to make rows of: its report is the throughput
    table alone, and a note says why there is no latency or parity table (such a group used to be left out)."""
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run(**GPU, mem_weights_bytes=60 * MB)  # one decision at a time on suite s1: a table, as ever
    batched = dict(suite_id="s64", suite_hash="s64-hash", backend="int4", variant="int4", **GPU,
                   mem_weights_bytes=20 * MB)
    ids = [lab.run(ms=100, batch=16, **batched), lab.run(ms=190, batch=32, energy_j_per_decision=5.4, **batched)]
    table, alone = report.build_report(lab.store)  # by suite id: builtin, s64
    assert table.rows and not table.batched_only
    assert alone.batched_only and alone.rows == [] and alone.recommended is None
    assert alone.rule == recommend.BATCHED_ONLY_RULE and alone.suite_id == "s64"
    note = ("only batched runs (16 and 32 decisions a pass) in this group: run it at batch 1 for per-decision "
            "latency and parity")
    assert alone.no_table_note == note
    assert [(t["variant"], t["batch"], t["run_id"]) for t in alone.throughput] == [("int4", 16, ids[0]),
                                                                                    ("int4", 32, ids[1])]
    md = report.render([table, alone], "markdown")
    s64 = section(md, "Suite s64 (hash s64-hash).")
    assert s64.startswith("tiny-moe on NVIDIA H200 (hopper)")
    assert f"**No per-decision table:** {note}." in s64
    assert "Throughput, several decisions in one forward pass:\n" in s64 and "the table above" not in s64
    assert "| int4 | 16 | 159.3 | " in s64 and "| int4 | 32 | " in s64 and "| 5.4 J |" in s64
    assert "| Variant | Format |" not in s64 and "Recommendation:" not in s64  # no empty latency table
    assert f"| NVIDIA H200 (hopper) | tiny-moe | s64 | none | {recommend.BATCHED_ONLY_RULE} |" in md
    assert "Which quant on which GPU" not in md  # one GPU: no matrix, and a batched-only table never joins one
    data = json.loads(report.render([table, alone], "json"))
    [s64_json] = [r for r in data["reports"] if r["suite_id"] == "s64"]
    assert s64_json["batched_only"] and s64_json["rows"] == [] and s64_json["recommended"] is None
    assert s64_json["notes"][0] == note and [t["run_id"] for t in s64_json["throughput"]] == ids
    assert s64_json["throughput"][1]["j_per_decision"] == 5.4
    csv_s64 = pd.read_csv(io.StringIO(report.render([table, alone], "csv"))).query("suite_id == 's64'")
    assert csv_s64["row_kind"].tolist() == ["throughput", "throughput"] and csv_s64["run_id"].tolist() == ids


def test_the_csv_has_each_batched_run_as_a_throughput_row_after_its_groups_per_decision_rows(tmp_path):
    """`report --format csv` had only the per-decision rows: a group of batched runs alone was missing from it, and
    so were the batched runs of every other group. They are rows of their own now (row_kind "throughput"), told
    apart by columns appended after the old ones, so the per-decision rows read exactly as before."""
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run(**GPU, mem_weights_bytes=60 * MB)  # batch 1 on suite s1: the per-decision table
    beside = lab.run(ms=40, batch=8, **GPU, mem_weights_bytes=60 * MB)  # batched, beside that table
    batched = dict(suite_id="s64", suite_hash="s64-hash", backend="int4", variant="int4", weight_format="int4 w4a16",
                   kernel_path="quantbench grouped-moe", **GPU, mem_weights_bytes=20 * MB)
    alone = [lab.run(ms=100, batch=16, **batched), lab.run(ms=190, batch=32, energy_j_per_decision=5.4, **batched)]
    reports = report.build_report(lab.store)
    text = report.render(reports, "csv")
    lines, before = text.splitlines(), report.flat_rows(reports).to_csv(index=False).splitlines()
    assert lines[0] == before[0] + ",row_kind,decisions_per_pass,decisions_per_s,ms_per_pass"
    assert lines[1] == before[1] + ",decision,1,,"  # the per-decision row, byte for byte, then its kind
    df = pd.read_csv(io.StringIO(text))
    assert list(zip(df["suite_id"], df["row_kind"], df["variant"], df["decisions_per_pass"], df["run_id"],
                    strict=True)) == [("builtin", "decision", "bf16", 1, reports[0].rows[0].run.run_id),
                                      ("builtin", "throughput", "bf16", 8, beside),
                                      ("s64", "throughput", "int4", 16, alone[0]),
                                      ("s64", "throughput", "int4", 32, alone[1])]
    rows = df[df["row_kind"] == "throughput"].set_index("run_id")
    figures = {t["run_id"]: t for rep in reports for t in rep.throughput}
    assert rows["decisions_per_s"].to_dict() == pytest.approx({k: t["decisions_per_s"] for k, t in figures.items()})
    assert rows["ms_per_pass"].to_dict() == pytest.approx({k: t["ms_per_pass"] for k, t in figures.items()})
    assert rows.loc[alone[1], "j_per_decision"] == 5.4 and rows.loc[alone[1], "time_basis"].startswith(
        "throughput at batch 32")
    assert rows.loc[alone[0], ["backend", "kernel_path", "weight_format", "host", "status"]].tolist() == [
        "int4", "quantbench grouped-moe", "int4 w4a16", "gpu-box", "ok"]
    assert rows["disk_bytes"].tolist() == [100 * MB] * 3 and "100000000.0" not in text  # integers stay integers
    # a pass's time is no per-decision latency, and a batched run was compared with nothing: left empty
    assert rows[["p50_ms", "p90_ms", "agreement", "verdict"]].isna().all().all() and not rows["recommended"].any()
    # a group of batched runs alone has rows of its own, under the same leading columns
    only = pd.read_csv(io.StringIO(report.render([reports[1]], "csv")))
    assert only["row_kind"].tolist() == ["throughput", "throughput"] and only["run_id"].tolist() == alone
    assert list(only.columns[:7]) == ["gpu", "gpu_family", "host", "model_id", "suite_id", "suite_hash", "variant"]


def test_the_csv_of_a_store_without_batched_runs_says_every_row_is_one_decision(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run(**GPU, mem_weights_bytes=60 * MB)
    df = pd.read_csv(io.StringIO(report.render(report.build_report(lab.store), "csv")))
    assert df["row_kind"].tolist() == ["decision"] and df["decisions_per_pass"].tolist() == [1]
    assert report.render([], "csv").strip() == ""  # nothing to report: an empty csv, as before


def test_a_batched_only_table_of_synthetic_weights_does_not_promise_parity(tmp_path):
    lab = Lab(tmp_path / "r.duckdb", n=30)
    lab.run(ms=100, batch=16, weights="synthetic", model_id="synthetic-qwen3-30b-a3b", **GPU)
    [alone] = report.build_report(lab.store)
    assert alone.synthetic and alone.no_table_note == (
        "only batched runs (16 decisions a pass) in this group: run it at batch 1 for per-decision latency (its "
        "synthetic weights give no parity)")
    assert report.report_for_this_machine(lab.store, "NVIDIA H200").startswith("### synthetic-qwen3-30b-a3b on")


def test_throughput_keeps_the_newest_batched_run_and_names_the_kernel_only_where_it_differs():
    from quantbench.report import throughput, throughput_notes

    def run(rid, variant, kernel, batch, per_s, status="ok"):
        return stored_run(run_id=rid, variant=variant, kernel_path=kernel, batch=batch, decisions_per_s=per_s,
                          status=status)

    group = [run("r1", "fp8", "k", 32, 150.0), run("r2", "int4", "a", 8, 100.0), run("r3", "int4", "b", 8, 120.0),
             run("r4", "fp8", "k", 1, 80.0), run("r5", "fp8", "k", 32, 157.7), run("r6", "bf16", "k", 8, 99.0, "failed")]
    rows = throughput(group)
    assert [(t["variant"], t["batch"], t["decisions_per_s"], t["run_id"]) for t in rows] == [
        ("fp8", 32, 157.7, "r5"), ("int4 (a)", 8, 100.0, "r2"), ("int4 (b)", 8, 120.0, "r3")]
    assert [t["ms_per_pass"] for t in rows] == pytest.approx([1000 * 32 / 157.7, 80.0, 1000 * 8 / 120.0])
    assert throughput_notes(rows) == ["Throughput (decisions per second, several decisions in one forward pass): "
                                      "fp8 at batch 32: 157.7/s; int4 (a) at batch 8: 100.0/s; int4 (b) at batch 8: "
                                      "120.0/s."]
    assert throughput([run("r4", "fp8", "k", 1, 80.0)]) == [] and throughput_notes([]) == []


def test_a_batch_size_only_an_earlier_kernel_generation_ran_says_so_in_its_label(tmp_path):
    """The default view keeps the newest run of each variant, implementation and batch size, so a batch size the
    newest kernels never ran keeps an older generation's figure: its label names the kernels that ran (the H200's
    24-a-pass row was the dequantizing path's, read as a cliff between 16 and 32 a pass)."""
    lab = Lab(tmp_path / "r.duckdb", n=20)
    kw = dict(weights="synthetic", model_id="synthetic-qwen3-30b-a3b", backend="int4", variant="int4", **GPU)
    lab.run(ms=10, **kw)
    lab.run(ms=200, batch=24, kernel_path="quantbench grouped-moe dequant+grouped_mm+gluon-wgmma-int4 +fused rmsnorm", **kw)
    lab.run(ms=100, batch=16, kernel_path="quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm", **kw)
    lab.run(ms=110, batch=8, kernel_path="quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope", **kw)
    lab.run(ms=100, batch=4, kernel_path="quantbench grouped-moe gluon-wgmma-int4 +fused rmsnorm+rope", **kw)
    [rep] = report.build_report(lab.store)
    labels = {t["batch"]: t["variant"] for t in rep.throughput}
    assert labels == {4: "int4", 8: "int4", 16: "int4 (earlier fused ops: +fused rmsnorm)",
                      24: "int4 (earlier kernels: dequant+grouped_mm+gluon-wgmma-int4)"}, labels
    [history] = report.build_report(lab.store, history=True)
    assert not any("earlier" in t["variant"] for t in history.throughput)
