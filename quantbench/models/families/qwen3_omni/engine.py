"""The decision engine of a model that reads media in the state: Qwen3-Omni-MoE's thinker.

It is TransformersEngine with two hooks filled (quantbench.engine.scoring): `_prompt` renders a question whose
state holds media parts with each part's placeholder, decodes the parts (once per part and process:
quantbench.protocol.media_cache) and runs the checkpoint's processor (quantbench.models.families.qwen3_omni.processor: pictures and
frames made on the model's device on a GPU, each part once per request), which expands each placeholder to the
part's tokens and makes the tensors the model reads; prepare also makes each row's 3-D rope positions on the host
(transformers' own `get_rope_index`). `_hidden` runs a batch that carries media with the host work first (where
each row's media go, the mask, the positions: one upload) and then device work only, no sync: the towers
(quantbench.models.families.qwen3_omni.towers: transformers' modules, one SDPA call per layer, CUDA graphs per media shape on a GPU)
once per distinct media of the batch, not once per question row (a record's questions share their media), their
outputs placed at the placeholders by index as transformers merges them (placeholders, deepstack), then the text
decoder (a CUDA graph per shape on a GPU); it hands back the last hidden states, so the head is applied only at
the positions read, as for text (the thinker's forward has no `logits_to_keep` and would compute the whole
vocabulary at every position). `phases`, when a benchmark sets it, times each phase of prepare and forward
(benchmarks/omni_shape.py). A request without media takes TransformersEngine's path unchanged: the same prompt
text, the text decoder replayed from a CUDA graph on a GPU.

What transformers does not check, quantbench does: text that spells one of the model's media tokens (a state value
`"<|audio_pad|>"` would become a placeholder) is refused naming its field, and the audio placeholders of a prompt
must number what the audio encoder will output for its features (transformers scatters a mismatch silently).
Media tokens count toward the context; `--truncate` cuts the state's text from its end and drops a media part
whole when the cut reaches it, never cutting inside its span.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from quantbench.engine.base import EngineReport
from quantbench.engine.scoring import Prepared, TransformersEngine
from quantbench.errors import ContextLengthError, RequestError
from quantbench.limits import Limits
from quantbench.models.families.qwen3_omni.decoder_graphs import GraphedMediaDecoder
from quantbench.models.families.qwen3_omni.media_batch import (
    MEDIA_INPUTS,
    BatchLayout,
    audio_frames,
    audio_tokens,
    dense_deepstack,
    distinct_media,
    join_media,
    on_host,
    shared_inputs,
    video_array,
    visual_deepstack,
)
from quantbench.models.families.qwen3_omni.media_context import check_media_headers
from quantbench.models.families.qwen3_omni.towers import Towers
from quantbench.protocol import DecisionRequest, is_media_part, refuse_unread_media
from quantbench.protocol.media import DecodedAudio, DecodedImage, DecodedVideo
from quantbench.protocol.media_cache import decode_media_once
from quantbench.protocol.prompt import render_prompt, state_segments


@dataclass(kw_only=True)
class OmniPrepared(Prepared):
    """A prepared request with, per row, its 3-D rope positions [3, len(row)] made on the host at prepare time
    (transformers' own get_rope_index on the row's token ids and grids: no device work, no sync in the forward);
    None for a row without media."""

    positions: list[Tensor | None] | None = None


class Phases:
    """Wall-clock milliseconds of the named phases of each prepare and forward (benchmarks/omni_shape.py's
    accounting), the device synchronized at every mark so that a phase holds its own device work: the syncs
    take away the overlap of host and device, so the phases of a call may sum to more than the call unmarked."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.calls: list[dict[str, float]] = []
        self._now: dict[str, float] | None = None
        self._t = 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def begin(self) -> None:
        self._sync()
        self._now, self._t = {}, time.perf_counter()

    def mark(self, name: str) -> None:
        if self._now is None:
            return
        self._sync()
        t = time.perf_counter()
        self._now[name] = self._now.get(name, 0.0) + (t - self._t) * 1e3
        self._t = t

    def end(self) -> None:
        if self._now is not None:
            self.calls.append(self._now)
        self._now = None


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
        self.phases: Phases | None = None  # set by a benchmark: each prepare's and forward's phases, timed
        # the decoder of a media decision, from CUDA graphs on a GPU (the text decoder's are self.decoder's)
        self.media_graphs = GraphedMediaDecoder(
            model.get_decoder(), len(model.config.vision_config.deepstack_visual_indexes), max_width=self.max_tokens,
            mode=kwargs.get("cuda_graph", "auto"), head=model.get_output_embeddings()) \
            if self.device.type == "cuda" else None
        self._decoded: dict[int, Any] = {}  # id(part) -> its decoded media, while one request is prepared
        self._memo: dict = {}  # the processor's tensors per list of parts, while one request is prepared
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
        if self.phases is not None:
            self.phases.begin()
        try:
            return self._prepare(request)
        finally:
            if self.phases is not None:
                self.phases.end()

    def _mark(self, name: str) -> None:
        if self.phases is not None:
            self.phases.mark(name)

    def _prepare(self, request: DecisionRequest) -> Prepared:
        self._refuse_media_tokens(request)
        if not request.media_parts():
            prepared = super().prepare(request)  # text: exactly TransformersEngine's rows
            self._mark("prompt")
            return prepared
        refuse_unread_media(request, self.modalities)
        self._mark("checks")
        decoded = decode_media_once(request.state, self.limits, base=self.media_base,
                                    check=lambda headers: check_media_headers(self, request, headers))
        self._decoded = {id(part): item for (_, part), item in zip(request.media_parts(), decoded, strict=True)}
        self._mark("decode")
        try:
            prepared = super().prepare(request)
        finally:
            self._decoded, self._memo = {}, {}
        media = shared_inputs(prepared.media)
        self._mark("checks")
        positions = [None if m is None else self._row_positions(row, m) for row, m in zip(prepared.rows, media,
                                                                                            strict=True)]
        self._mark("positions")
        fields = {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)}
        return OmniPrepared(**{**fields, "media": media}, positions=positions)

    def _row_positions(self, row: list[int], media: dict[str, Any]) -> Tensor:
        """The 3-D rope positions [3, len(row)] of one row, by the model's own get_rope_index, on the host."""
        ids = torch.tensor([row])
        features = media.get("feature_attention_mask")
        owner = self.model.model if hasattr(self.model.model, "language_model") else self.model
        positions, _ = owner.get_rope_index(
            ids, on_host(media.get("image_grid_thw")), on_host(media.get("video_grid_thw")), torch.ones_like(ids), False,
            on_host(features).sum(-1) if features is not None else None, on_host(media.get("video_second_per_grid")))
        return positions[:, 0]

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
        raise ContextLengthError(f"questions.{name}", len(ids) + extra, self.max_tokens, truncated=True)

    def _process(self, request: DecisionRequest, name: str, segments: list[tuple[str, Any]]) -> tuple[list[int], dict]:
        """The processor on one question's prompt with the state `segments`: (token ids, media inputs). The
        request's questions share each part's tensors (`self._memo`): the media are processed once a request."""
        parts = [self._decoded[id(part)] for _, part in segments if part is not None]
        text = render_prompt(self.tokenizer, request, name, state_text="".join(t for t, _ in segments))
        self._mark("prompt")
        videos = [p for p in parts if isinstance(p, DecodedVideo)]
        for p in videos:  # stacked once a request (setdefault would stack on every question, then drop it)
            if ("frames", id(p)) not in self._memo:
                self._memo["frames", id(p)] = video_array(p)
        arrays = [self._memo["frames", id(p)] for p in videos]
        out = self.media(
            text,
            images=[p.image for p in parts if isinstance(p, DecodedImage)],
            audio=[p.samples for p in parts if isinstance(p, DecodedAudio)],
            videos=arrays,
            fps=[p.fps for p in videos],
            memo=self._memo,
        )
        self._mark("processor")
        ids = out["input_ids"][0]
        inputs = {k: out[k] for k in MEDIA_INPUTS if k in out}
        self._check_audio(ids, inputs, parts)
        return ids.tolist(), inputs

    def _check_audio(self, ids: Tensor, inputs: dict, parts: list[Any]) -> None:
        """The audio placeholders must number the audio encoder's outputs for these features (transformers
        scatters a mismatch without a word, qwen3-omni.md §3)."""
        if "feature_attention_mask" not in inputs:
            return
        lengths = audio_tokens(inputs["feature_attention_mask"], self.n_window)
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
        audio = audio_tokens(mask, self.n_window).tolist() if mask is not None else []
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
        for m in distinct_media(m for p in batch for m in (p.media or []) if m is not None) if towers else []:
            inputs = join_media([m], self.device, self.model.dtype, host_meta=True)
            if "pixel_values" in inputs:
                towers.warm_vision(inputs["pixel_values"], inputs["image_grid_thw"])
            if "pixel_values_videos" in inputs:
                towers.warm_vision(inputs["pixel_values_videos"], inputs["video_grid_thw"])
            if "input_features" in inputs:
                towers.warm_audio(*audio_frames(inputs))
        if self.media_graphs is not None and not self.media_graphs.disabled:
            rows = [r for p in batch for r in p.rows]
            if not self.media_graphs.has(len(rows), max(len(r) for r in rows)):
                self.forward_many(batch)  # captures (and checks) this shape's decoder graph, untimed

    def forward_many(self, batch: list[Prepared]) -> list[dict[str, Any]]:
        if self.phases is not None:
            self.phases.begin()
        try:
            out = super().forward_many(batch)
            self._mark("head")
            return out
        finally:
            if self.phases is not None:
                self.phases.end()

    def _hidden(self, batch: list[Prepared], ids: Tensor) -> Tensor:
        media = [m for p in batch for m in (p.media or [None] * len(p.rows))]
        if all(m is None for m in media):
            return super()._hidden(batch, ids)
        self._mark("ids")
        layout = self._layout(batch, media, ids.shape[1])  # host work first: one upload, then only device work
        distinct = distinct_media(m for m in media if m is not None)
        inputs = {id(m): join_media([m], self.device, self.model.dtype, host_meta=True) for m in distinct}
        self._mark("upload")
        # each distinct media once: a record's question rows (and a continuation's option rows) share theirs
        encoded = {id(m): self._run_towers(inputs[id(m)]) for m in distinct}
        self._mark("towers")
        hidden = self._decode(ids, layout, media, encoded)
        self._mark("decoder")
        return hidden

    def _run_towers(self, inputs: dict[str, Tensor]) -> dict[str, Any]:
        """The tower outputs of one row's media: audio [tokens, H]; image and video (embeddings, deepstack)."""
        out: dict[str, Any] = {}
        if "input_features" in inputs:
            if self.towers is not None:
                out["audio"] = self.towers.audio(*audio_frames(inputs))
            else:
                out["audio"] = self.model.get_audio_features(
                    inputs["input_features"], inputs["feature_attention_mask"].to(self.device),
                    return_dict=True).last_hidden_state
        for kind, pixels, grid in (("image", "pixel_values", "image_grid_thw"),
                                   ("video", "pixel_values_videos", "video_grid_thw")):
            if pixels not in inputs:
                continue
            if self.towers is not None:
                out[kind] = self.towers.vision(inputs[pixels], inputs[grid])
                continue
            get = self.model.get_image_features if kind == "image" else self.model.get_video_features
            got = get(inputs[pixels], inputs[grid].to(self.device), return_dict=True)
            deep = [torch.cat(list(f)) if isinstance(f, (list, tuple)) else f for f in got.deepstack_features]
            out[kind] = (torch.cat(list(got.pooler_output)), deep)  # 5.24 splits deepstack per image, 5.17 not
        return out

    def _layout(self, batch: list[Prepared], media: list[Any], width: int) -> BatchLayout:
        """Where each row's media go in the flattened [rows * width] batch, its attention mask and 3-D positions,
        all from the rows' token ids on the host and uploaded in one copy (transformers finds them on the device
        with boolean masks, get_rope_index's loops and `.sum()` checks: host syncs between device kernels)."""
        config = self.model.config
        rows = [r for p in batch for r in p.rows]
        positions = [q for p in batch for q in (getattr(p, "positions", None) or [None] * len(p.rows))]
        flat = np.full((len(rows), width), -1, dtype=np.int64)
        pos = np.ones((3, len(rows), width), dtype=np.int64)  # get_rope_index's value off the real tokens
        for i, (r, m) in enumerate(zip(rows, media, strict=True)):
            flat[i, : len(r)] = r
            if m is None:
                pos[:, i, : len(r)] = np.arange(len(r))
            else:
                q = positions[i] if positions[i] is not None and positions[i].shape[-1] == len(r) else \
                    self._row_positions(r, m)
                pos[:, i, : len(r)] = q.numpy()
        flat = flat.reshape(-1)
        at = {kind: np.flatnonzero(flat == token) for kind, token in
              (("audio", config.audio_token_id), ("image", config.image_token_id), ("video", config.video_token_id))}
        visual = np.union1d(at["image"], at["video"])
        pieces = {"mask": (flat >= 0).astype(np.int64), "positions": pos.reshape(-1), **at, "visual": visual,
                  "image_rank": np.searchsorted(visual, at["image"]), "video_rank": np.searchsorted(visual, at["video"])}
        packed = torch.from_numpy(np.concatenate(list(pieces.values()))).to(self.device)
        out, start = {}, 0
        for key, value in pieces.items():
            out[key] = packed[start: start + len(value)]
            start += len(value)
        counts = {k: len(v) for k, v in at.items()}
        return BatchLayout(mask=out["mask"].view(len(rows), width), positions=out["positions"].view(3, len(rows), width),
                       at={k: out[k] for k in at}, visual=out["visual"], rank={k: out[f"{k}_rank"] for k in ("image", "video")},
                       counts=counts, n_visual=len(visual))

    def _decode(self, ids: Tensor, layout: BatchLayout, media: list[Any], encoded: dict[int, dict[str, Any]]) -> Tensor:
        """The text decoder over the merged embeddings (`_merge`): from a CUDA graph per padded shape on a GPU
        (quantbench.models.families.qwen3_omni.decoder_graphs: deepstack added densely), else eagerly with transformers' deepstack path."""
        embeds, deep = self._merge(ids, layout, media, encoded)
        self._mark("merge")

        def eager() -> Tensor:
            visual_at, deepstack = visual_deepstack(embeds, layout, deep)
            return self.model.get_decoder()(inputs_embeds=embeds, attention_mask=layout.mask,
                                            position_ids=layout.positions, use_cache=False,
                                            visual_pos_masks=visual_at, deepstack_visual_embeds=deepstack).last_hidden_state

        if self.media_graphs is not None and not self.media_graphs.disabled:
            hidden = self.media_graphs(embeds, layout.positions, dense_deepstack(embeds, layout, deep), eager)
            if hidden is not None:
                return hidden
        return eager()

    def _merge(self, ids: Tensor, layout: BatchLayout, media: list[Any],
               encoded: dict[int, dict[str, Any]]) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """(embeddings, deepstack features per kind): the embeddings of `ids` with each row's tower outputs at its
        placeholders, in transformers' order (rows, then parts within a row), by index (no host sync); the
        image and video deepstack features, one [tokens, hidden] per deepstack layer, in the same order."""
        embeds = self.model.get_input_embeddings()(ids)
        flat = embeds.view(-1, embeds.shape[-1])
        per_row = [encoded[id(m)] for m in media if m is not None]
        deep: dict[str, list[Tensor]] = {}
        for kind in ("audio", "image", "video"):
            got = [e[kind] for e in per_row if kind in e]
            if not got:
                continue
            feats = torch.cat([g if kind == "audio" else g[0] for g in got]).to(embeds.dtype)
            if layout.counts[kind] != feats.shape[0]:  # transformers raises for images and video too
                raise RuntimeError(f"{kind}: {layout.counts[kind]} placeholder tokens for {feats.shape[0]} features")
            flat.index_copy_(0, layout.at[kind], feats)
            if kind != "audio":
                deep[kind] = [torch.cat([g[1][level] for g in got]).to(embeds.dtype) for level in range(len(got[0][1]))]
        return embeds, deep


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
