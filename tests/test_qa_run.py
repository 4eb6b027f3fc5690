"""`run`, `demo`, `sweep`, `runs` and `compare` as a new user meets them with bad input: each mistake is one line
naming the flag, variable, file or key and the fix (exit 2, no traceback), and nothing is run or lost for it."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from quantbench.cli import app
from quantbench.errors import ConfigError
from quantbench.run.machine import detect
from quantbench.run.record import RunResult, uuid7
from quantbench.run.settings import refusal
from quantbench.store import Store
from quantbench.sweep import LocalExecutor, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--backend", "tests.tiny:TinyBackend", "--gpu", "cpu", "--limit", "2", "--warmup", "0",
        "--latency-min-decisions", "0", "--latency-min-seconds", "0"]


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    # a child imports tests.tiny by path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def one_line_refusal(done, *words: str) -> str:
    """The refusal's text, asserting it is an exit 2 with one `error:` line holding `words`, and no traceback."""
    text = " ".join(done.output.split())
    assert done.exit_code == 2, (done.exit_code, done.output, done.exception)
    assert "Traceback" not in done.output and "error:" in text, done.output
    for word in words:
        assert word in text, (word, done.output)
    return text


def _ok_row(store: Store) -> None:
    machine = detect()
    store.write_run(RunResult(run={**machine.as_row(), "run_id": str(uuid7()), "created_at": "2026-11-29 10:00:00+00",
                                   "status": "ok", "backend": "bf16", "spec_hash": "x"}))


# -- rich markup in messages ------------------------------------------------------------------------------------
def test_an_error_naming_a_path_with_brackets_is_one_line_not_a_markup_traceback(tmp_path):
    """Was: `run --db '/tmp/[/x]/a.duckdb'` (and `compare '[/x]'`) raised rich's MarkupError: a traceback instead of
    the refusal, which named the path with its brackets eaten."""
    db = tmp_path / "[/x]" / "a.duckdb"
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY, "--db", str(db)]), "--db", "[/x]", "does not exist")
    store = Store(tmp_path / "r.duckdb")
    _ok_row(store)
    one_line_refusal(CliRunner().invoke(app, ["compare", "[/x]", "--db", str(store.path)]), "'[/x]'")


def test_a_sweep_file_error_keeps_its_brackets(tmp_path):
    """Was: `variants: no variants; add at least one [] table`: rich took [[variants]] for markup."""
    path = tmp_path / "s.toml"
    path.write_text('suites = ["builtin"]\n')
    one_line_refusal(CliRunner().invoke(app, ["sweep", str(path), "--db", str(tmp_path / "r.duckdb")]),
                     "add at least one [[variants]] table")


def test_a_sweep_variant_named_like_markup_runs_and_is_stored(tmp_path):
    """Was: name = "ref [/x]" raised MarkupError in the progress lines, stopping the sweep (after its first run
    was stored, on a terminal) with a traceback."""
    suite = tmp_path / "mini.jsonl"
    suite.write_text(json.dumps({"id": "r0", "benchmark": "mini", "request": {
        "state": {"observation": "wall"}, "questions": {"q": {"type": "boolean"}}}}) + "\n")
    path = tmp_path / "s.toml"
    path.write_text(f'name = "[bold]sweep"\nsuites = ["{suite}"]\n[defaults]\nwarmup = 0\nlatency_min_decisions = 0\n'
                    'latency_min_seconds = 0.0\n[[variants]]\nname = "ref [/x] [red]"\n'
                    'backend = "tests.tiny:TinyBackend"\n')
    shown = io.StringIO()
    store = Store(tmp_path / "r.duckdb")
    outcome = run_sweep(load_sweep(path), LocalExecutor(), store, console=Console(file=shown, width=200))
    assert (outcome.ok, outcome.failed) == (1, 0)
    text = shown.getvalue()
    assert "▶ ref [/x] [red] · " in text and "✓ ref [/x] [red] · " in text and "sweep [bold]sweep:" in text


# -- bounds ---------------------------------------------------------------------------------------------------------
def test_repeat_past_its_bound_is_refused_before_any_run(tmp_path):
    """Was: --repeat 2147483648 ran its first run, then lost it: the store's INTEGER repeat_count refused the row
    ("TransactionContext Error: Current transaction is aborted")."""
    db = tmp_path / "r.duckdb"
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY, "--repeat", "2147483648", "--db", str(db)]),
                     "--repeat 2147483648", "1 to 1000")
    assert not db.exists()


def test_concurrency_past_its_bound_is_refused_before_any_run(tmp_path):
    """Was: --concurrency 100000 --limit 2 filled its warm-up batches by cycling the suite: a forward pass of
    100,000 decisions, an `oom` row after minutes of allocating."""
    db = tmp_path / "r.duckdb"
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY, "--concurrency", "100000", "--db", str(db)]),
                     "--concurrency 100000", "1024 or fewer")
    assert not db.exists()


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_non_finite_latency_min_seconds_is_refused(value):
    """Was: nan passed `value < 0` (the run went on as if 0); inf made a latency phase that never ends (a timeout
    row half an hour later). An infinite --timeout stays allowed (no deadline)."""
    assert "--latency-min-seconds" in (refusal("latency_min_seconds", value) or "")
    assert refusal("timeout_s", math.inf) is None and refusal("timeout_s", math.nan)


# -- the sweep file -----------------------------------------------------------------------------------------------
GOOD = '[[variants]]\nbackend = "bf16"\n'


@pytest.mark.parametrize("text, expected", [
    ("repeats = 3000000000\n" + GOOD, "repeats: must be 1 to 1000, got 3000000000"),  # was: planned until out of memory
    ("[defaults]\nlatency_min_seconds = nan\n" + GOOD, "defaults.latency_min_seconds: must be a finite number"),
    ("[defaults]\nlatency_min_seconds = inf\n" + GOOD, "defaults.latency_min_seconds: must be a finite number"),
])
def test_sweep_settings_past_their_bounds_are_refused(tmp_path, text, expected):
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        load_sweep(path)


def test_a_sweep_file_with_a_bom_is_read(tmp_path):
    """Was: `not valid TOML: Invalid statement (at line 1, column 1)` for a file a Windows editor saved (a suite
    file with a BOM is read)."""
    path = tmp_path / "s.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert [v.backend for v in load_sweep(path).variants] == ["bf16"]


def test_a_binary_or_folder_sweep_file_is_one_line(tmp_path):
    """Was: a traceback (UnicodeDecodeError) for a file that is not UTF-8; a folder was `no such sweep file`."""
    path = tmp_path / "s.toml"
    path.write_bytes(b"\xe3\x00\xff binary")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        load_sweep(path)
    with pytest.raises(ConfigError, match="a folder, not a sweep file"):
        load_sweep(tmp_path)


# -- compare --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [[""], [" "], ["bf16", "--reference", ""]])
def test_compare_with_an_empty_run_id_is_refused(tmp_path, args):
    """Was: `compare ""` matched every run and compared the newest run of any variant."""
    store = Store(tmp_path / "r.duckdb")
    _ok_row(store)
    one_line_refusal(CliRunner().invoke(app, ["compare", *args, "--db", str(store.path)]), "is empty",
                     "give a run id")


# -- --db, $QUANTBENCH_DB, $QUANTBENCH_HOME, $QUANTBENCH_CACHE ----------------------------------------------------
def test_a_db_that_is_a_folder_is_refused_naming_the_flag_and_the_fix(tmp_path, monkeypatch):
    """Was: `cannot open DIR: IO Error: Could not read from file "DIR": Is a directory`, naming neither."""
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY, "--db", str(tmp_path)]), "--db", "a folder",
                     str(tmp_path / "results.duckdb"))
    one_line_refusal(CliRunner().invoke(app, ["runs", "--db", str(tmp_path)]), "--db", "a folder")
    monkeypatch.setenv("QUANTBENCH_DB", str(tmp_path))
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY]), "$QUANTBENCH_DB", "a folder")


def test_a_quantbench_home_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    """Was: a FileExistsError traceback from making the store's folder."""
    home = tmp_path / "home"
    home.write_text("x")
    monkeypatch.setenv("QUANTBENCH_HOME", str(home))
    monkeypatch.delenv("QUANTBENCH_DB", raising=False)
    one_line_refusal(CliRunner().invoke(app, ["run", *TINY]), "$QUANTBENCH_HOME", "not a folder")


@pytest.mark.parametrize("command", [["run", "--gpu", "cpu", "--limit", "2"], ["demo", "--limit", "2"]])
def test_a_quantbench_cache_that_is_a_file_is_refused_before_any_run(tmp_path, monkeypatch, command):
    """Was: `run` stored a `failed: crashed` run (NotADirectoryError building the embedded model) and `demo`
    ended in a traceback."""
    cache = tmp_path / "cache"
    cache.write_text("x")
    monkeypatch.setenv("QUANTBENCH_CACHE", str(cache / "sub"))
    db = tmp_path / "r.duckdb"
    one_line_refusal(CliRunner().invoke(app, [*command, "--db", str(db)]), "$QUANTBENCH_CACHE", "not a folder")
    assert not db.exists()
