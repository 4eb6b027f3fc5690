"""The server's wire schema: a request body decoded into the protocol's DecisionRequest, the error body every
4xx / 5xx answers with, and a state far longer than the model's context cut (or refused) before it is tokenized.
Everything here raises Rejected (a status and an ErrorBody), never a crash."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError, field_validator

from quantbench.errors import ContextLengthError, RequestError
from quantbench.limits import (
    DEFAULT_MAX_OPTIONS,
    STATE_PREFIX_CHARS_PER_TOKEN,
    STATE_PREFIX_MARGIN_TOKENS,
    Limits,
    flag,
)
from quantbench.protocol import (
    DecisionRequest,
    LimitError,
    check_limits,
    explain,
    is_media_part,
    loads_strict,
)
from quantbench.protocol.media import MediaHeader, probe_media
from quantbench.protocol.media_cache import decode_media_once
from quantbench.protocol.prompt import render_question, render_state, state_prefix_tokens

# The reference card's curl example: what `--demo` answers.
# What a 200 carries besides the body, for load generators (`quantbench load` reads both; neither is required of
# a SystemOne server): the requests that shared its forward pass, and its time from queued to that pass's start.
BATCH_HEADER = "X-Quantbench-Batch"
QUEUE_MS_HEADER = "X-Quantbench-Queue-Ms"

DEMO_REQUEST = {
    "model": "clef-omni",
    "state": {"observation": "The player is facing a wall."},
    "questions": {
        "action": {
            "type": "choice",
            "criteria": {"left": "Turn left", "right": "Turn right", "forward": "Move forward"},
        }
    },
}


# An error names the field and quotes what was wrong, and both come from the client: a 2 MB option key was echoed
# whole in `detail` and `field` (a 4 MB error body for a 2 MB request). Longer texts keep their start and end.
MAX_ERROR_FIELD_CHARS = 256
MAX_ERROR_TEXT_CHARS = 2048


def shortened(text: str, most: int) -> str:
    """`text`, or its start and end around a note of how much was left out when it is over `most` characters."""
    if len(text) <= most:
        return text
    keep = most // 2
    return f"{text[:keep]}…({len(text) - 2 * keep} characters left out)…{text[-keep:]}"


class ErrorBody(BaseModel):
    """Every 4xx / 5xx body: what is wrong, where, and how to fix it (each text bounded: `shortened`)."""

    detail: str
    field: str | None = None
    fix: str | None = None
    tokens: int | None = None  # context errors: the prompt's length
    limit: int | None = None  # context and size errors: the limit it broke

    @field_validator("detail", "fix")
    @classmethod
    def _bounded_text(cls, value: str | None) -> str | None:
        return None if value is None else shortened(value, MAX_ERROR_TEXT_CHARS)

    @field_validator("field")
    @classmethod
    def _bounded_field(cls, value: str | None) -> str | None:
        return None if value is None else shortened(value, MAX_ERROR_FIELD_CHARS)


class Rejected(Exception):
    """A request answered with an error status (never a crash)."""

    def __init__(self, status: int, body: ErrorBody, headers: dict[str, str] | None = None):
        self.status, self.body, self.headers = status, body, headers or {}
        super().__init__(body.detail)


def from_request_error(status: int, e: RequestError) -> Rejected:
    body = ErrorBody(detail=str(e), field=e.field, fix=e.fix or None)
    if isinstance(e, ContextLengthError):
        body.tokens, body.limit = e.tokens, e.limit
    if isinstance(e, LimitError):
        status, body.limit = e.status, e.limit
    return Rejected(status, body)


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent, the work is dropped."""


def over_deadline(status: int, what: str, timeout_s: float) -> Rejected:
    """A request past its deadline: 408 while its body is read (the connection is then closed), 504 after."""
    return Rejected(
        status,
        ErrorBody(
            detail=f"no answer within the request deadline of {timeout_s:g} s ({flag('request_timeout')}): {what}",
            field="request",
            limit=math.ceil(timeout_s),
            fix=f"send a smaller request, retry when the server is less busy, or start it with a larger "
            f"{flag('request_timeout')}",
        ),
        headers={"Connection": "close"} if status == 408 else None,
    )


# The statuses /v1/systemone answers besides 200, for its OpenAPI schema.
ERROR_RESPONSES = {
    status: {"model": ErrorBody, "description": text}
    for status, text in [
        (400, "The body is not UTF-8 JSON, or the Host header is not a name the server answers to."),
        (401, "Missing or wrong API key."),
        (408, "The body did not arrive within the request deadline."),
        (413, "The body, its questions, options, tokens or media are over a limit (the error names it)."),
        (415, "The Content-Type is not application/json."),
        (422, "The request is invalid, a question has too many options, or its prompt is over the model's context."),
        (503, "The model is still loading, or the queue is full (see Retry-After)."),
        (504, "No answer within the request deadline (the request was dropped)."),
    ]
}


def decode_request(
    body: bytes,
    *,
    max_options: int = DEFAULT_MAX_OPTIONS,
    limits: Limits | None = None,
    modalities: frozenset[str] = frozenset(),
) -> DecisionRequest:
    """Bytes -> DecisionRequest, or Rejected: 400 for bytes that are not JSON text, 422 for a wrong request,
    413 / 422 for one over `limits` (default: the protocol's, with `max_options`). Media parts (checked by
    `media_gate`) only of the types in `modalities`, what the served model reads."""

    def bad(problem: str, fix: str) -> Rejected:
        return Rejected(400, ErrorBody(detail=f"request: {problem} ({fix})", field="request", fix=fix))

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(
            f"body is not UTF-8 (invalid byte at offset {e.start})", "encode the JSON as UTF-8"
        ) from None
    if not text.strip():
        raise bad("body is empty", "send a JSON decision request with state and questions")
    limits = limits or Limits(max_options=max_options)
    try:
        data = loads_strict(text)
        if isinstance(data, dict):
            check_limits(data, limits)  # counts first: a request over a limit is not walked any further
        # A \ud800 escape parses into a string no tokenizer can encode, and 1e999 into infinity: refuse them
        # here, not in the model thread.
        json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except json.JSONDecodeError as e:
        raise bad(
            f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", "send one JSON object"
        ) from None
    except RecursionError:
        raise bad("JSON nests deeper than the parser allows", "flatten the state") from None
    except UnicodeEncodeError:
        raise bad(
            "contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)", "send valid Unicode text"
        ) from None
    except RequestError as e:  # duplicate keys, NaN, a limit
        raise from_request_error(422, e) from None
    except ValueError:  # json.dumps: a float out of range (1e999 parses as infinity)
        raise bad("holds a number out of range (such as 1e999, which reads as infinity)",
                  "send finite numbers") from None
    # Validated here, not by parse_request: that walked the counts and media a second time (4 MB of small objects
    # took 5 s where one walk takes 2.5), and it parsed a JSON string body again as JSON text, so a double-encoded
    # request was answered and a body of "hi" was called invalid JSON.
    if not isinstance(data, dict):
        raise from_request_error(422, RequestError(
            "request", f"must be a JSON object with state and questions, got a JSON {json_kind(data)}",
            "send one JSON object (not an array, nor an object encoded again as a string)"))
    try:
        request = DecisionRequest.model_validate(data, context={"max_options": limits.max_options})
    except ValidationError as e:
        raise from_request_error(422, explain(e)) from None
    refuse_unservable_media(request, modalities)
    return request


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's words: string, number, array, ..."""
    kinds = {str: "string", bool: "boolean", int: "number", float: "number", list: "array", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def refuse_unservable_media(request: DecisionRequest, modalities: frozenset[str]) -> None:
    """Refuse media the server must not or cannot read, naming the field, from the JSON alone: a `path` (the
    server never reads local files; a `data` that is not a data URI was refused by the protocol: it never fetches
    URLs) and a type the model has no input for. Nothing is decoded here (decode_gate does that, off the event
    loop)."""
    parts = request.media_parts()
    for field, part in parts:
        if "path" in part:
            raise Rejected(422, ErrorBody(
                detail=f"{field}.path: the server never reads local files",
                field=f"{field}.path",
                fix='send the bytes inline as "data": "data:<mime>;base64,..."',
            ))
    for field, part in parts:
        if part["type"] not in modalities:
            reads = f"reads {', '.join(sorted(modalities))} and text" if modalities else "reads text only"
            raise Rejected(422, ErrorBody(
                detail=f"{field}: the served model {reads}; it has no {part['type']} input",
                field=field,
                fix="send a state without it (describe it in words), or use a server whose model has that input",
            ))


def media_headers(request: DecisionRequest, limits: Limits) -> list[MediaHeader]:
    """Every media part's header, read without decoding and checked against the per-part limits and the request's
    decoded bytes (413 naming the field and the flag, 422 for bytes of no format the server reads)."""
    try:
        return probe_media(request.state, limits)
    except RequestError as e:
        raise from_request_error(422, e) from None


def decode_gate(request: DecisionRequest, limits: Limits) -> None:
    """Decode every media part (or find it decoded, in the request scope or the cache) so that bytes that do not
    decode are a 4xx before the request is queued; on a preparing thread, inside the request's scope
    (quantbench.protocol.media_cache.request_scope), where the engine finds what it decoded."""
    try:
        decode_media_once(request.state, limits)
    except RequestError as e:
        raise from_request_error(422, e) from None


def state_prefix(state: dict[str, Any], chars: int) -> dict[str, Any]:
    """The state cut so that it renders (quantbench.protocol.prompt.render_state) as the first ~`chars` characters of what
    the whole state renders: the keys that fit, then the next value's text cut. A value holding media parts is
    kept whole or left out, never cut into text (its parts render as short placeholders)."""
    out: dict[str, Any] = {}
    used = len("State:")
    for key, value in state.items():
        room = chars - used - len(key) - 3  # "\n" + key + ": "
        if room <= 0:
            break
        text = render_state({key: value})[len("State:\n") + len(key) + 2:]
        if len(text) > room:
            if not (is_media_part(value) or isinstance(value, list) and any(map(is_media_part, value))):
                out[key] = text[:room]  # a string renders verbatim, as the value's JSON text did
            break
        out[key] = value
        used += len(key) + 3 + len(text)
    return out


def bound_long_state(engine: Any, decision: DecisionRequest) -> tuple[DecisionRequest, bool]:
    """A state far longer than the model's context is never tokenized whole. Without truncation: 422 when a
    prefix of it is already over the context. With truncation: the request with its state cut to that prefix
    (the engine cuts the rest), and True (its answers must say truncated). Only for an engine that says its
    tokenizer and limit."""
    tokenizer, limit = getattr(engine, "tokenizer", None), getattr(engine, "max_tokens", None)
    if tokenizer is None or not isinstance(limit, int):
        return decision, False
    chars = limit * STATE_PREFIX_CHARS_PER_TOKEN
    count = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    for name, question in decision.questions.items():  # truncation cuts the state only: never a question
        asked = render_question(name, question)  # a 2 MB option label was tokenized whole (4.7 s) before this
        if len(asked) > chars and (tokens := state_prefix_tokens(asked, chars, count)) > limit + STATE_PREFIX_MARGIN_TOKENS:
            raise Rejected(422, ErrorBody(
                detail=f"questions.{name}: its first {chars} of {len(asked)} characters (the question, its "
                f"description and options) are already {tokens} tokens, over the model's limit of {limit}",
                field=f"questions.{name}", tokens=tokens, limit=limit,
                fix="shorten the question's name, description or options",
            ))
    text = render_state(decision.state)
    if len(text) <= chars:
        return decision, False  # short enough to tokenize whole with the prompt
    if getattr(engine, "truncate", False):
        return decision.model_copy(update={"state": state_prefix(decision.state, chars)}), True
    tokens = state_prefix_tokens(text, chars, count)
    if tokens > limit + STATE_PREFIX_MARGIN_TOKENS:
        raise Rejected(
            422,
            ErrorBody(
                detail=f"state: its first {chars} of {len(text)} characters are already {tokens} tokens, over the "
                f"model's limit of {limit}",
                field="state",
                tokens=tokens,
                limit=limit,
                fix="shorten the state, or start the server with --allow-truncation (recorded on each answer)",
            ),
        )
    return decision, False
