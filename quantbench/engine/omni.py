"""The decision engine of a model that reads media in the state: Qwen3-Omni-MoE's thinker.

It is TransformersEngine with two hooks filled (quantbench.engine.scoring): `_prompt` renders a question whose
state holds media parts with each part's placeholder, decodes the parts (quantbench.protocol.media) and runs the
checkpoint's processor (quantbench.models.processor), which expands each placeholder to the part's tokens and
makes the tensors the model reads; `_hidden` runs a batch that carries media through the thinker's own model
(vision and audio towers, 3-D rope positions from the attention mask, deepstack) and hands back its last hidden
states, so the head is applied only at the positions read, as for text (the thinker's forward has no
`logits_to_keep` and would compute the whole vocabulary at every position). A request without media takes
TransformersEngine's path unchanged: the same prompt text, the text decoder replayed from a CUDA graph on a GPU.

What transformers does not check, quantbench does: text that spells one of the model's media tokens (a state value
`"<|audio_pad|>"` would become a placeholder) is refused naming its field, and the audio placeholders of a prompt
must number what the audio encoder will output for its features (transformers scatters a mismatch silently).
Media tokens count toward the context; `--truncate` cuts the state's text from its end and drops a media part
whole when the cut reaches it, never cutting inside its span.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.base import EngineReport
from quantbench.engine.scoring import Prepared, TransformersEngine
from quantbench.errors import ContextLengthError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import DecisionRequest, is_media_part, refuse_unread_media
from quantbench.protocol.media import DecodedAudio, DecodedImage, DecodedVideo, decode_media
from quantbench.protocol.prompt import render_prompt, state_segments

OMNI_THINKER = "qwen3_omni_moe_thinker"
# The model inputs a media row carries, and how a batch joins them: along the first dimension, except the audio
# features, which are padded to the longest clip of the batch first.
MEDIA_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid",
                "input_features", "feature_attention_mask")


def is_omni_thinker(model: Any) -> bool:
    """Whether `model` is a Qwen3-Omni-MoE thinker (the model class quantbench runs that family as)."""
    return getattr(getattr(model, "config", None), "model_type", None) == OMNI_THINKER


class OmniEngine(TransformersEngine):
    """Answers decision requests whose state may carry images, audio and video, with a Qwen3-Omni thinker.
    `media`: the checkpoint's MediaProcessor (None: it ships no processor files and reads text only);
    `limits`: the media limits decoding checks; `media_base`: the folder a suite's `path` parts are read from
    (None refuses them, as for a request from the network)."""

    def __init__(self, model: Any, tokenizer: Any, *, media: Any = None, limits: Limits | None = None,
                 media_base: Path | None = None, **kwargs: Any):
        super().__init__(model, tokenizer, **kwargs)
        self.media, self.limits, self.media_base = media, limits or Limits(), media_base
        self._decoded: dict[int, Any] = {}  # id(part) -> its decoded media, while one request is prepared
        self.modalities = media.modalities if media is not None else frozenset()
        tokens = media.tokens if media is not None else {}
        self.media_tokens = sorted(set(tokens.values()))
        self.placeholders = {
            "image": f"{tokens.get('vision_bos_token')}{tokens.get('image_token')}{tokens.get('vision_eos_token')}",
            "video": f"{tokens.get('vision_bos_token')}{tokens.get('video_token')}{tokens.get('vision_eos_token')}",
            "audio": f"{tokens.get('audio_bos_token')}{tokens.get('audio_token')}{tokens.get('audio_eos_token')}",
        }
        config = model.config
        self.audio_token_id = config.audio_token_id
        self.merge_size = config.vision_config.spatial_merge_size
        self.n_window = config.audio_config.n_window

    @classmethod
    def for_spec(cls, model: Any, tokenizer: Any, spec: Any, media: Any = None) -> OmniEngine:  # type: ignore[override]
        """The engine for a RunSpec: its settings as TransformersEngine's, its media limits, and the suite's
        folder for `path` parts."""
        return cls(model, tokenizer, media=media, limits=spec.limits(),
                   media_base=Path(spec.suite).resolve().parent if spec.suite else None,
                   max_options=spec.max_options, max_tokens=spec.max_tokens, truncate=spec.truncate,
                   method=spec.method, cuda_graph=spec.options.cuda_graph, fused_ops=spec.options.fused_ops)

    @property
    def processor(self) -> Any:
        """The checkpoint's transformers processor (None: it ships none), what a checkpoint's own scorer is
        handed (quantbench.run.scorer)."""
        return self.media.processor if self.media is not None else None

    def report(self) -> EngineReport:
        """TransformersEngine's, with what read the media (the run's `extra.media`)."""
        media = self.media.describe() if self.media is not None else {"modalities": []}
        return dataclasses.replace(super().report(), media=media)

    # -- preparing (decoding, the processor, the checks) ------------------------------------------------------
    def prepare(self, request: DecisionRequest) -> Prepared:
        self._refuse_media_tokens(request)
        if not request.media_parts():
            return super().prepare(request)  # text: exactly TransformersEngine's rows
        refuse_unread_media(request, self.modalities)
        decoded = decode_media(request.state, self.limits, base=self.media_base)
        self._decoded = {id(part): item for (_, part), item in zip(request.media_parts(), decoded, strict=True)}
        try:
            return super().prepare(request)
        finally:
            self._decoded = {}

    def _refuse_media_tokens(self, request: DecisionRequest) -> None:
        """RequestError naming the first text that spells a media token: typed into a state value, a key, a
        question or an option, it would be read as a placeholder the processor expands (or as a vision / audio
        span start), not as text."""
        if not self.media_tokens:
            return
        for field, text in _texts(request):
            for token in self.media_tokens:
                if token in text:
                    raise RequestError(
                        field, f"contains {token!r}, one of the model's media tokens, as text",
                        'send media as a part ({"type": "image", "data": ...}); remove the token from the text',
                    )

    def _prompt(self, request: DecisionRequest, name: str, extra: int) -> tuple[list[int], bool, Any]:
        if not request.media_parts():
            return super()._prompt(request, name, extra)
        segments = state_segments(request.state, self.placeholders)
        ids, inputs = self._process(request, name, segments)
        if len(ids) + extra <= self.max_tokens:
            return ids, False, inputs
        if not self.truncate:
            raise ContextLengthError(f"questions.{name}", len(ids) + extra, self.max_tokens)
        for _ in range(4):  # re-tokenizing cut text can shift a few tokens: shrink until it fits
            segments = self._cut(segments, len(ids) + extra - self.max_tokens + 4, inputs)
            if segments is None:
                break
            ids, inputs = self._process(request, name, segments)
            if len(ids) + extra <= self.max_tokens:
                return ids, True, inputs
        raise ContextLengthError(f"questions.{name}", len(ids) + extra, self.max_tokens)

    def _process(self, request: DecisionRequest, name: str, segments: list[tuple[str, Any]]) -> tuple[list[int], dict]:
        """The processor on one question's prompt with the state `segments`: (token ids, media inputs)."""
        parts = [self._decoded[id(part)] for _, part in segments if part is not None]
        text = render_prompt(self.tokenizer, request, name, state_text="".join(t for t, _ in segments))
        out = self.media(
            text,
            images=[p.image for p in parts if isinstance(p, DecodedImage)],
            audio=[p.samples for p in parts if isinstance(p, DecodedAudio)],
            videos=[_video_array(p) for p in parts if isinstance(p, DecodedVideo)],
            fps=[p.fps for p in parts if isinstance(p, DecodedVideo)],
        )
        ids = out["input_ids"][0]
        inputs = {k: out[k] for k in MEDIA_INPUTS if k in out}
        self._check_audio(ids, inputs, parts)
        return ids.tolist(), inputs

    def _check_audio(self, ids: Tensor, inputs: dict, parts: list[Any]) -> None:
        """The audio placeholders must number the audio encoder's outputs for these features (transformers
        scatters a mismatch without a word, qwen3-omni.md §3)."""
        if "feature_attention_mask" not in inputs:
            return
        lengths = _audio_tokens(inputs["feature_attention_mask"], self.n_window)
        placed = int((ids == self.audio_token_id).sum())
        if placed != int(lengths.sum()):
            fields = ", ".join(p.field for p in parts if isinstance(p, DecodedAudio))
            raise RequestError(
                fields, f"the prompt holds {placed} audio placeholder tokens but the audio encoder makes "
                f"{int(lengths.sum())} from these features (window {self.n_window})",
                "the checkpoint's processor settings (n_window, hop_length) must match its audio encoder's config",
            )

    def _part_tokens(self, inputs: dict) -> tuple[list[int], list[int], list[int]]:
        """Tokens of each image, video and audio part of a processed prompt, each type in its parts' order."""
        m2 = self.merge_size**2
        images = [int(g.prod()) // m2 for g in inputs.get("image_grid_thw", [])]
        videos = [int(g.prod()) // m2 for g in inputs.get("video_grid_thw", [])]
        mask = inputs.get("feature_attention_mask")
        audio = _audio_tokens(mask, self.n_window).tolist() if mask is not None else []
        return images, videos, audio

    def _cut(self, segments: list[tuple[str, Any]], over: int, inputs: dict) -> list[tuple[str, Any]] | None:
        """`segments` short of about `over` tokens, from the end: text cut token-wise, a media part dropped whole
        (its span and start / end tokens) when the cut reaches it. None: nothing is left to cut."""
        images, videos, audio = (list(x) for x in self._part_tokens(inputs))
        kept = list(segments)
        while over > 0 and len(kept) > 1:  # "State:" stays
            text, part = kept.pop()
            if part is not None:
                counts = images if part["type"] == "image" else videos if part["type"] == "video" else audio
                over -= counts.pop() + 2
                continue
            ids = self._encode(text, False)
            if len(ids) > over:
                kept.append((self.tokenizer.decode(ids[: len(ids) - over]), None))
                over = 0
            else:
                over -= len(ids)
        return kept if over <= 0 else None

    # -- the forward pass ---------------------------------------------------------------------------------
    def warm(self, batch: list[Prepared]) -> None:
        if all(p.media is None for p in batch):
            super().warm(batch)  # a media batch runs eagerly: nothing to capture

    def _hidden(self, batch: list[Prepared], ids: Tensor) -> Tensor:
        media = [m for p in batch for m in (p.media or [None] * len(p.rows))]
        if all(m is None for m in media):
            return super()._hidden(batch, ids)
        rows = [r for p in batch for r in p.rows]
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            mask[i, : len(r)] = 1
        inputs = _join([m for m in media if m is not None], self.device, self.model.dtype)
        if hasattr(self.model.model, "language_model"):  # transformers >= 5.21: the thinker's model merges media
            return self.model.model(input_ids=ids, attention_mask=mask, use_cache=False, **inputs).last_hidden_state
        # transformers 5.17-5.20 merge media in the thinker's own forward, which ends in lm_head over every
        # position (no logits_to_keep): with the head swapped out its "logits" are the final hidden states
        head = self.model.lm_head
        self.model.lm_head = torch.nn.Identity()
        try:
            return self.model(input_ids=ids, attention_mask=mask, use_cache=False, **inputs).logits
        finally:
            self.model.lm_head = head


def _audio_tokens(feature_mask: Tensor, n_window: int) -> Tensor:
    """What the thinker's audio encoder outputs per clip for these features: transformers' own length rule."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni  # lazy: in the child only

    return omni._get_feat_extract_output_lengths(feature_mask.sum(-1), n_window)


def _video_array(video: DecodedVideo) -> Any:
    import numpy as np

    return np.stack(video.frames)  # [frames, height, width, 3] uint8


def _join(rows: list[dict], device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
    """The media inputs of a batch's rows as the model takes them: concatenated in row order (the order of the
    placeholders in the flattened batch); audio features padded to the batch's longest clip, its mask with them."""
    out: dict[str, Tensor] = {}
    for key in MEDIA_INPUTS:
        parts = [torch.as_tensor(r[key]) for r in rows if key in r]
        if not parts:
            continue
        if key in ("input_features", "feature_attention_mask"):
            width = max(p.shape[-1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts]
        joined = torch.cat(parts, dim=0)
        if joined.is_floating_point() and key != "video_second_per_grid":
            joined = joined.to(dtype)
        out[key] = joined.to(device)
    return out


def _texts(request: DecisionRequest) -> list[tuple[str, str]]:
    """(field, text) of every string a prompt is made from: state keys and values (inside lists and objects too,
    media parts excepted), question names, descriptions, option keys and their descriptions."""
    found: list[tuple[str, str]] = []

    def walk(field: str, value: Any) -> None:
        if is_media_part(value):
            return
        if isinstance(value, str):
            found.append((field, value))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(f"{field}[{i}]", item)
        elif isinstance(value, dict):
            for key, item in value.items():
                found.append((f"{field}.{key}", key))
                walk(f"{field}.{key}", item)

    for key, value in request.state.items():
        found.append((f"state.{key}", key))
        walk(f"state.{key}", value)
    for name, question in request.questions.items():
        found.append((f"questions.{name}", name))
        if question.description:
            found.append((f"questions.{name}.description", question.description))
        for key, text in (question.criteria or {}).items():
            found.append((f"questions.{name}.criteria.{key}", key))
            found.append((f"questions.{name}.criteria.{key}", text))
    return found
