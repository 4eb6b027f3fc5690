"""Qwen3-Omni's vision and audio towers, run by quantbench over transformers' own modules and weights.

transformers (5.17 and 5.24 alike) runs each tower call from Python: every call recomputes what depends only on
the media's shape (the vision tower's position-embedding interpolation, 2-D rotary angles and attention windows;
the audio tower's chunking, window boundaries and valid positions, with host syncs: `.tolist()`, `.item()`), and
with sdpa attention splits every layer's attention into one call per window (a Python loop; a video is one window
per frame pair, 10 s of audio two windows). On the H200 the towers are launch-bound: the vision tower is 1 GiB of
weights and under 1 TFLOP for one 448 x 448 image, yet took 17-25 ms (../shared/reference/qwen3-omni.md §7).

Here a tower call is split in two. The shape plan (`_VisionPlan`, `_AudioPlan`), made once per media shape and
cached: transformers' own helpers compute the positions, rotary angles and windows, and the position embeddings
are gathered. The body: patch embedding (or the audio convolutions), the blocks and the mergers, with each
layer's attention one `scaled_dot_product_attention` call over all windows (windows of one length as a batch, so
SDPA's fused flash kernel applies; unequal windows under a block-diagonal mask). On a GPU the body of each plan is
captured once as a CUDA graph and replayed (`graphs="auto"`). The numerics are transformers' own up to the order
of floating-point sums inside SDPA: tests/test_omni_shape_towers.py compares both paths on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F


def _omni():
    from transformers.models.qwen3_omni_moe import (
        modeling_qwen3_omni_moe as omni,  # lazy: the child imports it
    )

    return omni


def _windows(lengths: list[int], device: torch.device) -> tuple[int | None, Tensor | None]:
    """How one attention call covers these windows: (their common length, None) when all are equal (a batch of
    windows), else (None, a block-diagonal boolean mask [1, 1, S, S])."""
    if len(set(lengths)) == 1:
        return lengths[0], None
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return None, (owner[:, None] == owner[None, :]).to(device)[None, None]


def _attention(q: Tensor, k: Tensor, v: Tensor, window: int | None, mask: Tensor | None, scale: float) -> Tensor:
    """Non-causal attention of [S, heads, d] q / k / v within their windows, as [S, heads * d]."""
    s, heads, d = q.shape
    if window is not None:  # n windows of one length: [n, heads, window, d], no mask (SDPA's flash path)
        q, k, v = (t.reshape(s // window, window, heads, d).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, scale=scale)
        return out.transpose(1, 2).reshape(s, heads * d)
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1).reshape(s, heads * d)


@dataclass
class _Graph:
    """One captured body: its static input and outputs."""

    graph: Any
    inputs: Tensor
    outputs: Any


@dataclass
class _VisionPlan:
    pos_embeds: Tensor  # [S, hidden], the interpolated learned positions
    cos: Tensor
    sin: Tensor
    window: int | None
    mask: Tensor | None
    graph: _Graph | None = None


@dataclass
class _AudioPlan:
    gather: Tensor  # [chunks, max_len]: frame index of each padded chunk position (0 where padded)
    keep: Tensor  # [chunks, 1, max_len]: 1 where a real frame, 0 where padding
    positions: Tensor  # [1, T', d_model] sinusoids of the post-convolution positions
    valid: Tensor  # flat indices of the real positions after the convolutions
    window: int | None
    mask: Tensor | None
    frames: int  # the features' frame count this plan is for
    graph: _Graph | None = None


@dataclass
class TowerCounts:
    """How many tower bodies ran, and plans were made (tests count them: one per record, not per question)."""

    vision: int = 0
    audio: int = 0
    plans: int = 0
    graphs: int = 0
    notes: list[str] = field(default_factory=list)


class Towers:
    """The thinker's vision and audio towers, run by quantbench (see the module docstring). `graphs`: "auto"
    captures each plan's body as a CUDA graph on a GPU; "off" runs it from Python."""

    def __init__(self, model: Any, graphs: str = "auto"):
        owner = model.model if hasattr(model.model, "visual") else model  # transformers >= 5.21 / 5.17-5.20
        self.visual, self.audio_tower = owner.visual, owner.audio_tower
        self.device = next(self.visual.parameters()).device
        self.graphs = graphs == "auto" and self.device.type == "cuda"
        self.counts = TowerCounts()
        self._vision_plans: dict[tuple, _VisionPlan] = {}
        self._audio_plans: dict[tuple, _AudioPlan] = {}
        self._pool = None

    def describe(self) -> dict[str, Any]:
        return {"towers": "quantbench (one SDPA call per layer" + (", CUDA graph per media shape)" if self.graphs
                                                                      else ")"),
                "tower_graphs": self.counts.graphs, **({"tower_notes": self.counts.notes} if self.counts.notes else {})}

    # -- vision --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def vision(self, pixel_values: Tensor, grid_thw: Tensor) -> tuple[Tensor, list[Tensor]]:
        """(merged embeddings [tokens, out_hidden], deepstack features, one [tokens, out_hidden] per deepstack
        layer) of the images or videos `pixel_values` with grids `grid_thw`, in their order."""
        plan, pixels = self._vision_ready(pixel_values, grid_thw)
        self.counts.vision += 1
        return self._run(plan, pixels, lambda x: self._vision_body(plan, x))

    @torch.inference_mode()
    def warm_vision(self, pixel_values: Tensor, grid_thw: Tensor) -> None:
        """Make the plan (and on a GPU capture the graph) these images need, outside any timing."""
        plan, pixels = self._vision_ready(pixel_values, grid_thw)
        if self.graphs and plan.graph is None:
            plan.graph = self._capture(pixels, lambda x: self._vision_body(plan, x))

    def _vision_ready(self, pixel_values: Tensor, grid_thw: Tensor) -> tuple[_VisionPlan, Tensor]:
        key = tuple(int(x) for x in grid_thw.flatten().tolist())
        plan = self._vision_plans.get(key)
        if plan is None:
            plan = self._vision_plans[key] = self._vision_plan(grid_thw)
        return plan, pixel_values.to(self.device, self.visual.patch_embed.proj.weight.dtype)

    def _vision_plan(self, grid_thw: Tensor) -> _VisionPlan:
        omni, visual = _omni(), self.visual
        grid = grid_thw.to(self.device)
        indices, weights = omni.get_vision_interpolation_indices_and_weights(
            grid, num_grid_per_side=visual.num_grid_per_side, mode=visual.interpolation_mode,
            align_corners=visual.interpolation_align_corners, spatial_merge_size=visual.config.spatial_merge_size,
            kwargs={})
        positions = omni.get_vision_position_ids(grid, visual.spatial_merge_size, kwargs={})
        cu_seqlens, _ = omni.get_vision_attention_seqlens(grid, visual.config, kwargs={})
        dtype = visual.patch_embed.proj.weight.dtype
        pos_embeds = (visual.pos_embed(indices) * weights[:, :, None]).sum(1).to(dtype)
        cos, sin = visual.rotary_pos_emb(pos_embeds, positions)
        window, mask = _windows((cu_seqlens[1:] - cu_seqlens[:-1]).tolist(), self.device)
        self.counts.plans += 1
        return _VisionPlan(pos_embeds, cos, sin, window, mask)

    def _vision_body(self, plan: _VisionPlan, pixels: Tensor) -> tuple[Tensor, list[Tensor]]:
        omni, visual = _omni(), self.visual
        hidden = visual.patch_embed(pixels) + plan.pos_embeds
        s = hidden.shape[0]
        deepstack = []
        for i, block in enumerate(visual.blocks):
            attn = block.attn
            q, k, v = attn.qkv(block.norm1(hidden)).reshape(s, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            q, k = omni.apply_rotary_pos_emb_vision(q, k, plan.cos, plan.sin)
            hidden = hidden + attn.proj(_attention(q, k, v, plan.window, plan.mask, attn.scaling))
            hidden = hidden + block.mlp(block.norm2(hidden))
            if i in visual.deepstack_visual_indexes:
                deepstack.append(visual.merger_list[visual.deepstack_visual_indexes.index(i)](hidden))
        return visual.merger(hidden), deepstack

    # -- audio ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def audio(self, input_features: Tensor, feature_lens: Tensor) -> Tensor:
        """The audio tower's output [tokens, output_dim] for the clips' features `input_features` [mel, frames]
        (the clips' real frames, one after another) of lengths `feature_lens`."""
        plan, features = self._audio_ready(input_features, feature_lens)
        self.counts.audio += 1
        return self._run(plan, features, lambda x: self._audio_body(plan, x))

    @torch.inference_mode()
    def warm_audio(self, input_features: Tensor, feature_lens: Tensor) -> None:
        """Make the plan (and on a GPU capture the graph) these clips need, outside any timing."""
        plan, features = self._audio_ready(input_features, feature_lens)
        if self.graphs and plan.graph is None:
            plan.graph = self._capture(features, lambda x: self._audio_body(plan, x))

    def _audio_ready(self, input_features: Tensor, feature_lens: Tensor) -> tuple[_AudioPlan, Tensor]:
        key = tuple(int(x) for x in feature_lens.tolist())
        plan = self._audio_plans.get(key)
        if plan is None:
            plan = self._audio_plans[key] = self._audio_plan(feature_lens)
        return plan, input_features.to(self.device, self.audio_tower.conv2d1.weight.dtype)

    def _audio_plan(self, feature_lens: Tensor) -> _AudioPlan:
        omni, tower = _omni(), self.audio_tower
        lens = feature_lens.to("cpu")
        n_window = tower.n_window
        frames = torch.arange(int(lens.sum()))
        # transformers' chunk_and_pad_features, as an index: chunks of 2 * n_window frames, padded to the longest
        padded, chunk_lengths = omni.chunk_and_pad_features(frames[None].float(), lens, n_window)
        real = torch.arange(padded.shape[-1])[None] < chunk_lengths[:, None]
        gather = torch.where(real, padded[:, 0].long(), 0)
        valid = omni.get_valid_indices(chunk_lengths, n_window)
        cu_seqlens = omni.get_audio_cu_seqlens(chunk_lengths, lens, tower.n_window_infer, n_window)
        after = padded.shape[-1]
        for _ in range(3):  # three stride-2 convolutions
            after = (after - 1) // 2 + 1
        positions = tower.positional_embedding.positional_embedding[:after].unsqueeze(0)
        window, mask = _windows((cu_seqlens[1:] - cu_seqlens[:-1]).tolist(), self.device)
        self.counts.plans += 1
        dtype = tower.conv2d1.weight.dtype
        return _AudioPlan(gather.to(self.device), real[:, None].to(self.device, dtype), positions.to(self.device),
                          valid.to(self.device), window, mask, int(lens.sum()))

    def _audio_body(self, plan: _AudioPlan, features: Tensor) -> Tensor:
        tower = self.audio_tower
        chunks = features.T[plan.gather].transpose(1, 2) * plan.keep  # [chunks, mel, max_len], zero-padded
        x = F.gelu(tower.conv2d1(chunks.unsqueeze(1)))
        x = F.gelu(tower.conv2d2(x))
        x = F.gelu(tower.conv2d3(x))
        b, c, f, t = x.shape
        x = tower.conv_out(x.permute(0, 3, 1, 2).contiguous().view(b, t, c * f))
        x = x + plan.positions.to(x.dtype)
        hidden = torch.index_select(x.reshape(-1, x.shape[-1]), 0, plan.valid)
        s = hidden.shape[0]
        for layer in tower.layers:
            attn = layer.self_attn
            y = layer.self_attn_layer_norm(hidden)
            q, k, v = (p(y).reshape(s, attn.num_heads, -1) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            hidden = hidden + attn.out_proj(_attention(q, k, v, plan.window, plan.mask, attn.scaling))
            y = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
            hidden = hidden + y
            if hidden.dtype == torch.float16:  # transformers' clamp for fp16
                limit = torch.finfo(hidden.dtype).max - 1000
                hidden = torch.clamp(hidden, min=-limit, max=limit)
        hidden = tower.ln_post(hidden)
        return tower.proj2(tower.act(tower.proj1(hidden)))

    # -- running a body: from Python, or replayed from its CUDA graph ----------------------------------------
    def _run(self, plan: Any, x: Tensor, body: Any) -> Any:
        if not self.graphs:
            return body(x)
        if plan.graph is None:
            plan.graph = self._capture(x, body)
            if plan.graph is None:  # the capture failed: from Python from now on, and said why (describe())
                return body(x)
        g = plan.graph
        g.inputs.copy_(x)
        g.graph.replay()
        out = g.outputs  # static: the caller's next replay would overwrite them
        if isinstance(out, tuple):
            return out[0].clone(), [t.clone() for t in out[1]]
        return out.clone()

    def _capture(self, x: Tensor, body: Any) -> _Graph | None:
        """The body captured for this input's shape, checked once against the body run from Python (the same
        kernels: equal within bf16 rounding); None, with graphs off from then on and the reason kept, when the
        capture fails or its replay disagrees."""
        try:
            graph = self._capture_unchecked(x, body)
            graph.inputs.copy_(x)
            graph.graph.replay()
            want = body(x)
            got = graph.outputs
            pairs = [(got[0], want[0]), *zip(got[1], want[1], strict=True)] if isinstance(want, tuple) else [(got, want)]
            for a, b in pairs:
                if not torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2):
                    raise RuntimeError(f"the replay differs from the eager body by {(a.float() - b.float()).abs().max():.3g}")
            return graph
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly, and say why
            self.graphs = False
            self.counts.notes.append(f"tower CUDA graphs off: {type(exc).__name__}: {str(exc)[:300]}")
            torch.cuda.synchronize()
            return None

    def _capture_unchecked(self, x: Tensor, body: Any) -> _Graph:
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm: kernels chosen and autotuned before capture
            for _ in range(2):
                body(static)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = body(static)
        self.counts.graphs += 1
        return _Graph(graph, static, outputs)
