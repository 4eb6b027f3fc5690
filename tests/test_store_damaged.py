"""A store file someone else damaged: a table or column dropped by another tool, or the file cut short by a copy
that did not finish. Every command that reads or writes it (report in each format, runs, compare, merge from it or
into it) and the dashboard refuse it in one line naming the file, what it lacks and the fix: never a traceback
from inside a query (before, `report` printed DuckDB's "Python Object "answers" of type "function" found ... not
suitable for replacement scans" traceback, and a cut-short file an IO Error traceback)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.store import Store
from tests import dashboard_store as ds

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "streamlit_app.py")


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    return ds.build(tmp_path_factory.mktemp("whole") / "results.duckdb").path


def _damaged(whole: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    """A copy of the test store damaged `how`, and the words the refusal must hold."""
    path = tmp_path / f"{how}.duckdb"
    shutil.copy(whole, path)
    if how == "cut":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
        return path, "is cut short"
    con = duckdb.connect(str(path))
    try:
        if how == "no-table":
            con.execute("DROP VIEW run_summary; DROP VIEW run_accuracy; DROP TABLE answers")
            return path, "table answers"
        con.execute("DROP VIEW run_summary; ALTER TABLE runs DROP COLUMN role")
        return path, "column runs.role"
    finally:
        con.close()


def _refused(args: list[str], words: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    out = result.output
    assert result.exit_code == 2, (args, out, result.exception)
    assert "Traceback" not in out and not isinstance(result.exception, duckdb.Error), (args, out)
    for w in words:
        assert w in out.replace("\n", " "), (args, w, out)
    return out


@pytest.mark.parametrize("how", ["no-table", "no-column", "cut"])
def test_every_command_refuses_a_damaged_store_naming_what_it_lacks(whole, tmp_path, how):
    path, what = _damaged(whole, tmp_path, how)
    for fmt in ("markdown", "csv", "json"):
        _refused(["report", "--db", str(path), "--gpu", "all", "--format", fmt], [path.name, what, "backup"])
    _refused(["runs", "--db", str(path)], [path.name, what])
    _refused(["compare", "int4", "--db", str(path)], [path.name, what])
    _refused(["merge", str(path), "--db", str(tmp_path / "new.duckdb")], [path.name, what])
    target = tmp_path / "target.duckdb"
    shutil.copy(path, target)
    _refused(["merge", str(whole), "--db", str(target)], [target.name, what])


def test_a_run_into_a_cut_short_store_is_refused_before_it_starts(whole, tmp_path):
    path, what = _damaged(whole, tmp_path, "cut")
    with pytest.raises(Exception, match=what):
        Store(path).check_writable()


def test_the_dashboard_says_what_is_wrong_with_a_damaged_store(whole, tmp_path, monkeypatch):
    path, what = _damaged(whole, tmp_path, "no-table")
    monkeypatch.setenv("QUANTBENCH_DB", str(path))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, at.exception[0].message
    shown = " ".join(e.value for e in [*at.error, *at.info, *at.warning])
    assert what in shown and path.name in shown


def test_a_whole_store_is_read_as_before(whole):
    result = CliRunner().invoke(app, ["report", "--db", str(whole), "--gpu", "all", "--format", "csv"])
    assert result.exit_code == 0, result.output


def test_a_duckdb_file_with_tables_but_no_schema_version_is_refused_before_a_run(tmp_path):
    """Made by another tool, or a store whose version table was dropped: before, the first write tried to make the
    tables and failed with DuckDB's 'Table with name "runs" already exists!' (and left its transaction open)."""
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE runs (x INTEGER); INSERT INTO runs VALUES (1)")
    con.close()
    with pytest.raises(Exception, match=r"holds tables \(runs\) but no schema_version: not a quantbench store"):
        Store(path).check_writable()
    con = duckdb.connect(str(path))
    assert con.execute("SELECT * FROM runs").fetchall() == [(1,)]  # left as it was
    con.close()
