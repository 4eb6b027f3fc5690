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

Media in the state. A state value may be a media part, or a list mixing parts and ordinary values, under any key:
a part is known by its shape, not by its key's name. A part is a JSON object whose keys are among `type`, `data`,
`path`, `frames`, `fps`, with `type` and exactly one of `data` / `path` / `frames`:

    {"type": "image", "data": "data:image/png;base64,..."}       # image/png, image/jpeg, image/webp
    {"type": "audio", "data": "data:audio/wav;base64,..."}       # audio/wav (x-wav, wave), audio/flac (x-flac)
    {"type": "video", "data": "data:video/mp4;base64,..."}       # video/mp4
    {"type": "video", "frames": ["data:image/png;base64,...", ...], "fps": 2}
    {"type": "image", "path": "media/frame.png"}                 # suites only: relative to the suite file

    {"state": {"observation": "a door", "camera": {"type": "image", "data": "data:image/png;base64,..."},
               "views": ["left view:", {"type": "image", "data": "..."}]}, "questions": {...}}

An object with other keys, or without `type` and a source, is an ordinary value; parts nested deeper than a list
are ordinary values too. Fields are named `state.camera`, `state.views[1]`, `state.clip.frames[7]`. `data` must
be a base64 data URI whose mime type is one of the type's formats (and matches the bytes when decoded): quantbench
never fetches a URL. `path` is read only from a suite file, inside the suite file's folder (`..`, absolute paths
and symlinks out are refused); the server refuses it. The checks here are on the JSON only (type, source, data
URI header, encoded size, counts); quantbench.protocol.media decodes and checks pixels, seconds and frames.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
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
from quantbench.protocol.option_keys import comparable, invisible_character

__all__ = ["DEFAULT_MAX_OPTIONS", "Limits"]  # re-exported: the protocol's limits live in quantbench.limits
BOOLEAN_OPTIONS = ("yes", "no")
# Media type -> the mime types of a data URI quantbench decodes for it (and the format each is).
MEDIA_MIMES: dict[str, dict[str, str]] = {
    "image": {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"},
    "audio": {"audio/wav": "WAV", "audio/x-wav": "WAV", "audio/wave": "WAV", "audio/flac": "FLAC",
              "audio/x-flac": "FLAC"},
    "video": {"video/mp4": "MP4"},
}
MEDIA_NOUNS = {"image": "an image", "audio": "an audio", "video": "a video"}  # for messages: "not an image format"
MEDIA_SOURCES = ("data", "path", "frames")
MEDIA_PART_KEYS = frozenset({"type", *MEDIA_SOURCES, "fps"})
# The fastest frame rate a video may say it has (a `frames` list's fps, an mp4's stream): the model reads seconds
# per frame pair from it, and 1e308 frames a second is no video. Slow-motion cameras record at up to 1,000.
MAX_FPS = 1000.0
DATA_URI = re.compile(r"data:([A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+);base64,")


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
            if (char := invisible_character(key)) is not None:
                raise ValueError(f"criteria key {key!r} holds the invisible character {char}; remove it (an invisible "
                                 "or bidi character makes a key read as another)")
            norm = comparable(key)  # NFKC, look-alike letters, case: as a person reads the key
            if norm in seen:
                raise ValueError(f"criteria keys {seen[norm]!r} and {key!r} read as the same option (compared after "
                                 "Unicode NFKC normalization, case folding and look-alike letters); keys must differ")
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

    def media_parts(self) -> list[tuple[str, dict[str, Any]]]:
        """(field, part) for each media part of the state, in order: `("state.views[1]", {"type": "image", ...})`."""
        return media_parts(self.state)

    def media_fields(self) -> list[str]:
        """The fields of the state's media parts (`state.camera`, `state.views[1]`)."""
        return [name for name, _ in media_parts(self.state)]


class QuestionAnswer(BaseModel):
    top: str = Field(description="The option with the highest probability.")
    probabilities: dict[str, float] = Field(description="Option key → probability; they sum to 1.")
    method: Literal["label_logit", "continuation", "checkpoint_scorer"] = Field(
        description="`label_logit`: logits of single-token option labels; `continuation`: full option log-likelihood; "
        "`checkpoint_scorer`: the checkpoint's own scorer (its code and head, config.json `quantbench_scorer`)."
    )
    truncated: bool = Field(default=False, description="The state was cut to fit the model's context.")


def non_finite_answer(question: str, answer: QuestionAnswer) -> str | None:
    """Why `answer` is no answer, or None: a probability that is NaN or infinite (a checkpoint holding NaN
    weights, a float16 overflow) would be stored or sent as null with the first option as top. The run's child
    fails the run on it and the server answers 500 with this text (it names the question and what to check)."""
    bad = [option for option, p in answer.probabilities.items() if not math.isfinite(p)]
    if not bad:
        return None
    shown = ", ".join(f"{o}={answer.probabilities[o]}" for o in bad[:4]) + (" …" if len(bad) > 4 else "")
    return (f"question {question!r}: the model answered non-finite probabilities ({shown}); its weights or its "
            "arithmetic overflow (NaN or infinite values in the checkpoint's tensors, or --dtype float16 out of "
            "range)")


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

    @field_validator("id", "benchmark")
    @classmethod
    def _not_blank(cls, v: str, info: ValidationInfo) -> str:
        # an empty id or benchmark was stored as such: answers keyed by "" and a report row with no family name
        if not v.strip():
            raise ValueError(f"{info.field_name} is empty; give every record a non-empty {info.field_name}")
        return v

    @model_validator(mode="after")
    def _gold_matches(self) -> SuiteRecord:
        for q, opt in (self.gold or {}).items():
            if q not in self.request.questions:
                raise ValueError(f"gold names question {q!r}, which the request does not ask")
            if opt not in self.request.questions[q].options:
                raise ValueError(f"gold answer {opt!r} for {q!r} is not one of its options {self.request.questions[q].options}")
        return self


def is_media_part(value: Any) -> bool:
    """A media part by its shape: an object of part keys only, with `type` and a source (data, path or frames)."""
    return (
        isinstance(value, dict) and "type" in value and any(k in value for k in MEDIA_SOURCES)
        and all(k in MEDIA_PART_KEYS for k in value)
    )


def media_parts(state: Any) -> list[tuple[str, dict[str, Any]]]:
    """(field, part) for each media part of a state (a value, or an item of a list value), in order."""
    found: list[tuple[str, dict[str, Any]]] = []
    if not isinstance(state, dict):
        return found
    for key, value in state.items():
        if is_media_part(value):
            found.append((f"state.{key}", value))
        elif isinstance(value, list):
            found.extend((f"state.{key}[{i}]", item) for i, item in enumerate(value) if is_media_part(item))
    return found


MODALITIES = ("text", "image", "audio", "video", "mixed")


def modality_of(request_or_state: Any) -> str:
    """What a record's decision is about, from its media parts' types alone (nothing is decoded): `text` without
    media, `image` / `audio` / `video` when every part is of that one type, `mixed` when the state holds more than
    one kind. Takes a DecisionRequest, a SuiteRecord or a bare state dict."""
    state = getattr(request_or_state, "request", request_or_state)
    state = getattr(state, "state", state)
    kinds = set()
    for field, part in media_parts(state):
        if part.get("type") not in MEDIA_MIMES:  # check_media refuses it first in a parsed request
            raise RequestError(f"{field}.type", f"unknown media type {part.get('type')!r}", "use image, audio or video")
        kinds.add(part["type"])
    if not kinds:
        return "text"
    return kinds.pop() if len(kinds) == 1 else "mixed"


def data_uri_format(field: str, kind: str, uri: Any) -> tuple[str, str]:
    """(format, base64 payload) of a data URI of media type `kind`, or RequestError naming `field`."""
    formats = MEDIA_MIMES[kind]
    if not isinstance(uri, str) or not uri.startswith("data:"):
        got = f"{uri[:40]!r}" if isinstance(uri, str) else type(uri).__name__
        raise RequestError(
            field, f"must be a data URI (data:<mime>;base64,...), got {got}",
            "embed the bytes as base64; quantbench never fetches URLs or reads paths named in data",
        )
    header = DATA_URI.match(uri)
    if header is None:
        raise RequestError(field, "is not a base64 data URI", "write it as data:<mime>;base64,<bytes in base64>")
    mime = header.group(1).lower()
    if mime not in formats:
        raise RequestError(
            field, f"mime type {mime} is not {MEDIA_NOUNS[kind]} format quantbench reads", "send " + ", ".join(formats)
        )
    return formats[mime], uri[header.end():]


def encoded_size(payload: str) -> int:
    """Bytes a base64 payload decodes to (at most), without decoding it."""
    return len(payload) * 3 // 4


def media_too_large(field: str, size: int, limits: Limits) -> LimitError:
    """The LimitError of a part over --max-media-bytes."""
    return LimitError(
        field, f"the part is {size} bytes, over the limit of {limits.max_media_bytes} ({flag('max_media_bytes')})",
        f"send smaller media, or raise {flag('max_media_bytes')}",
        limit=limits.max_media_bytes, flag=flag("max_media_bytes"), status=413,
    )


def check_media_part(field: str, part: dict[str, Any], limits: Limits) -> None:
    """The JSON of one media part: known type, one source, data URI headers, encoded sizes, frame count and fps.
    Nothing is decoded (quantbench.protocol.media does that)."""
    kind = part["type"]
    if not isinstance(kind, str) or kind not in MEDIA_MIMES:
        raise RequestError(f"{field}.type", f"unknown media type {kind!r}", "use image, audio or video")
    sources = [k for k in MEDIA_SOURCES if k in part]
    if len(sources) > 1:
        raise RequestError(field, f"has both {sources[0]} and {sources[1]}", "give exactly one source")
    source = sources[0]
    if source == "frames" and kind != "video":
        raise RequestError(f"{field}.frames", f"{MEDIA_NOUNS[kind]} part has no frames", "send data, or use type video")
    if ("fps" in part) != (source == "frames"):
        raise RequestError(
            f"{field}.fps", "is required with frames" if source == "frames" else "goes with frames only",
            "give the frames' rate as fps beside frames; an mp4 carries its own rate",
        )
    if source == "data":
        _, payload = data_uri_format(f"{field}.data", kind, part["data"])
        if encoded_size(payload) > limits.max_media_bytes:
            raise media_too_large(f"{field}.data", encoded_size(payload), limits)
    elif source == "path":
        path = part["path"]
        if not isinstance(path, str) or not path.strip():
            raise RequestError(f"{field}.path", "must be a non-empty relative path", "write e.g. media/frame.png")
        # Where it may point is checked where it is read: inside a suite file's folder (media.resolve_media_path).
    else:
        frames, fps = part["frames"], part["fps"]
        if not isinstance(frames, list) or not frames:
            raise RequestError(f"{field}.frames", "must be a non-empty list of image data URIs", "")
        if len(frames) > limits.max_video_frames:
            raise LimitError(
                f"{field}.frames",
                f"the video has {len(frames)} frames, over the limit of {limits.max_video_frames} "
                f"({flag('max_video_frames')})",
                f"send fewer frames (sample them at a lower fps), or raise {flag('max_video_frames')}",
                limit=limits.max_video_frames, flag=flag("max_video_frames"), status=413,
            )
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= MAX_FPS:
            raise RequestError(f"{field}.fps", f"must be a number of frames per second above 0 and at most {MAX_FPS}, "
                               f"got {fps!r}", "give the rate the frames were sampled at")
        if len(frames) / fps > limits.max_video_seconds:
            raise LimitError(
                f"{field}.fps", f"{len(frames)} frames at {fps:g} per second last {len(frames) / fps:.4g} seconds, over "
                f"the limit of {limits.max_video_seconds} ({flag('max_video_seconds')})",
                f"give the frames' real rate, send fewer, or raise {flag('max_video_seconds')}",
                limit=limits.max_video_seconds, flag=flag("max_video_seconds"), status=413,
            )
        for i, frame in enumerate(frames):
            _, payload = data_uri_format(f"{field}.frames[{i}]", "image", frame)
            if encoded_size(payload) > limits.max_media_bytes:
                raise media_too_large(f"{field}.frames[{i}]", encoded_size(payload), limits)


MEDIA_URI_PREFIXES = tuple(f"data:{kind}/" for kind in MEDIA_MIMES)


def _bare_media_uri(state: Any) -> None:
    """A media data URI written as a plain text value (the convention before media parts) would reach a model as
    base64 text: refuse it, saying how to write the part."""
    if not isinstance(state, dict):
        return
    for key, value in state.items():
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, str) and item[:11].lower().startswith(MEDIA_URI_PREFIXES):
                kind = item[5:].split("/", 1)[0].lower()
                raise RequestError(
                    f"state.{key}" if i is None else f"state.{key}[{i}]",
                    f"is {MEDIA_NOUNS[kind]} data URI written as text",
                    f'send it as a media part: {{"type": "{kind}", "data": "data:{kind}/..."}}',
                )


def _media_typed(value: Any) -> bool:
    """An object whose `type` names a media type (in any case, with spaces around it): a media part, or wrong."""
    kind = value.get("type") if isinstance(value, dict) else None
    return isinstance(kind, str) and kind.strip().casefold() in MEDIA_MIMES


def _misplaced_media(state: Any) -> None:
    """RequestError naming the first object that says it is media (`"type": "image"` ...) but is not a media part
    where parts are read: one with a key a part does not have (`url`), one with no bytes, or one nested deeper than
    a state value or an item of a list value. Read as an ordinary value it would reach the model as its JSON text
    (a URL the client meant to be fetched, a part with a typo): refused instead, so a client learns at once."""
    if not isinstance(state, dict):
        return
    todo = deque((f"state.{key}", value, "value") for key, value in state.items())
    while todo:
        field, value, where = todo.popleft()
        if isinstance(value, list):
            inner = "item" if where == "value" else "deep"
            todo.extend((f"{field}[{i}]", item, inner) for i, item in enumerate(value) if isinstance(item, dict | list))
        elif not isinstance(value, dict):
            continue
        elif not _media_typed(value):
            todo.extend((f"{field}.{key}", item, "deep") for key, item in value.items() if isinstance(item, dict | list))
        elif where == "deep":
            raise RequestError(
                field, f"is a {value['type'].strip()} part nested inside another value, where it would be read as "
                "text", "put a media part directly under a state key, or in a list under one",
            )
        elif (stray := next((key for key in value if key not in MEDIA_PART_KEYS), None)) is not None:
            raise RequestError(
                f"{field}.{stray}", "is not a field of a media part (a part has type and one of data, frames; fps "
                "with frames)", 'send the bytes inline as "data": "data:<mime>;base64,..." (quantbench never fetches '
                "URLs), or give the object another type if it is not media",
            )
        elif not any(key in value for key in MEDIA_SOURCES):
            raise RequestError(field, f"a {value['type'].strip()} part has no bytes",
                               'add "data": "data:<mime>;base64,..." (a video may give "frames" and "fps" instead)')


def check_media(state: Any, limits: Limits) -> None:
    """The media parts of a parsed state: every object that says it is media is a part where parts are read
    (_misplaced_media), their count, then each part's JSON (check_media_part). A media data URI given as a plain
    string is refused too."""
    _bare_media_uri(state)
    _misplaced_media(state)
    parts = media_parts(state)
    if len(parts) > limits.max_media_parts:
        raise LimitError(
            "state",
            f"the state has {len(parts)} media parts, over the limit of {limits.max_media_parts} "
            f"({flag('max_media_parts')})",
            f"send at most {limits.max_media_parts} parts per request, or raise {flag('max_media_parts')}",
            limit=limits.max_media_parts, flag=flag("max_media_parts"), status=413,
        )
    for field, part in parts:
        check_media_part(field, part, limits)


def refuse_unread_media(request: DecisionRequest, modalities: frozenset[str], where: str = "") -> None:
    """RequestError naming the first media part whose type the model has no input for (`modalities`: the types
    it reads; empty for a text-only model). `where` prefixes the field (a suite record: `record r7: `)."""
    for field, part in request.media_parts():
        if part["type"] not in modalities:
            reads = f"reads {', '.join(sorted(modalities))} and text" if modalities else "reads text only"
            raise RequestError(
                f"{where}{field}", f"the model {reads}; it has no {part['type']} input",
                "run a model with that input, or leave such records out of the suite",
            )


class LimitError(RequestError):
    """A request over one of the deployment's limits: `status` is the HTTP answer (413 for a request that is too
    large as a whole, 422 for one question with too many options), `limit` the value broken, `flag` what sets it."""

    def __init__(self, field: str, problem: str, fix: str, *, limit: int, flag: str, status: int):
        self.limit, self.flag, self.status = limit, flag, status
        super().__init__(field, problem, fix)


def check_limits(data: dict[str, Any], limits: Limits) -> None:
    """Refuse a parsed request whose counts break `limits`, before its fields are validated: one len() per
    question, so a request of 100,000 questions costs no more than reading its JSON. Media parts are checked
    first (check_media: their JSON only, nothing decoded)."""
    check_media(data.get("state"), limits)
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


class _DuplicateKeys(dict):  # type: ignore[type-arg]
    """An object of the parsed JSON that held `key` twice: kept while the rest parses, then found to name its path."""

    key: str = ""


def _with_duplicates_marked(found: list[_DuplicateKeys]) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)  # built in C; only an object with a duplicate is walked in Python (4.7 MB: 2.1 -> 1.4 s)
        if len(out) == len(items):
            return out
        marked, seen = _DuplicateKeys(out), set()
        for k, _ in items:
            if k in seen:
                marked.key = k
                break
            seen.add(k)
        found.append(marked)
        return marked

    return pairs


def _path_of(data: Any, target: Any) -> str:
    """Where `target` is in `data` ("questions.a.criteria", "state.views[1]"; "" for `data` itself), walked
    without recursion (the JSON may nest as deep as the parser allows)."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return ""


def _no_constant(name: str) -> Any:
    raise RequestError("request", f"holds {name}, which is not JSON (JSON numbers are finite)",
                       "send a finite number, or null")


def loads_strict(text: str | bytes) -> Any:
    """json.loads that refuses duplicate keys (plain json keeps the last one silently), NaN and Infinity (Python's
    json reads them; JSON has no such numbers) and integers over Python's 4,300 digits (a ValueError otherwise),
    each as a RequestError naming the request."""
    found: list[_DuplicateKeys] = []
    try:
        data = json.loads(text, object_pairs_hook=_with_duplicates_marked(found), parse_constant=_no_constant)
    except (json.JSONDecodeError, RequestError):
        raise
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise RequestError("request", f"holds a number too long to read ({e})",
                           "send numbers of at most 4,300 digits") from None
    if found:  # named by its path (a bare "l" said nothing of which question's options held it twice)
        where = _path_of(data, found[0])
        key = found[0].key
        raise RequestError(f"{where}.{key}" if where else key, f"duplicate key {key!r} in a JSON object",
                           "each key may appear once")
    return data


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
