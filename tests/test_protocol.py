"""Every invalid request is refused with a message that names the field at fault."""

import pytest

from quantbench.errors import RequestError
from quantbench.protocol import parse_request

CARD_EXAMPLE = {
    "model": "clef-omni",
    "state": {"observation": "The player is facing a wall."},
    "questions": {"action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right",
                                                              "forward": "Move forward"}}},
}


def q(question: dict) -> dict:
    return {"state": {"x": 1}, "questions": {"q1": question}}


def test_reference_card_example_is_valid():
    req = parse_request(CARD_EXAMPLE)
    assert req.questions["action"].options == ["left", "right", "forward"]


def test_boolean_question_has_yes_and_no():
    assert parse_request(q({"type": "boolean"})).questions["q1"].options == ["yes", "no"]


@pytest.mark.parametrize(
    "data, field, words",
    [
        (q({"type": "choice", "criteria": {}}), "questions.q1.criteria", "empty"),
        (q({"type": "choice"}), "questions.q1.criteria", "empty"),
        (q({"type": "choice", "criteria": {"a": "x"}}), "questions.q1.criteria", "one option"),
        (q({"type": "choice", "criteria": {"yes": "1", "YES": "2"}}), "questions.q1.criteria", "the same option"),
        (q({"type": "choice", "criteria": {" ": "1", "b": "2"}}), "questions.q1.criteria", "empty option key"),
        (q({"type": "ranking", "criteria": {"a": "1", "b": "2"}}), "questions.q1.type", "unknown question type"),
        (q({"type": "choice", "criteria": {str(i): "o" for i in range(33)}}), "questions.q1.criteria", "limit of 32"),
        (q({"type": "boolean", "criteria": {"a": "1", "b": "2"}}), "questions.q1.criteria", "yes and no"),
        (q({"type": "choice", "criteria": {"a": "1", "b": 2}}), "questions.q1.criteria.b", "string"),
        ({"state": "hello", "questions": {"q1": {"type": "boolean"}}}, "state", "JSON object"),
        ({"state": [1, 2], "questions": {"q1": {"type": "boolean"}}}, "state", "JSON object"),
        ({"questions": {"q1": {"type": "boolean"}}}, "state", "required"),
        ({"state": {}, "questions": {}}, "questions", "empty"),
        ({"state": {}, "questions": {"q1": {"type": "boolean"}}, "temperature": 0}, "temperature", "not a known field"),
        (q({"type": "boolean", "weight": 2}), "questions.q1.weight", "not a known field"),
    ],
)
def test_invalid_request_names_the_field(data, field, words):
    with pytest.raises(RequestError) as e:
        parse_request(data)
    assert e.value.field == field
    assert words in str(e.value)


def test_max_options_is_configurable():
    data = q({"type": "choice", "criteria": {str(i): "o" for i in range(5)}})
    parse_request(data, max_options=5)
    with pytest.raises(RequestError, match="over the limit of 4"):
        parse_request(data, max_options=4)


def test_duplicate_json_keys_are_refused():
    text = '{"state": {}, "questions": {"a": {"type": "boolean"}, "a": {"type": "boolean"}}}'
    with pytest.raises(RequestError, match="duplicate key 'a'"):
        parse_request(text)


def test_invalid_json_text_says_where():
    with pytest.raises(RequestError, match="not valid JSON.*line 1"):
        parse_request('{"state": {}, "questions": ')


def test_media_fields_are_found_by_shape_not_by_key():
    part = {"type": "image", "data": "data:image/png;base64,iVBORw0KGgo="}
    req = parse_request({"state": {"image": "a red door", "camera": part, "text": "hi"},
                         "questions": {"q": {"type": "boolean"}}})
    assert req.media_fields() == ["state.camera"]


def test_limits_are_checked_on_the_counts_before_any_field_is_validated():
    from quantbench.protocol import LimitError, Limits

    limits = Limits(max_options=8, max_questions=5, max_total_options=10)
    cases = [
        ({f"q{i}": {"type": "boolean", "bad": 1} for i in range(10_000)}, "questions", 5, 413, "--max-questions"),
        ({"q": {"type": "choice", "criteria": {str(i): "o" for i in range(9)}}}, "questions.q.criteria", 8, 422,
         "--max-options"),
        ({f"q{i}": {"type": "boolean"} for i in range(4)} | {"c": {"type": "choice", "criteria": {"a": "", "b": "",
                                                                                                "c": ""}}},
         "questions", 10, 413, "--max-total-options"),
    ]
    for questions, field, limit, status, flag in cases:
        with pytest.raises(LimitError) as e:
            parse_request({"state": {}, "questions": questions}, limits=limits)
        assert (e.value.field, e.value.limit, e.value.status, e.value.flag) == (field, limit, status, flag)
        assert flag in str(e.value)
    parse_request({"state": {}, "questions": {f"q{i}": {"type": "boolean"} for i in range(4)}}, limits=limits)
