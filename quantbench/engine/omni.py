"""The decision engine of a model that reads media in the state: Qwen3-Omni-MoE's thinker.

It is TransformersEngine with two hooks filled (quantbench.engine.scoring): `_prompt` renders a question whose
state holds media parts with each part's placeholder, decodes the parts (once per part and process:
quantbench.protocol.media_cache) and runs the checkpoint's processor (quantbench.models.processor), which expands
each placeholder to the part's tokens and makes the tensors the model reads; `_hidden` runs a batch that carries
media: the towers (quantbench.engine.towers: transformers' modules, one SDPA call per layer, CUDA graphs per media
shape on a GPU) once per distinct media of the batch, not once per question row (a record's questions share its
media), their outputs merged into the text embeddings as transformers merges them (placeholders, deepstack), 3-D
rope positions from transformers' own `get_rope_index`, then the text decoder; it hands back the last hidden
states, so the head is applied only at the positions read, as for text (the thinker's forward has no
`logits_to_keep` and would compute the whole vocabulary at every position). `split` keeps, per forward, the
time of the towers and of the decoder when asked (benchmarks/omni_shape.py). A request without media takes
TransformersEngine's path unchanged: the same prompt text, the text decoder replayed from a CUDA graph on a GPU.

What transformers does not check, quantbench does: text that spells one of the model's media tokens (a state value
`"<|audio_pad|>"` would become a placeholder) is refused naming its field, and the audio placeholders of a prompt
must number what the audio encoder will output for its features (transformers scatters a mismatch silently).
Media tokens count toward the context; `--truncate` cuts the state's text from its end and drops a media part
whole when the cut reaches it, never cutting inside its span.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from quantbench.engine.base import EngineReport
from quantbench.engine.omni_graph import GraphedMediaDecoder
from quantbench.engine.scoring import Prepared, TransformersEngine
from quantbench.engine.towers import Towers
from quantbench.errors import ContextLengthError, RequestError
from quantbench.limits import Limits
from quantbench.protocol import DecisionRequest, is_media_part, refuse_unread_media
from quantbench.protocol.media import DecodedAudio, DecodedImage, DecodedVideo
from quantbench.protocol.media_cache import decode_media_once
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
                 media_base: Path | None = None, towers: str = "quantbench", **kwargs: Any):
        super().__init__(model, tokenizer, **kwargs)
        self.media, self.limits, self.media_base = media, limits or Limits(), media_base
        # towers="transformers": the thinker's own get_*_features (the benchmark's reference); else quantbench's
        self.towers = Towers(model, graphs=kwargs.get("cuda_graph", "auto")) if towers == "quantbench" else None
        self.split: list[dict[str, float]] | None = None  # per media forward {towers_ms, decoder_ms}, when a list
        # the decoder of a media decision, from CUDA graphs on a GPU (the text decoder's are self.decoder's)
        self.media_graphs = GraphedMediaDecoder(
            model.get_decoder(), len(model.config.vision_config.deepstack_visual_indexes), max_width=self.max_tokens,
            mode=kwargs.get("cuda_graph", "auto")) if self.device.type == "cuda" else None
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
        """TransformersEngine's, with what read the media (the run's `extra.media`) and ran the towers."""
        media = self.media.describe() if self.media is not None else {"modalities": []}
        if media["modalities"]:
            media = {**media, **(self.towers.describe() if self.towers is not None
                                 else {"towers": "transformers get_image/video/audio_features"})}
            if self.media_graphs is not None:
                media["decoder_graphs"] = self.media_graphs.report()
        return dataclasses.replace(super().report(), media=media)

    # -- preparing (decoding, the processor, the checks) ------------------------------------------------------
    def prepare(self, request: DecisionRequest) -> Prepared:
        self._refuse_media_tokens(request)
        if not request.media_parts():
            return super().prepare(request)  # text: exactly TransformersEngine's rows
        refuse_unread_media(request, self.modalities)
        decoded = decode_media_once(request.state, self.limits, base=self.media_base)
        self._decoded = {id(part): item for (_, part), item in zip(request.media_parts(), decoded, strict=True)}
        try:
            prepared = super().prepare(request)
        finally:
            self._decoded = {}
        prepared.media = _shared(prepared.media)
        return prepared

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
    @torch.inference_mode()
    def warm(self, batch: list[Prepared]) -> None:
        """Text: the decoder's CUDA graph. Media: the towers' plans and graphs for these media shapes, so that no
        timed decision includes a capture."""
        if all(p.media is None for p in batch):
            super().warm(batch)
            return
        towers = self.towers
        for m in _distinct(m for p in batch for m in (p.media or []) if m is not None) if towers else []:
            inputs = _join([m], self.device, self.model.dtype)
            if "pixel_values" in inputs:
                towers.warm_vision(inputs["pixel_values"], inputs["image_grid_thw"])
            if "pixel_values_videos" in inputs:
                towers.warm_vision(inputs["pixel_values_videos"], inputs["video_grid_thw"])
            if "input_features" in inputs:
                towers.warm_audio(*_audio_frames(inputs))
        if self.media_graphs is not None and not self.media_graphs.disabled:
            rows = [r for p in batch for r in p.rows]
            if not self.media_graphs.has(len(rows), max(len(r) for r in rows)):
                self.forward_many(batch)  # captures (and checks) this shape's decoder graph, untimed

    def _hidden(self, batch: list[Prepared], ids: Tensor) -> Tensor:
        media = [m for p in batch for m in (p.media or [None] * len(p.rows))]
        if all(m is None for m in media):
            return super()._hidden(batch, ids)
        rows = [r for p in batch for r in p.rows]
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            mask[i, : len(r)] = 1
        timing = self.split is not None and self.device.type == "cuda"
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if timing else []
        t0 = time.perf_counter()
        if timing:
            marks[0].record()
        # each distinct media once: a record's question rows (and a continuation's option rows) share theirs
        distinct = _distinct(m for m in media if m is not None)
        encoded = {id(m): self._run_towers(_join([m], self.device, self.model.dtype)) for m in distinct}
        if timing:
            marks[1].record()
        t1 = time.perf_counter()
        hidden = self._decode(ids, mask, media, encoded)
        if self.split is not None:
            if timing:
                marks[2].record()
                marks[2].synchronize()
                self.split.append({"towers_ms": marks[0].elapsed_time(marks[1]),
                                   "decoder_ms": marks[1].elapsed_time(marks[2])})
            else:
                self.split.append({"towers_ms": (t1 - t0) * 1e3, "decoder_ms": (time.perf_counter() - t1) * 1e3})
        return hidden

    def _run_towers(self, inputs: dict[str, Tensor]) -> dict[str, Any]:
        """The tower outputs of one row's media: audio [tokens, H]; image and video (embeddings, deepstack)."""
        out: dict[str, Any] = {}
        if "input_features" in inputs:
            if self.towers is not None:
                out["audio"] = self.towers.audio(*_audio_frames(inputs))
            else:
                out["audio"] = self.model.get_audio_features(
                    inputs["input_features"], inputs["feature_attention_mask"], return_dict=True).last_hidden_state
        for kind, pixels, grid in (("image", "pixel_values", "image_grid_thw"),
                                   ("video", "pixel_values_videos", "video_grid_thw")):
            if pixels not in inputs:
                continue
            if self.towers is not None:
                out[kind] = self.towers.vision(inputs[pixels], inputs[grid])
                continue
            get = self.model.get_image_features if kind == "image" else self.model.get_video_features
            got = get(inputs[pixels], inputs[grid], return_dict=True)
            deep = [torch.cat(list(f)) if isinstance(f, (list, tuple)) else f for f in got.deepstack_features]
            out[kind] = (torch.cat(list(got.pooler_output)), deep)  # 5.24 splits deepstack per image, 5.17 not
        return out

    def _decode(self, ids: Tensor, mask: Tensor, media: list[Any], encoded: dict[int, dict[str, Any]]) -> Tensor:
        """The text decoder over the merged embeddings (`_merge`): from a CUDA graph per padded shape on a GPU
        (quantbench.engine.omni_graph: deepstack added densely), else eagerly with transformers' deepstack path."""
        embeds, positions, visual_at, deepstack = self._merge(ids, mask, media, encoded)

        def eager() -> Tensor:
            return self.model.get_decoder()(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                                            use_cache=False, visual_pos_masks=visual_at,
                                            deepstack_visual_embeds=deepstack).last_hidden_state

        if self.media_graphs is not None:
            hidden = self.media_graphs(embeds, positions, _dense(embeds, visual_at, deepstack), eager)
            if hidden is not None:
                return hidden
        return eager()

    def _merge(self, ids: Tensor, mask: Tensor, media: list[Any],
               encoded: dict[int, dict[str, Any]]) -> tuple[Tensor, Tensor, Tensor | None, list[Tensor] | None]:
        """(embeddings, 3-D rope positions, visual positions, deepstack features): the embeddings of `ids` with
        each row's tower outputs at its placeholders, as transformers' thinker merges them (the same order: rows,
        then parts within a row), positions from the model's own get_rope_index."""
        config = self.model.config
        embeds = self.model.get_input_embeddings()(ids)
        per_row = [(m, encoded[id(m)]) for m in media if m is not None]

        def scatter(token_id: int, parts: list[Tensor], what: str) -> Tensor | None:
            if not parts:
                return None
            at = ids == token_id
            feats = torch.cat(parts).to(embeds.dtype)
            if int(at.sum()) != feats.shape[0]:  # transformers raises for images and video too
                raise RuntimeError(f"{what}: {int(at.sum())} placeholder tokens for {feats.shape[0]} features")
            embeds.masked_scatter_(at[..., None].expand_as(embeds), feats)
            return at

        scatter(config.audio_token_id, [e["audio"] for _, e in per_row if "audio" in e], "audio")
        image_at = scatter(config.image_token_id, [e["image"][0] for _, e in per_row if "image" in e], "image")
        video_at = scatter(config.video_token_id, [e["video"][0] for _, e in per_row if "video" in e], "video")
        visual_at, deepstack = None, None
        if image_at is not None or video_at is not None:
            visual_at = image_at if video_at is None else video_at if image_at is None else image_at | video_at
            levels = [[e[k][1] for _, e in per_row if k in e] for k in ("image", "video")]
            deepstack = []
            for level in range(len(self.model.config.vision_config.deepstack_visual_indexes)):
                joint = embeds.new_zeros(int(visual_at.sum()), embeds.shape[-1])
                for at, parts in ((image_at, levels[0]), (video_at, levels[1])):
                    if at is not None:
                        joint[at[visual_at]] = torch.cat([p[level] for p in parts]).to(joint.dtype)
                deepstack.append(joint)

        def joined(key: str) -> Tensor | None:
            parts = [m[key] for m, _ in per_row if key in m]
            return torch.cat([torch.as_tensor(p) for p in parts]).to(self.device) if parts else None

        feature_mask = joined("feature_attention_mask")
        owner = self.model.model if hasattr(self.model.model, "language_model") else self.model
        positions, _ = owner.get_rope_index(ids, joined("image_grid_thw"), joined("video_grid_thw"), mask, False,
                                            feature_mask.sum(-1) if feature_mask is not None else None,
                                            joined("video_second_per_grid"))
        return embeds, positions, visual_at, deepstack


def _dense(embeds: Tensor, visual_at: Tensor | None, deepstack: list[Tensor] | None) -> list[Tensor] | None:
    """Deepstack features as [rows, width, hidden] tensors, zero off the visual positions (what the graphed
    decoder adds after each deepstack layer)."""
    if not deepstack:
        return None
    dense = []
    for joint in deepstack:
        full = embeds.new_zeros(embeds.shape)
        full[visual_at] = joint
        dense.append(full)
    return dense


def _distinct(items: Any) -> list[Any]:
    """The distinct objects of `items` (by identity), in order of first appearance."""
    seen: dict[int, Any] = {}
    for item in items:
        seen.setdefault(id(item), item)
    return list(seen.values())


def _shared(media: list[Any] | None) -> list[Any] | None:
    """A request's per-row media inputs with equal ones made one object: its questions see the same parts, and
    the forward runs the towers once per distinct object (the processor made each question's tensors anew)."""
    if media is None:
        return None
    kept: list[dict] = []
    out = []
    for m in media:
        same = None if m is None else next((k for k in kept if k is m or _equal(k, m)), None)
        if m is not None and same is None:
            kept.append(m)
            same = m
        out.append(same)
    return out


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def _audio_frames(inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The clips' real feature frames [mel, frames] one after another, and each clip's length, as transformers'
    get_audio_features hands them to the audio tower."""
    mask = inputs["feature_attention_mask"]
    return inputs["input_features"].permute(0, 2, 1)[mask.bool()].permute(1, 0), mask.sum(-1)


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
