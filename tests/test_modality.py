"""Every stored answer knows its modality: quantbench.protocol.modality_of, store schema 7's `answers.modality`
(older rows read text), the pairing that carries it, and export / merge that keep it."""

import datetime as dt

import duckdb
import pytest

from quantbench.analysis import stats as an
from quantbench.errors import RequestError
from quantbench.protocol import SuiteRecord, modality_of, parse_request
from quantbench.run.record import AnswerRow, RunResult, uuid7
from quantbench.store import SCHEMA_VERSION, Store, queries, transfer

PNG = "data:image/png;base64,iVBORw0KGgo="
WAV = "data:audio/wav;base64,UklGRg=="
Q = {"q": {"type": "boolean"}}


@pytest.mark.parametrize(("state", "expected"), [
    ({"observation": "a wall"}, "text"),
    ({"observation": {"type": "note", "text": "an object, not a part"}}, "text"),
    ({"camera": {"type": "image", "data": PNG}, "note": "left"}, "image"),
    ({"views": ["left:", {"type": "image", "data": PNG}, {"type": "image", "path": "b.png"}]}, "image"),
    ({"mic": {"type": "audio", "data": WAV}}, "audio"),
    ({"clip": {"type": "video", "frames": [PNG, PNG], "fps": 2}}, "video"),
    ({"camera": {"type": "image", "data": PNG}, "mic": {"type": "audio", "data": WAV}}, "mixed"),
    ({"views": [{"type": "video", "frames": [PNG], "fps": 1}, {"type": "image", "data": PNG}]}, "mixed"),
])
def test_modality_of_reads_the_media_parts_types(state, expected):
    assert modality_of(state) == expected
    request = parse_request({"state": state, "questions": Q}) if "path" not in str(state) else None
    if request is not None:  # a request and a suite record say the same as their state
        assert modality_of(request) == expected
        assert modality_of(SuiteRecord(id="r", benchmark="b", request=request)) == expected


def test_modality_of_an_unknown_media_type_names_the_field():
    with pytest.raises(RequestError, match=r"state\.x\.type"):
        modality_of({"x": {"type": "smell", "data": "data:x/y;base64,AA=="}})


def _run(**kw):
    return {"run_id": str(uuid7()), "status": "ok", "created_at": dt.datetime.now(dt.UTC), "backend": "bf16", **kw}


def _answer(record_id, modality=None):
    row = dict(record_id=record_id, benchmark="b", question="q", options=["a", "b", "c"], probs=[0.2, 0.3, 0.5],
               top="c", gold="c", method="label_logit", truncated=False)
    return row if modality is None else {**row, "modality": modality}


def test_answers_store_their_modality_and_queries_return_it(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    rid = store.write_run(RunResult(_run(), [_answer("r1", "image"), _answer("r2", "mixed"), _answer("r3")]))
    got = queries.answers(store, rid)
    assert dict(zip(got.record_id, got.modality, strict=True)) == {"r1": "image", "r2": "mixed", "r3": "text"}
    with pytest.raises(ValueError, match="modality"):
        AnswerRow(**_answer("r4", "smell"))


def test_a_schema_6_store_migrates_and_its_answers_read_text(tmp_path):
    path = tmp_path / "old.duckdb"
    assert Store(path).migrate(target=6) == 6
    con = duckdb.connect(str(path))
    rid = str(uuid7())
    con.execute("INSERT INTO runs (run_id, status, created_at, backend) VALUES (?, 'ok', now(), 'bf16')", [rid])
    con.execute("INSERT INTO answers VALUES (?, 'r1', 'b', 'q', ['a','b'], [0.4, 0.6], 'b', 'b', 'label_logit', false)",
                [rid])
    con.close()
    store = Store(path)
    assert store.schema_version() == 6 and SCHEMA_VERSION >= 7
    new = store.write_run(RunResult(_run(), [_answer("r1", "audio")]))
    assert store.schema_version() == SCHEMA_VERSION
    assert queries.answers(store, rid).modality.tolist() == ["text"]
    assert queries.answers(store, new).modality.tolist() == ["audio"]


def test_export_and_merge_carry_modality_and_an_older_source_reads_text(tmp_path):
    src = Store(tmp_path / "src.duckdb")
    rid = src.write_run(RunResult(_run(), [_answer("r1", "video"), _answer("r2")]))
    [out] = transfer.export(src, tmp_path / "src.parquet")
    dst = Store(tmp_path / "dst.duckdb")
    transfer.merge(dst, [out])
    assert queries.answers(dst, rid).modality.tolist() == ["video", "text"]
    # a schema-6 store merged into a schema-7 one: its answers take the column's default
    old = tmp_path / "old.duckdb"
    Store(old).migrate(target=6)
    con = duckdb.connect(str(old))
    oid = str(uuid7())
    con.execute("INSERT INTO runs (run_id, status, created_at, backend) VALUES (?, 'ok', now(), 'bf16')", [oid])
    con.execute("INSERT INTO answers VALUES (?, 'r1', 'b', 'q', ['a','b'], [0.4, 0.6], 'b', 'b', 'label_logit', false)",
                [oid])
    con.close()
    transfer.merge(dst, [old])
    assert queries.answers(dst, oid).modality.tolist() == ["text"]


def test_pair_carries_the_modality_and_reads_text_without_the_column(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    ref = store.write_run(RunResult(_run(), [_answer("r1", "image"), _answer("r2")]))
    answers = queries.answers(store, ref)
    paired = an.pair(answers, answers)
    assert dict(zip(paired.record_id, paired.modality, strict=True)) == {"r1": "image", "r2": "text"}
    legacy = answers.drop(columns="modality")
    assert an.pair(legacy, legacy).modality.tolist() == ["text", "text"]
