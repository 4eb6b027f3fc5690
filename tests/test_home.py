"""Your results and shared results apart: runs are written to your own store (never a git-tracked file), readers
read it with pulled bundles and the shipped results beside it as one store (your run first), and `runs` /
`compare` / `report` choose runs by what they are."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from quantbench.analysis import select
from quantbench.cli import app
from quantbench.cli.common import _db, _reading
from quantbench.run.record import RunResult, uuid7
from quantbench.store import SCHEMA_VERSION, Store, StoreError, home, queries
from quantbench.store.home import GIVEN, PULLED, SHIPPED, YOURS, Source
from tests import dashboard_store as ds
from tests.test_transfer import T0, write_runs


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("QUANTBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUANTBENCH_SHIPPED", str(tmp_path / "shipped.duckdb"))
    return tmp_path


def test_runs_go_to_your_store_under_quantbench_home_never_the_checkout(clean_env, monkeypatch):
    assert _db(None) == clean_env / "home" / "results.duckdb" and (clean_env / "home").is_dir()
    monkeypatch.delenv("QUANTBENCH_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(clean_env / "xdg"))
    assert home.own_db() == clean_env / "xdg" / "quantbench" / "results.duckdb"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert home.own_db() == Path.home() / ".local" / "share" / "quantbench" / "results.duckdb"
    monkeypatch.setenv("QUANTBENCH_DB", str(clean_env / "mine.duckdb"))
    assert _db(None) == clean_env / "mine.duckdb"  # named: used as it is
    monkeypatch.delenv("QUANTBENCH_SHIPPED")
    assert home.shipped_db() in (None, Path(__file__).resolve().parents[1] / "results.duckdb")


def test_who_reads_what(clean_env):
    (clean_env / "home").mkdir()
    for name in ("shipped.duckdb", "home/pulled.duckdb"):
        write_runs(Store(clean_env / name), "x", n=1)
    first, beside = home.reading(None, None)
    assert (first.kind, [s.kind for s in beside]) == (YOURS, [PULLED, SHIPPED])
    assert home.reading(None, False)[1] == []  # --mine
    named, beside = home.reading(clean_env / "other.duckdb", None)
    assert named.kind == GIVEN and beside == []  # --db alone
    assert [s.kind for s in home.reading(clean_env / "other.duckdb", True)[1]] == [PULLED, SHIPPED]  # --shared


def _run(host: str, run_id: str | None = None, **kw) -> RunResult:
    run = dict(run_id=run_id or str(uuid7()), status="ok", created_at=T0, backend="bf16", variant="bf16",
               model_id="tiny-moe", suite_hash="s1", host=host, device="cpu", spec={"backend": "bf16"}, **kw)
    answers = [dict(record_id="r0", benchmark="nli", question="q", options=["a", "b"], probs=[0.2, 0.8], top="b",
                    gold="b", method="label_logit", truncated=False)]
    return RunResult(run, answers, [dict(seq=0, phase="suite", record_id="r0", model_ms=1.0, prep_ms=0.1, tokens=9,
                                         batch=1)])


def test_several_stores_read_as_one_your_run_first_and_an_older_one_as_migrated(tmp_path):
    mine, shipped, old = (Store(tmp_path / f"{n}.duckdb") for n in ("mine", "shipped", "old"))
    shared_id = str(uuid7())
    mine.write_run(_run("laptop", shared_id))
    shipped.write_run(_run("h200-box", shared_id))  # the same run pulled back from elsewhere
    only_shipped = shipped.write_run(_run("h200-box"))
    old.migrate(target=6)  # before answers had a modality
    con = duckdb.connect(str(old.path))
    old_id = str(uuid7())
    con.execute("INSERT INTO runs (run_id, status, created_at, backend) VALUES (?, 'ok', now(), 'bf16')", [old_id])
    con.execute("INSERT INTO answers VALUES (?, 'r1', 'b', 'q', ['a','b'], [0.4, 0.6], 'b', 'b', 'label_logit', false)",
                [old_id])
    con.close()
    both = Store(mine.path, kind=YOURS, beside=[Source(shipped.path, SHIPPED), Source(old.path, SHIPPED)])
    runs = both.read("SELECT CAST(run_id AS VARCHAR) AS id, host, role FROM runs").set_index("id")
    assert runs.loc[shared_id, "host"] == "laptop" and len(runs) == 3  # yours wins, nothing twice
    assert len(queries.answers(both, shared_id)) == 1
    assert queries.answers(both, old_id)["modality"].tolist() == ["text"]  # the default its migration gives
    sources = queries.run_sources(both).set_index("run_id")["store"].to_dict()
    assert sources == {shared_id: "your store", only_shipped: "shipped with quantbench",
                       old_id: "shipped with quantbench"}
    assert old.schema_version() == 6  # only read


def test_a_newer_store_beside_yours_is_refused_by_name(tmp_path):
    mine, future = Store(tmp_path / "mine.duckdb"), Store(tmp_path / "future.duckdb")
    write_runs(mine, "a", n=1)
    write_runs(future, "b", n=1)
    con = duckdb.connect(str(future.path))
    con.execute("INSERT INTO schema_version VALUES (?, now())", [SCHEMA_VERSION + 1])
    con.close()
    both = Store(mine.path, kind=YOURS, beside=[Source(future.path, PULLED)])
    with pytest.raises(StoreError, match=f"future.duckdb \\(pulled bundles\\) has schema version {SCHEMA_VERSION + 1}"):
        queries.run_count(both)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return ds.build(tmp_path_factory.mktemp("home") / "lab.duckdb")


def test_runs_filters_and_formats(lab):
    db = ["--db", str(lab.path)]
    done = CliRunner().invoke(app, ["runs", "--gpu", "hopper", "--variant", "int4", "--format", "json", *db])
    rows = json.loads(done.stdout)
    assert [(r["variant"], r["gpu_name"], r["source"]) for r in rows] == [("int4", "NVIDIA H200", "this store")]
    failed = CliRunner().invoke(app, ["runs", "--status", "failed", "--format", "csv", *db])
    lines = failed.stdout.strip().splitlines()
    assert len(lines) == 2 and "oom" in lines[1] and lines[0].startswith("run_id,")
    cpu = CliRunner().invoke(app, ["runs", "--gpu", "cpu", "--model", "moe-a3b", *db], env={"COLUMNS": "300"})
    assert cpu.exit_code == 0 and cpu.stdout.count("│ cpu ") == 3  # bf16, its noise floor, int4
    bad = CliRunner().invoke(app, ["runs", "--format", "xml", *db])
    assert bad.exit_code == 2 and "--format 'xml': use one of table, csv, json" in bad.output


def test_compare_takes_a_variant_the_newest_on_this_machine_first(lab, monkeypatch):
    db = ["--db", str(lab.path)]
    cpu = CliRunner().invoke(app, ["compare", "int4", "--gpu", "cpu", "--format", "json", *db])
    assert cpu.exit_code == 0, cpu.output
    assert json.loads(cpu.stdout)["candidate"]["host"] == "ci-runner"
    assert "int4: run " in cpu.stderr and "on CPU (ci-runner)" in cpu.stderr
    monkeypatch.setattr(select, "this_machine", lambda: ("NVIDIA H200", None, "NVIDIA H200 (hopper)"))
    here = CliRunner().invoke(app, ["compare", "int4", "--format", "json", *db])
    assert json.loads(here.stdout)["candidate"]["gpu_name"] == "NVIDIA H200"
    assert "(the newest on this machine, NVIDIA H200 (hopper))" in here.stderr
    named = CliRunner().invoke(app, ["compare", "int4", "--gpu", "cpu", "--reference", "bf16", "--noise-floor",
                                     "noise-floor", "--format", "json", *db])
    data = json.loads(named.stdout)
    assert data["reference"]["role"] == "reference" and data["noise_floor"]["run"]["role"] == "noise_floor"
    assert data["noise_floor"]["run"]["host"] == "ci-runner"
    nothing = CliRunner().invoke(app, ["compare", "int8", *db], env={"COLUMNS": "400"})
    assert nothing.exit_code == 2 and "no successful run matches 'int8'" in nothing.output


def test_report_opens_on_this_machine_or_says_it_shows_every_gpu(lab, monkeypatch):
    db = ["--db", str(lab.path)]
    monkeypatch.setattr(select, "this_machine", lambda: ("cpu", "ci-runner", "CPU (ci-runner)"))
    here = CliRunner().invoke(app, ["report", *db])
    assert "report: CPU (ci-runner), this machine" in here.stderr
    assert here.stdout.count("### ") == 1 and "on CPU (ci-runner)" in here.stdout
    monkeypatch.setattr(select, "this_machine", lambda: ("cpu", socket.gethostname() + "-x", "CPU (elsewhere)"))
    every = CliRunner().invoke(app, ["report", *db])
    assert "report: no runs of this machine (CPU (elsewhere))" in every.stderr and every.stdout.count("### ") > 3
    assert CliRunner().invoke(app, ["report", "--gpu", "all", *db]).stdout == every.stdout


def test_reading_flags(clean_env):
    assert _reading(None, None).kind == YOURS and _reading(clean_env / "x.duckdb", None).beside == ()
