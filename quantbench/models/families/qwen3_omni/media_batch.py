"""A batch of media decisions as the thinker's forward takes it: each row's media inputs joined along the batch,
where each row's placeholders sit in the flattened batch (`BatchLayout`, made on the host by OmniEngine._layout),
the deepstack features laid out for transformers' decoder and for the graphed one, and the small helpers a
request's media go through on their way (the distinct parts of a batch, a request's equal inputs made one object,
the audio frames and token counts of transformers' own rules). Apart from engine.py, which prepares requests and
runs the forward, because calibration (quantbench.models.calibration) and training (quantbench.make.omni_fixture_train)
join media rows as the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from quantbench.protocol.media import DecodedVideo

# The model inputs a media row carries, and how a batch joins them: along the first dimension, except the audio
# features, which are padded to the longest clip of the batch first.
MEDIA_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "video_second_per_grid",
                "input_features", "feature_attention_mask")


def dense_deepstack(embeds: Tensor, layout: BatchLayout, deep: dict[str, list[Tensor]]) -> Tensor | None:
    """Deepstack features as one [layers, rows, width, hidden] tensor, zero off the visual positions (what the
    graphed decoder adds after each deepstack layer); None without pictures."""
    if not deep:
        return None
    levels = len(next(iter(deep.values())))
    dense = embeds.new_zeros(levels, embeds.shape[0] * embeds.shape[1], embeds.shape[-1])
    for kind, features in deep.items():
        dense.index_copy_(1, layout.at[kind], torch.stack(features))
    return dense.view(levels, *embeds.shape)


def visual_deepstack(embeds: Tensor, layout: BatchLayout, deep: dict[str, list[Tensor]]) -> tuple[Tensor | None, list[Tensor] | None]:
    """(visual positions mask [rows, width], deepstack features per layer over the visual positions in row-major
    order): what transformers' decoder takes for its deepstack path; (None, None) without pictures."""
    if not deep:
        return None, None
    mask = torch.zeros(embeds.shape[0] * embeds.shape[1], dtype=torch.bool, device=embeds.device)
    mask[layout.visual] = True
    levels = len(next(iter(deep.values())))
    joint = [embeds.new_zeros(layout.n_visual, embeds.shape[-1]) for _ in range(levels)]
    for kind, features in deep.items():
        for level in range(levels):
            joint[level].index_copy_(0, layout.rank[kind], features[level])
    return mask.view(embeds.shape[:2]), joint


@dataclass
class BatchLayout:
    """A media batch's host-made index tensors, on the device (OmniEngine._layout)."""

    mask: Tensor  # [rows, width] 1 on real tokens
    positions: Tensor  # [3, rows, width]
    at: dict[str, Tensor]  # kind -> flat positions of its placeholders, in order
    visual: Tensor  # flat positions of image and video placeholders, sorted
    rank: dict[str, Tensor]  # image / video -> each placeholder's index among `visual`
    counts: dict[str, int]
    n_visual: int


def distinct_media(items: Any) -> list[Any]:
    """The distinct objects of `items` (by identity), in order of first appearance."""
    seen: dict[int, Any] = {}
    for item in items:
        seen.setdefault(id(item), item)
    return list(seen.values())


def shared_inputs(media: list[Any] | None) -> list[Any] | None:
    """A request's per-row media inputs with equal ones made one object: its questions see the same parts, and
    the forward runs the towers once per distinct object (the processor made each question's tensors anew)."""
    if media is None:
        return None
    kept: list[dict] = []
    out = []
    for m in media:
        same = None if m is None else next((k for k in kept if k is m or equal_inputs(k, m)), None)
        if m is not None and same is None:
            kept.append(m)
            same = m
        out.append(same)
    return out


def equal_inputs(a: dict, b: dict) -> bool:
    """Equal inputs: the same tensors (a request's questions share them: no device compare, no sync), or equal
    values."""
    return a.keys() == b.keys() and all(a[k] is b[k] or torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k]))
                                        for k in a)


def on_host(value: Any) -> Tensor | None:
    return None if value is None else torch.as_tensor(value).cpu()


def audio_frames(inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The clips' real feature frames [mel, frames] one after another, and each clip's length, as transformers'
    get_audio_features hands them to the audio tower."""
    mask, features = inputs["feature_attention_mask"], inputs["input_features"]
    if mask.device != features.device:  # the mask on the host (join_media's host_meta): gather by index, no sync
        real = torch.nonzero(mask.reshape(-1).bool()).squeeze(1).to(features.device)
        frames = features.permute(0, 2, 1).reshape(-1, features.shape[1]).index_select(0, real)
        return frames.permute(1, 0), mask.sum(-1)
    return features.permute(0, 2, 1)[mask.bool()].permute(1, 0), mask.sum(-1)


def audio_tokens(feature_mask: Tensor, n_window: int) -> Tensor:
    """What the thinker's audio encoder outputs per clip for these features: transformers' own length rule."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni  # lazy: in the child only

    return omni._get_feat_extract_output_lengths(feature_mask.sum(-1), n_window)


def video_array(video: DecodedVideo) -> Any:
    return np.asarray(video.frames)  # [frames, height, width, 3] uint8: decoded as one array, not copied again


def join_media(rows: list[dict], device: torch.device, dtype: torch.dtype, host_meta: bool = False) -> dict[str, Tensor]:
    """The media inputs of a batch's rows as the model takes them: concatenated in row order (the order of the
    placeholders in the flattened batch); audio features padded to the batch's longest clip, its mask with them.
    `host_meta`: the grids, the audio mask and the video timing stay on the host (quantbench's towers read them
    there: a device copy would be read back with a sync); the features go to `device` in `dtype`."""
    out: dict[str, Tensor] = {}
    for key in MEDIA_INPUTS:
        parts = [torch.as_tensor(r[key]) for r in rows if key in r]
        if not parts:
            continue
        if key in ("input_features", "feature_attention_mask"):
            width = max(p.shape[-1] for p in parts)
            parts = [torch.nn.functional.pad(p, (0, width - p.shape[-1])) for p in parts]
        joined = torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]
        meta = key in ("image_grid_thw", "video_grid_thw", "video_second_per_grid", "feature_attention_mask")
        if host_meta and meta:
            out[key] = joined.cpu()
            continue
        out[key] = joined.to(device, dtype) if joined.is_floating_point() and key != "video_second_per_grid" \
            else joined.to(device)
    return out
