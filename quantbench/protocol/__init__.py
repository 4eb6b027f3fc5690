"""The decision protocol: one request (a state plus choice questions) in, per-option probabilities out.

It is the JSON of the SystemOne API in the reference card, and these pydantic classes are its only definition:
the runner, the suites, the HTTP server and the http backend all use them.

    {"model": "clef-omni",
     "state": {"observation": "The player is facing a wall."},
     "questions": {"action": {"type": "choice",
                              "criteria": {"left": "Turn left", "right": "Turn right", "forward": "Move forward"}}}}

`boolean` questions take no criteria (their options are `yes` and `no`). Limits that depend on the deployment
(quantbench.limits: options per question, questions and options per request) are given to `parse_request`,
which checks the counts on the parsed JSON first, in time linear in the number of questions, before any field
is validated; `DecisionRequest.model_validate(data, context={"max_options": 64})` checks the options alone. Every
problem is reported as a `RequestError` naming the field and the fix; a broken limit as a `LimitError` that
also names the limit and its flag.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quantbench.errors import RequestError
from quantbench.limits import DEFAULT_MAX_OPTIONS, Limits, flag

__all__ = ["DEFAULT_MAX_OPTIONS", "Limits"]  # re-exported: the protocol's limits live in quantbench.limits
BOOLEAN_OPTIONS = ("yes", "no")
MEDIA_KEYS = ("image", "images", "audio", "audios", "video", "videos")


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["choice", "boolean"] = Field(description="`choice` (criteria required) or `boolean` (yes / no).")
    criteria: dict[str, str] | None = Field(
        default=None, description="Option key → what the option means. Required for `choice`; none for `boolean`."
    )
    description: str | None = Field(default=None, description="Optional question text shown with the options.")

    @field_validator("type", mode="before")
    @classmethod
    def _known_type(cls, v: Any) -> Any:
        if v not in ("choice", "boolean"):
            raise ValueError(f"unknown question type {v!r}; use 'choice' (with criteria) or 'boolean' (yes/no)")
        return v

    @model_validator(mode="after")
    def _options(self, info: ValidationInfo) -> Question:
        max_options = (info.context or {}).get("max_options", DEFAULT_MAX_OPTIONS)
        if self.type == "boolean":
            if self.criteria is not None and set(self.criteria) != set(BOOLEAN_OPTIONS):
                raise ValueError("criteria of a boolean question must be yes and no; drop `criteria` or use type 'choice'")
            return self
        if not self.criteria:
            raise ValueError("criteria is empty; a choice question needs at least two options {key: description}")
        if len(self.criteria) < 2:
            raise ValueError("criteria has one option; a choice question needs at least two")
        if len(self.criteria) > max_options:
            raise ValueError(too_many_options(len(self.criteria), max_options))
        seen: dict[str, str] = {}
        for key in self.criteria:
            if not key.strip():
                raise ValueError("criteria has an empty option key; give every option a non-empty key")
            norm = key.strip().casefold()
            if norm in seen:
                raise ValueError(f"criteria keys {seen[norm]!r} and {key!r} are duplicates (keys must differ)")
            seen[norm] = key
        return self

    @property
    def options(self) -> list[str]:
        return list(BOOLEAN_OPTIONS) if self.type == "boolean" else list(self.criteria or {})


def too_many_options(n: int, limit: int) -> str:
    return (
        f"criteria has {n} options, over the limit of {limit} ({flag('max_options')}); "
        f"split the question, or raise {flag('max_options')} (of `quantbench serve` or `quantbench run`)"
    )


class DecisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="", description="Model name the caller expects (informational).")
    state: dict[str, Any] = Field(description="What the decision is about: a JSON object.")
    questions: dict[str, Question] = Field(description="Question name → question. At least one.")

    @field_validator("state", mode="before")
    @classmethod
    def _state_is_object(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError(f"state must be a JSON object, got {type(v).__name__}; wrap the value, e.g. {{\"text\": ...}}")
        return v

    @field_validator("questions")
    @classmethod
    def _some_questions(cls, v: dict[str, Question]) -> dict[str, Question]:
        if not v:
            raise ValueError("questions is empty; ask at least one question")
        for name in v:
            if not name.strip():
                raise ValueError("a question has an empty name; give every question a non-empty name")
        return v

    def media_fields(self) -> list[str]:
        """State keys that carry image / audio / video (this text-only runner cannot read them)."""
        return [k for k in self.state if k.lower() in MEDIA_KEYS]


class QuestionAnswer(BaseModel):
    top: str = Field(description="The option with the highest probability.")
    probabilities: dict[str, float] = Field(description="Option key → probability; they sum to 1.")
    method: Literal["label_logit", "continuation"] = Field(
        description="`label_logit`: logits of single-token option labels; `continuation`: full option log-likelihood."
    )
    truncated: bool = Field(default=False, description="The state was cut to fit the model's context.")


class DecisionResponse(BaseModel):
    model: str
    answers: dict[str, QuestionAnswer]
    model_ms: float = Field(description="Time in the model's forward pass for this request (ms).")
    tokens: int = Field(description="Tokens fed to the model for this request (all questions).")


class SuiteRecord(BaseModel):
    """One line of a suite file (JSONL)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    benchmark: str
    request: DecisionRequest
    gold: dict[str, str] | None = None

    @model_validator(mode="after")
    def _gold_matches(self) -> SuiteRecord:
        for q, opt in (self.gold or {}).items():
            if q not in self.request.questions:
                raise ValueError(f"gold names question {q!r}, which the request does not ask")
            if opt not in self.request.questions[q].options:
                raise ValueError(f"gold answer {opt!r} for {q!r} is not one of its options {self.request.questions[q].options}")
        return self


class LimitError(RequestError):
    """A request over one of the deployment's limits: `status` is the HTTP answer (413 for a request that is too
    large as a whole, 422 for one question with too many options), `limit` the value broken, `flag` what sets it."""

    def __init__(self, field: str, problem: str, fix: str, *, limit: int, flag: str, status: int):
        self.limit, self.flag, self.status = limit, flag, status
        super().__init__(field, problem, fix)


def check_limits(data: dict[str, Any], limits: Limits) -> None:
    """Refuse a parsed request whose counts break `limits`, before its fields are validated: one len() per
    question, so a request of 100,000 questions costs no more than reading its JSON."""
    questions = data.get("questions")
    if not isinstance(questions, dict):
        return  # not a mapping: field validation says what is wrong with it
    if len(questions) > limits.max_questions:
        raise LimitError(
            "questions",
            f"the request has {len(questions)} questions, over the limit of {limits.max_questions} "
            f"({flag('max_questions')})",
            f"send at most {limits.max_questions} questions per request, or start the server with a larger "
            f"{flag('max_questions')}",
            limit=limits.max_questions, flag=flag("max_questions"), status=413,
        )
    total = 0
    for name, question in questions.items():
        if not isinstance(question, dict):
            continue
        criteria = question.get("criteria")
        n = len(criteria) if isinstance(criteria, dict) else 2 if question.get("type") == "boolean" else 0
        if n > limits.max_options and question.get("type") != "boolean":
            raise LimitError(f"questions.{name}.criteria", too_many_options(n, limits.max_options), "",
                             limit=limits.max_options, flag=flag("max_options"), status=422)
        total += n
        if total > limits.max_total_options:
            raise LimitError(
                "questions",
                f"the request has more than {limits.max_total_options} options over all its questions "
                f"({flag('max_total_options')}; a yes/no question counts two)",
                f"split it into smaller requests, or start the server with a larger {flag('max_total_options')}",
                limit=limits.max_total_options, flag=flag("max_total_options"), status=413,
            )


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # built in C; only an object with a duplicate is walked in Python (a 4.7 MB body: 2.1 -> 1.4 s)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise RequestError(k, f"duplicate key {k!r} in a JSON object", "each key may appear once")
            seen.add(k)
    return out


def loads_strict(text: str | bytes) -> Any:
    """json.loads that refuses duplicate keys (plain json keeps the last one silently)."""
    return json.loads(text, object_pairs_hook=_reject_duplicate_keys)


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "request"


def explain(err: ValidationError) -> RequestError:
    """The first problem of a pydantic ValidationError as a RequestError naming the field."""
    first = err.errors()[0]
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        msg = "is required"
    elif first["type"] == "extra_forbidden":
        msg = "is not a known field; remove it (see the request schema)"
    field = _field_path(tuple(first["loc"]))
    if msg.startswith("criteria ") and not field.endswith("criteria"):
        field += ".criteria"  # the option checks run on the whole question; point at the criteria
    return RequestError(field, msg)


def parse_request(
    data: dict[str, Any] | str | bytes, *, max_options: int = DEFAULT_MAX_OPTIONS, limits: Limits | None = None
) -> DecisionRequest:
    """Validate a request given as a dict or as JSON text; raise RequestError naming the field (LimitError for a
    broken limit). `limits` defaults to the protocol's, with `max_options`."""
    limits = limits or Limits(max_options=max_options)
    try:
        if isinstance(data, str | bytes):
            data = loads_strict(data)
        if not isinstance(data, dict):
            raise RequestError("request", "must be a JSON object with state and questions")
        check_limits(data, limits)
        return DecisionRequest.model_validate(data, context={"max_options": limits.max_options})
    except ValidationError as e:
        raise explain(e) from None
    except json.JSONDecodeError as e:
        raise RequestError("request", f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
