import hashlib
import json
from pathlib import Path

import pytest

from quantbench.errors import ConfigError
from quantbench.protocol.prompt import render_prompt
from quantbench.protocol.suite import BUILTIN_SUITE, BUILTIN_SUITE_ID, load_suite
from quantbench.protocol.suitegen import DEFAULT_EVAL_SIZE, FAMILIES, dumps, generate, request_text, split_of

GOOD = {
    "id": "r1",
    "benchmark": "demo",
    "request": {
        "state": {"observation": "The player is facing a wall."},
        "questions": {"q1": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}},
    },
    "gold": {"q1": "left"},
}


def _with(**changes) -> dict:
    record = json.loads(json.dumps(GOOD))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = record
        for key in path:
            node = node[key]
        node[last] = value
    return record


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "suite.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_builtin_suite_has_300_records_in_6_families_all_with_gold():
    suite = load_suite(None)
    assert suite.id == BUILTIN_SUITE_ID
    assert len(suite.records) >= 300
    assert len(suite.benchmarks) >= 6
    assert all(r.gold and set(r.gold) == set(r.request.questions) for r in suite.records)
    kinds = {q.type for r in suite.records for q in r.request.questions.values()}
    assert kinds == {"choice", "boolean"}
    assert any(len(r.request.questions) >= 2 for r in suite.records)  # the multi-question family


def test_builtin_suite_families_are_balanced_and_interleaved():
    suite = load_suite(None)
    counts = {b: sum(r.benchmark == b for r in suite.records) for b in suite.benchmarks}
    assert max(counts.values()) - min(counts.values()) <= 1
    assert {r.benchmark for r in suite.records[: len(FAMILIES)]} == set(FAMILIES)  # --limit still covers all


def test_regenerating_the_builtin_suite_gives_identical_bytes():
    assert dumps(generate("eval", DEFAULT_EVAL_SIZE, seed=0)).encode() == BUILTIN_SUITE.read_bytes()


def test_suite_hash_is_sha256_of_the_file_bytes():
    assert load_suite(None).hash == hashlib.sha256(BUILTIN_SUITE.read_bytes()).hexdigest()


def test_train_and_eval_splits_share_no_request():
    train = generate("train", 2100, seed=0)
    eval_texts = {request_text(r.request.model_dump(mode="json", exclude_defaults=True)) for r in load_suite(None).records}
    train_texts = {request_text(r.request.model_dump(mode="json", exclude_defaults=True)) for r in train}
    assert len(train_texts) == len(train)  # no duplicates inside a split either
    assert not eval_texts & train_texts
    assert all(split_of(r.request.model_dump(mode="json", exclude_defaults=True)) == "train" for r in train)


def test_generate_is_deterministic_and_depends_on_the_seed():
    assert dumps(generate("train", 70, seed=1)) == dumps(generate("train", 70, seed=1))
    assert dumps(generate("train", 70, seed=1)) != dumps(generate("train", 70, seed=2))


def test_generate_with_family_counts():
    records = generate("train", 0, seed=0, families={"compare": 5, "facts": 2})
    assert [r.benchmark for r in records].count("compare") == 5
    assert {r.benchmark for r in records} == {"compare", "facts"}
    with pytest.raises(ValueError, match="unknown families"):
        generate("train", 0, families={"poetry": 1})
    with pytest.raises(ValueError, match="split"):
        generate("test", 10)


def test_every_builtin_prompt_renders_with_its_state():
    suite = load_suite(None)
    for record in suite.records[:50]:
        for name in record.request.questions:
            prompt = render_prompt(None, record.request, name)
            assert prompt.startswith("State:\n") and prompt.endswith("Answer:")


def test_a_user_suite_gets_its_stem_as_id_and_blank_lines_are_skipped(tmp_path):
    path = _write(tmp_path, [json.dumps(GOOD), "", "   ", json.dumps(_with(id="r2"))])
    suite = load_suite(path)
    assert suite.id == "suite"
    assert [r.id for r in suite.records] == ["r1", "r2"]
    assert suite.benchmarks == ["demo"]


MALFORMED = [
    ("bad_json", '{"id": "r9", "benchmark": ', "record: not valid JSON"),
    ("duplicate_key", '{"id": "r9", "id": "r8", "benchmark": "demo"}', "id: duplicate key 'id'"),
    ("empty_criteria", json.dumps(_with(id="r9", request__questions__q1__criteria={})), "request.questions.q1.criteria: criteria is empty"),
    ("unknown_type", json.dumps(_with(id="r9", request__questions__q1__type="ranking")), "request.questions.q1.type: unknown question type"),
    ("state_not_object", json.dumps(_with(id="r9", request__state="hello")), "request.state: state must be a JSON object"),
    ("gold_not_option", json.dumps(_with(id="r9", gold={"q1": "up"})), "gold: gold answer 'up'"),
    ("gold_unknown_question", json.dumps(_with(id="r9", gold={"q2": "left"})), "gold: gold names question 'q2'"),
    ("missing_request", json.dumps({"id": "r9", "benchmark": "demo"}), "request: is required"),
    ("not_an_object", "[1, 2]", "record: must be a JSON object"),
    ("duplicate_id", json.dumps(GOOD), "id: duplicate record id 'r1' (first on line 1)"),
]


@pytest.mark.parametrize(("line", "expected"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_line_is_named_by_file_line_and_field(tmp_path, line, expected):
    path = _write(tmp_path, [json.dumps(GOOD), "", line])
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert expected in str(err.value)


def test_too_many_options_for_max_options_names_the_criteria(tmp_path):
    five = {k: k for k in "abcde"}
    path = _write(tmp_path, [json.dumps(_with(request__questions__q1__criteria=five, gold={"q1": "a"}))])
    assert len(load_suite(path).records) == 1
    with pytest.raises(ConfigError, match=r"suite.jsonl:1: request.questions.q1.criteria: criteria has 5 options"):
        load_suite(path, max_options=4)


def test_an_empty_suite_is_refused(tmp_path):
    for content in ["", "\n\n  \n"]:
        path = tmp_path / "empty.jsonl"
        path.write_text(content)
        with pytest.raises(ConfigError, match="no records"):
            load_suite(path)


def test_a_missing_suite_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such suite file"):
        load_suite(tmp_path / "nope.jsonl")


def test_a_folder_or_a_device_given_as_the_suite_says_what_it_is(tmp_path):
    with pytest.raises(ConfigError, match="a folder, not a suite file"):
        load_suite(tmp_path)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_suite("/dev/null")


@pytest.mark.parametrize(("line", "field", "problem"), [
    ('{"id": "r9", "benchmark": "demo", "request": {"state": {"t": "a\\ud800b"}, "questions": '
     '{"q1": {"type": "boolean"}}}}', "request.state.t", "unpaired UTF-16 surrogate"),
    ('{"id": "r9", "benchmark": "demo", "request": {"state": {"t": "x"}, "questions": {"q1": {"type": "choice", '
     '"criteria": {"\\udc00": "left", "b": "right"}}}}}', "request.questions.q1.criteria: a key", "surrogate"),
    ('{"id": "r9", "benchmark": "demo", "request": {"state": {"t": [1, 1e999]}, "questions": '
     '{"q1": {"type": "boolean"}}}}', "request.state.t[1]", "number out of range"),
])
def test_text_no_tokenizer_encodes_and_infinite_numbers_are_refused_naming_the_field(tmp_path, line, field, problem):
    # json reads both; before, the run's child crashed in the tokenizer (TypeError) or rendered 'inf' to the model
    path = _write(tmp_path, [json.dumps(GOOD), line])
    with pytest.raises(ConfigError) as err:
        load_suite(path)
    assert str(err.value).startswith(f"{path}:2: {field}")
    assert problem in str(err.value)


def test_an_escaped_surrogate_pair_is_one_character_and_loads(tmp_path):
    line = json.dumps(_with(id="r9", request__state={"t": "\U0001f680"}), ensure_ascii=True)
    assert "\\ud83d\\ude80" in line
    assert load_suite(_write(tmp_path, [line])).records[0].request.state == {"t": "\U0001f680"}


@pytest.mark.parametrize(("field", "value"), [("id", ""), ("id", "   "), ("benchmark", ""), ("benchmark", "\t")])
def test_an_empty_id_or_benchmark_is_refused_naming_it(tmp_path, field, value):
    # before: loaded, and its answers stored under an empty record id or benchmark name
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, "id": "r2", field: value})])
    with pytest.raises(ConfigError, match=rf"suite.jsonl:2: {field}: {field} is empty; give every record a non-empty"):
        load_suite(path)
