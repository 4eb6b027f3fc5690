"""How a decision question becomes a prompt. One rendering, used by the runner, the fixture's training and calibration.

Each question of a request is rendered on its own (with the whole state), so its answer cannot depend on the
other questions or their order. With no chat template the plain template is:

    State:
    observation: The player is facing a wall.

    Question: action
    A. left: Turn left
    B. right: Turn right
    C. forward: Move forward
    Answer:

and the options are scored by the next-token logits of the labels " A", " B", ... (" yes" / " no" for boolean
questions, which end with "Answer with yes or no."). With a chat template the same text is the user turn, the
generation prompt follows, and the labels are scored without the leading space.

A media part in the state renders as its placeholder (`MEDIA_PLACEHOLDERS`: Qwen-Omni's spelling, which the
model's processor expands to the part's tokens); a list mixing parts and text renders as its items joined by a
space, text as it is:

    camera: <|vision_start|><|image_pad|><|vision_end|>
    views: left view: <|vision_start|><|image_pad|><|vision_end|>

A state without media renders exactly as it always has.
"""

from __future__ import annotations

import json
from typing import Any

from quantbench.protocol import DecisionRequest, Question, is_media_part

CHOICE_LABELS = [chr(ord("A") + i) for i in range(26)]
ANSWER_CUE = "Answer:"
# What a media part of each type renders as: the vision / audio span of Qwen-Omni, whose pad token the
# processor repeats once per token of the part.
MEDIA_PLACEHOLDERS = {
    "image": "<|vision_start|><|image_pad|><|vision_end|>",
    "audio": "<|audio_start|><|audio_pad|><|audio_end|>",
    "video": "<|vision_start|><|video_pad|><|vision_end|>",
}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def state_segments(state: dict[str, Any], placeholders: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    """The rendered state in order, as (text, None) pieces and (placeholder, part) pieces for its media parts;
    joined, they are render_state's text. Truncation cuts text pieces and drops media pieces whole."""
    placeholders = placeholders or MEDIA_PLACEHOLDERS
    pieces: list[tuple[str, Any]] = [("State:", None)]
    for key, value in state.items():
        pieces.append((f"\n{key}: ", None))
        items = value if isinstance(value, list) and any(is_media_part(v) for v in value) else [value]
        for i, item in enumerate(items):
            if i:
                pieces.append((" ", None))
            pieces.append((placeholders[item["type"]], item) if is_media_part(item) else (_text(item), None))
    merged: list[tuple[str, Any]] = []
    for text, part in pieces:  # adjacent text pieces as one, "State:" apart (truncation keeps it)
        if part is None and len(merged) > 1 and merged[-1][1] is None:
            merged[-1] = (merged[-1][0] + text, None)
        else:
            merged.append((text, part))
    return merged


def state_prefix_tokens(text: str, chars: int, count: Any) -> int:
    """Tokens (`count(text) -> int`) of a rendered state's first `chars` characters (quantbench.limits'
    STATE_PREFIX_CHARS_PER_TOKEN a token of context), cut at the last space: a prefix ending between words
    tokenizes as the whole text does up to there. Only a space in the prefix's second half is cut at: text with
    no space late in it (one long word, base64, CJK) is counted whole, not cut back to the key before it (which
    let a 3 MB value with no space be tokenized whole)."""
    head = text[:chars]
    cut = head.rfind(" ")
    return count(head[:cut] if cut > len(head) // 2 else head)


def render_state(state: dict[str, Any], placeholders: dict[str, str] | None = None) -> str:
    if not any(is_media_part(v) or isinstance(v, list) for v in state.values()):
        return "\n".join(["State:", *(f"{key}: {_text(value)}" for key, value in state.items())])
    return "".join(text for text, _ in state_segments(state, placeholders))


def option_labels(question: Question) -> list[str]:
    """The label written before each option in the prompt, in option order."""
    if question.type == "boolean":
        return ["yes", "no"]
    n = len(question.options)
    # Past Z there are no single-letter labels: number the options (scored by continuation, see scoring.py).
    return CHOICE_LABELS[:n] if n <= len(CHOICE_LABELS) else [str(i + 1) for i in range(n)]


def render_question(name: str, question: Question) -> str:
    lines = [f"Question: {name}"]
    if question.description:
        lines.append(question.description)
    if question.type == "boolean":
        lines.append("Answer with yes or no.")
    else:
        for label, (key, desc) in zip(option_labels(question), (question.criteria or {}).items(), strict=True):
            lines.append(f"{label}. {key}: {desc}")
    return "\n".join(lines)


def uses_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def wrap(tokenizer: Any, content: str) -> str:
    """The full prompt text for one question's content (chat template when the tokenizer has one)."""
    if uses_chat_template(tokenizer):
        messages = [{"role": "user", "content": content}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return f"{content}\n{ANSWER_CUE}"


def label_prefix(tokenizer: Any) -> str:
    """What precedes a label token: a space after the plain template's "Answer:", nothing after a chat prompt."""
    return "" if uses_chat_template(tokenizer) else " "


def render_prompt(tokenizer: Any, request: DecisionRequest, name: str, state_text: str | None = None) -> str:
    """The prompt for question `name` of `request` (state_text overrides the rendered state, for truncation)."""
    state = render_state(request.state) if state_text is None else state_text
    return wrap(tokenizer, f"{state}\n\n{render_question(name, request.questions[name])}")


def answer_text(tokenizer: Any, question: Question, option: str) -> str:
    """The text that follows the prompt when the answer is `option` (what the fixture is trained to say)."""
    label = option_labels(question)[question.options.index(option)]
    return label_prefix(tokenizer) + label
