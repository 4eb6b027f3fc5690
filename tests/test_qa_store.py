"""QA of the results store and of what moves results between machines (merge, export, publish, pull, migrate): a
user's data at stake in partial, old, damaged or oddly placed stores. Each test names what a user saw before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.store import Store, StoreError, transfer
from tests.test_qa_run import one_line_refusal
from tests.test_transfer import counts, write_runs


def _cli(*args: str):
    return CliRunner().invoke(app, [*args])


def _old_store(tmp_path: Path, version: int) -> tuple[Path, list[str]]:
    """A store at schema `version` holding three bf16 runs (as write_runs makes them), and their ids."""
    src = Store(tmp_path / "current.duckdb")
    ids = write_runs(src, "old-box", n=3)
    path = tmp_path / f"v{version}.duckdb"
    Store(path).migrate(version)
    con = duckdb.connect(str(path))
    try:
        con.execute(f"ATTACH '{src.path}' AS s (READ_ONLY)")
        for table in ("runs", "answers", "latencies"):
            cols = ", ".join(f'"{r[0]}"' for r in con.execute(f"DESCRIBE {table}").fetchall())
            con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM s.{table}")
    finally:
        con.close()
    return path, ids


# -- a store of an older schema, read alone -------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 5])
def test_a_store_from_before_schema_7_read_alone_compares_reports_and_recommends(tmp_path, version):
    """Was: `compare`, `report` and `recommend --db OLD` raised DuckDB's Binder Error traceback (no column
    answers.modality, runs.role): the queries name this schema's columns. It reads as if migrated, unchanged."""
    path, (cand, ref, floor) = _old_store(tmp_path, version)
    before = path.read_bytes()
    for args in (["compare", cand, "--reference", ref, "--noise-floor", floor, "--format", "json"],
                 ["report", "--gpu", "all", "--format", "json"], ["report", "--gpu", "all", "--format", "csv"],
                 ["recommend", "--gpu", "all"], ["runs", "--format", "json"]):
        done = _cli(*args, "--db", str(path))
        assert done.exit_code in (0, 1) and done.exception is None or isinstance(done.exception, SystemExit), \
            (args, done.output, done.exception)
        assert "Traceback" not in done.output and "Binder Error" not in done.output, (args, done.output)
    parity = json.loads(_cli("compare", cand, "--reference", ref, "--noise-floor", floor, "--format", "json",
                             "--db", str(path)).output)
    assert parity["candidate"]["run_id"] == cand
    assert path.read_bytes() == before and Store(path).schema_version() == version  # read only: not migrated


# -- partial sources --------------------------------------------------------------------------------------------------
def test_a_source_with_answers_of_a_run_it_lacks_is_refused_and_adds_nothing(tmp_path):
    """Was: a store whose run row was deleted (its answers and latencies left) merged "successfully": the runs
    table said 1 added, and the other run's answers and latencies were dropped without a word."""
    src = Store(tmp_path / "src.duckdb")
    gone, kept = write_runs(src, "box", n=2)
    con = duckdb.connect(str(src.path))
    con.execute("DELETE FROM runs WHERE run_id = ?", [gone])
    con.close()
    dst = Store(tmp_path / "dst.duckdb")
    with pytest.raises(StoreError, match=f"run\\(s\\) {gone} that it holds no run row of") as e:
        transfer.merge(dst, [src.path])
    assert "quantbench export --db" in str(e.value)
    assert counts(dst) == [0, 0, 0]
    # the fix it names works: an export carries whole runs only
    [out] = transfer.export(src, tmp_path / "whole.parquet")
    assert transfer.merge(dst, [out]).runs_added == 1 and counts(dst) == [1, 2, 3]
    assert dst.read("SELECT CAST(run_id AS VARCHAR) AS r FROM runs")["r"].tolist() == [kept]


# -- migrate ------------------------------------------------------------------------------------------------------
def test_migrate_of_a_store_that_is_not_there_says_so_and_makes_nothing(tmp_path):
    """Was: a mistyped --db made a new empty store and printed "schema version 0 → 9"; in a folder that does not
    exist, DuckDB's IO Error traceback."""
    missing = tmp_path / "typo.duckdb"
    one_line_refusal(_cli("migrate", "--db", str(missing)), "no results store at", "nothing to migrate")
    assert not missing.exists()
    one_line_refusal(_cli("migrate", "--db", str(tmp_path / "no" / "x.duckdb")), "no results store at")


def test_migrate_brings_every_old_version_up_and_keeps_its_rows(tmp_path):
    (tmp_path / "[x]").mkdir()  # a path with brackets is printed as written (was read as a style and dropped)
    path, ids = _old_store(tmp_path / "[x]", 1)
    done = _cli("migrate", "--db", str(path))
    assert done.exit_code == 0 and "[x]/v1.duckdb: schema version 1 → 9" in "".join(done.output.split("\n")), done.output
    assert Store(path).schema_version() == 9 and counts(Store(path)) == [3, 6, 9]


def test_a_stale_write_ahead_log_is_named_with_the_fix(tmp_path):
    """Was: `cannot open X: IO Error: Failure while replaying WAL file ...: WAL does not match database file.`
    (merge added "if another process holds it, wait"): the log is the culprit, and moving it away the fix."""
    other = Store(tmp_path / "other.duckdb")
    write_runs(other, "box", n=1)
    script = (f"import duckdb, os; c = duckdb.connect({str(other.path)!r}); "
              "c.execute('PRAGMA disable_checkpoint_on_shutdown'); c.execute(\"UPDATE runs SET variant = 'x'\"); "
              "os._exit(0)")
    subprocess.run(["python", "-c", script], check=True)
    wal = Path(f"{other.path}.wal")
    assert wal.exists()
    store = Store(tmp_path / "mine.duckdb")
    write_runs(store, "box", n=1)
    shutil.copy(wal, f"{store.path}.wal")  # a log left from another copy of the file
    for args in (["runs"], ["migrate"], ["report", "--gpu", "all"]):
        one_line_refusal(_cli(*args, "--db", str(store.path)), f"{store.path}.wal", "move", "away")
    one_line_refusal(_cli("merge", str(store.path), "--db", str(tmp_path / "into.duckdb")), f"{store.path}.wal",
                     "move")


# -- export and publish to where nothing can be written ------------------------------------------------------------
def test_export_to_a_folder_it_cannot_make_is_one_line(tmp_path):
    """Was: a NotADirectoryError (or, on a read-only disk, DuckDB's IO Error) traceback."""
    store = Store(tmp_path / "r.duckdb")
    write_runs(store, "box", n=1)
    (tmp_path / "a-file").write_text("x")
    one_line_refusal(_cli("export", "--db", str(store.path), "--out", str(tmp_path / "a-file" / "x.parquet")),
                     "--out", "cannot write it")
    assert not list(tmp_path.rglob("*.partial"))


def test_export_reads_the_store_without_writing_it(tmp_path):
    """Was: export opened the store to write (a CHECKPOINT, and the migration of an older store): a store on a
    read-only disk, or the shipped results, could not be exported, and an old store was changed by an export."""
    path, ids = _old_store(tmp_path, 3)
    before = path.read_bytes()
    [out] = transfer.export(Store(path), tmp_path / "old.parquet")
    assert path.read_bytes() == before and not Path(f"{path}.wal").exists()
    dst = Store(tmp_path / "dst.duckdb")
    assert transfer.merge(dst, [out]).runs_added == 3 and counts(dst) == [3, 6, 9]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a read-only filesystem (root ignores a folder's mode bits: a tmpfs mounted read-only)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs here ({done.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_publish_and_export_into_a_read_only_folder_are_one_line(tmp_path, read_only_folder):
    """Was: publish raised an OSError traceback from making its private folder, export DuckDB's IO Error."""
    store = Store(tmp_path / "r.duckdb")
    write_runs(store, "box", n=1)
    for out in ("bundle", "bundle.tar.gz"):
        one_line_refusal(_cli("publish", "--db", str(store.path), "--out", str(read_only_folder / out)),
                         "--out", "cannot write in")
    one_line_refusal(_cli("export", "--db", str(store.path), "--out", str(read_only_folder / "x.parquet")),
                     "--out", "cannot write it")


# -- pull --db ------------------------------------------------------------------------------------------------------
def test_pull_into_a_db_that_is_a_folder_names_the_flag_and_the_fix(tmp_path):
    """Was: `cannot open DIR: IO Error: Could not read from file "DIR": Is a directory` (every other command
    names --db and a file to give)."""
    store = Store(tmp_path / "r.duckdb")
    write_runs(store, "box", n=1)
    assert _cli("publish", "--db", str(store.path), "--out", str(tmp_path / "b")).exit_code == 0
    (tmp_path / "folder").mkdir()
    one_line_refusal(_cli("pull", str(tmp_path / "b"), "--db", str(tmp_path / "folder")), "--db", "a folder",
                     "results.duckdb")


# -- stored text shown as text --------------------------------------------------------------------------------------
def test_stored_names_and_paths_with_brackets_are_shown_as_written(tmp_path):
    """Was: a run of a sweep variant named "ref [/x]" made `quantbench runs` and `merge` raise MarkupError (a
    traceback); a noise-floor run's " [noise floor]" mark and a path's "[x]" vanished as unknown styles."""
    folder = tmp_path / "[x] runs"
    folder.mkdir()
    src = Store(folder / "src.duckdb")
    first, second = write_runs(src, "box", n=2)
    con = duckdb.connect(str(src.path))
    con.execute("UPDATE runs SET variant = 'ref [/x] [red]' WHERE run_id = ?", [first])
    con.execute("UPDATE runs SET role = 'noise_floor' WHERE run_id = ?", [second])
    con.close()
    shown = _cli("runs", "--db", str(src.path))
    assert shown.exit_code == 0, (shown.output, shown.exception)
    text = shown.output
    assert "ref [/x] [red]" in text and "bf16 [noise floor]" in text and "[x] runs" in text, text
    merged = _cli("merge", str(src.path), "--db", str(folder / "into.duckdb"))
    assert merged.exit_code == 0, (merged.output, merged.exception)
    assert "ref [/x] [red]" in merged.output and "Merged into" in merged.output
    assert "[x] runs" in " ".join(merged.output.split())
    exported = _cli("export", "--db", str(src.path), "--out", str(folder / "e.parquet"))
    assert exported.exit_code == 0 and "[x] runs/e.parquet" in exported.output, exported.output
    sources = _cli("sources", "--db", str(src.path))
    assert "[x] runs" in " ".join(sources.output.split()), sources.output


def test_merging_a_folder_that_holds_a_published_bundle_says_to_pull_it(tmp_path):
    # `merge FOLDER` walked into a published bundle and refused its per-table runs.parquet as "not a quantbench
    # export", with no word of the command that takes a bundle.
    store = Store(tmp_path / "r.duckdb")
    write_runs(store, "box", n=1)
    shared = tmp_path / "shared"
    shared.mkdir()
    done = _cli("publish", "--db", str(store.path), "--out", str(shared / "h200-bundle"))
    assert done.exit_code == 0, done.output
    target = Store(tmp_path / "mine.duckdb")
    with pytest.raises(StoreError, match=r"h200-bundle: a result bundle .* `quantbench pull .*h200-bundle`"):
        transfer.merge(target, [shared])
    out = _cli("merge", str(shared), "--db", str(target.path))
    one_line_refusal(out, "a result bundle", "quantbench pull")
