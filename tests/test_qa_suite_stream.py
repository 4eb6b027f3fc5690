"""A run with --limit reads only the records it answers. Was: a 138 MB suite was parsed whole, every record validated
into objects, before --limit applied (30 s and 1.2 GB, in the run's parent and again in its child). Now the lines
past the limit are hashed and counted, never validated or kept: the suite's hash is the full read's, every error
within the limit still names its line and field, a bad record past the limit does not stop a limited run, and a
full run still refuses it before any model loads."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from quantbench.errors import ConfigError
from quantbench.protocol import suite as suite_module
from quantbench.protocol.suite import load_suite
from quantbench.run.record import SuiteFacts
from quantbench.run.runner import execute
from quantbench.run.spec import RunSpec
from quantbench.store import Store
from tests.test_suite_faults import _env, importable_tests  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {"a": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}}
BOM = b"\xef\xbb\xbf"


def _record(rid: str, obs: object = "a wall ahead", **extra: object) -> str:
    return json.dumps({"id": rid, "benchmark": "b", "request": {"state": {"obs": obs}, "questions": QUESTIONS},
                       **extra})


def _write(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return path


def _broken_past_two(tmp_path: Path) -> Path:
    """Two good records, then one of each kind of bad line a full read refuses."""
    return _write(tmp_path / "broken.jsonl", [
        _record("r0"), _record("r1"),
        '{"id": "r2", "benchmark": "b", "request": ',  # not JSON
        _record("r3", gold={"a": "up"}),  # a gold answer that is no option
        _record("r4", obs="caf#").encode().replace(b"#", b"\xfa"),  # not UTF-8
        _record("r0"),  # a duplicate id
    ])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from tests.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-moe")


# -- what is read ---------------------------------------------------------------------------------------------
def test_a_limited_read_parses_only_the_records_it_answers(tmp_path, monkeypatch):
    path = _write(tmp_path / "fifty.jsonl", [_record(f"r{i}") for i in range(50)] + ["", "  \t", "\u00a0"])
    parsed: list[str] = []
    parse = suite_module._parse_line
    monkeypatch.setattr(suite_module, "_parse_line",
                        lambda text, where, limits: parsed.append(where) or parse(text, where, limits))
    suite = load_suite(path, limit=5)
    assert parsed == [f"{path}:{line}" for line in range(1, 6)]
    assert [r.id for r in suite.records] == ["r0", "r1", "r2", "r3", "r4"] and suite.lines == [1, 2, 3, 4, 5]
    assert len(suite) == 50 and not suite.complete  # every record of the file, counted; blank lines are none


def test_a_limited_read_of_a_big_file_holds_a_line_at_a_time(tmp_path):
    path = _write(tmp_path / "big.jsonl", [_record(f"r{i}", f"wall {i} " + "x" * 300) for i in range(40_000)])
    assert path.stat().st_size > 15_000_000
    load_suite(path, limit=5)  # imports and first-call costs out of the measurement
    tracemalloc.start()
    try:
        suite = load_suite(path, limit=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(suite.records) == 5 and len(suite) == 40_000
    assert peak < 2_000_000, f"{peak:,} bytes held at the peak reading the first 5 records of a 15 MB file"


# -- the hash: the full read's ---------------------------------------------------------------------------------
def test_a_limited_read_has_the_hash_of_the_full_read(tmp_path):
    path = tmp_path / "crlf.jsonl"  # a byte order mark, CRLF endings and a blank line: all hashed as they are
    path.write_bytes(BOM + b"\r\n".join(_record(f"r{i}").encode() for i in range(6)) + b"\r\n\r\n")
    full = load_suite(path)
    assert full.hash == hashlib.sha256(path.read_bytes()).hexdigest()
    for limit in (1, 3, 6, 50):
        assert load_suite(path, limit=limit).hash == full.hash, limit


def test_the_hash_of_a_limited_read_covers_the_media_files_named_past_the_limit(tmp_path):
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(name.encode())
    escaped = _record("r2", {"type": "image", "path": "b.png"}).replace('"path"', '"pa\\u0074h"')  # the same key
    path = _write(tmp_path / "media.jsonl", [
        _record("r0"),
        _record("r1", {"type": "image", "path": "a.png"}),
        escaped,
        _record("r3", [{"type": "image", "path": "c.png"}, {"type": "image", "path": "a.png"}]),
    ])
    full = load_suite(path)
    assert full.records[2].request.media_parts() == [("state.obs", {"type": "image", "path": "b.png"})]
    assert {load_suite(path, limit=limit).hash for limit in (1, 2, 3)} == {full.hash}
    (tmp_path / "b.png").write_bytes(b"another picture")  # named only past the limit: another suite all the same
    assert load_suite(path, limit=1).hash == load_suite(path).hash != full.hash


# -- errors: within the limit named as before; past it, a limited run goes on; a full run refuses -------------
@pytest.mark.parametrize("bad, problem", [
    (_record("r1", gold={"a": "up"}), "gold: gold answer 'up' for 'a' is not one of its options"),
    (_record("r0"), "id: duplicate record id 'r0' (first on line 1); give each record its own id"),
])
def test_a_bad_record_within_the_limit_is_named_by_its_line_and_field(tmp_path, bad, problem):
    path = _write(tmp_path / "bad.jsonl", [_record("r0"), bad, _record("r2")])
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}:2: {problem}")):
        load_suite(path, limit=2)
    assert len(load_suite(path, limit=1).records) == 1  # a limit before it: the bad record is not read


def test_bytes_that_are_not_utf8_within_the_limit_name_their_line_column_and_file_offset(tmp_path):
    second = _record("r1", obs="caf#").encode().replace(b"#", b"\xfa")
    path = tmp_path / "latin.jsonl"
    path.write_bytes(BOM + _record("r0").encode() + b"\n" + second + b"\n" + _record("r2").encode() + b"\n")
    column, offset = second.index(b"\xfa") + 1, path.read_bytes().index(b"\xfa")
    with pytest.raises(ConfigError) as e:
        load_suite(path, limit=2)
    assert str(e.value) == (f"{path}:2: not UTF-8 text (byte 0xfa at column {column}, offset {offset} in the file); "
                            "save the suite as UTF-8")


def test_a_run_with_limit_answers_a_suite_whose_records_past_it_are_broken(tmp_path, checkpoint):
    path, db = _broken_past_two(tmp_path), tmp_path / "r.duckdb"
    done = subprocess.run([sys.executable, "-m", "quantbench", "run", "--backend", "tests.tiny:TinyBackend",
                           "--model", str(checkpoint), "--suite", str(path), "--limit", "2", "--gpu", "cpu",
                           "--warmup", "0", "--latency-min-decisions", "1", "--latency-min-seconds", "0",
                           "--db", str(db)], capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    row = Store(db).read("SELECT status, suite_id, suite_hash, n_records, n_questions FROM runs").iloc[0].to_dict()
    assert row == {"status": "ok", "suite_id": "broken", "suite_hash": hashlib.sha256(path.read_bytes()).hexdigest(),
                   "n_records": 2, "n_questions": 2}


@pytest.mark.parametrize("limit", [None, 3])
def test_a_run_that_reaches_a_broken_record_is_refused_before_any_model_loads(tmp_path, monkeypatch, limit):
    def refuse(*a, **k):
        raise AssertionError("a child was spawned: the suite should have been refused before")

    monkeypatch.setattr("quantbench.run.runner.subprocess.Popen", refuse)
    path = _broken_past_two(tmp_path)
    spec = RunSpec(backend="tests.tiny:TinyBackend", suite=str(path), gpu="cpu", limit=limit)
    with pytest.raises(ConfigError, match=r"broken\.jsonl:3: record: not valid JSON"):
        execute(spec, echo=False)


@pytest.mark.parametrize("other, refused", [("", False), ("limit = 3\n", True), ("limit = 1\n", False)])
def test_a_sweep_checks_its_suites_as_far_as_its_runs_read_them(tmp_path, other, refused):
    from quantbench.sweep import load_sweep

    suite = _broken_past_two(tmp_path)
    path = tmp_path / "sweep.toml"
    path.write_text(f'suites = ["{suite.name}"]\ngpus = ["cpu"]\n[defaults]\nlimit = 2\n'
                    '[[variants]]\nname = "a"\nbackend = "tests.tiny:TinyBackend"\n'
                    f'[[variants]]\nname = "b"\nbackend = "tests.tiny:TinyBackend"\nseed = 7\n{other}')
    if refused:  # variant b answers 3 records: the third is not JSON
        with pytest.raises(ConfigError, match=r"broken\.jsonl:3: record: not valid JSON"):
            load_sweep(path)
    else:
        assert load_sweep(path).suites == [str(suite)]


# -- counts ----------------------------------------------------------------------------------------------------
def test_a_limited_suite_counts_what_a_run_answers_and_refuses_to_give_more(tmp_path):
    path = _write(tmp_path / "ten.jsonl", [_record(f"r{i}") for i in range(10)])
    full, limited = load_suite(path), load_suite(path, limit=3)
    assert SuiteFacts.of(limited, 3) == SuiteFacts.of(full, 3)  # what every run row records
    assert (len(limited), len(full)) == (10, 10) and full.complete
    for more in (None, 4):
        with pytest.raises(ValueError, match="only the first 3 of 10 records were read"):
            limited.first(more)
    with pytest.raises(ValueError):
        limited.benchmarks  # noqa: B018 - the families of records it did not read
    assert load_suite(path, limit=10).complete and load_suite(path, limit=12).first(None) == full.records


def test_the_parent_reads_an_unchanged_suite_once_for_all_its_runs(tmp_path, monkeypatch):
    # `run --repeat N` (and a local sweep) parsed the suite in the parent N + 1 times: run's preflight, then each
    # run's before its child (~25 s and 1.2 GB each on a 300,000-record file).
    from quantbench.run import runner

    reads = []
    real = suite_module.load_suite
    monkeypatch.setattr(suite_module, "load_suite", lambda *a, **k: reads.append(a) or real(*a, **k))
    monkeypatch.setattr(runner, "_last_suite", None)
    path = _write(tmp_path / "s.jsonl", [_record(f"r{i}") for i in range(4)])
    spec = RunSpec(backend="tests.tiny:TinyBackend", suite=str(path), gpu="cpu", limit=2)
    for _ in range(3):
        runner.preflight(spec)
    assert len(reads) == 1
    _write(path, [_record(f"r{i}") for i in range(5)])  # another file now: read again, and its count is new
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert len(runner._suite_of(spec)) == 5 and len(reads) == 2
    runner.preflight(RunSpec(backend="tests.tiny:TinyBackend", suite=str(path), gpu="cpu", limit=3))
    assert len(reads) == 3  # another limit reads another part of it
