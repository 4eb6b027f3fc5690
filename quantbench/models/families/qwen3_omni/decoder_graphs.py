"""CUDA graphs around the Qwen3-Omni text decoder of a decision that carries media.

A media decision's decoder input is not token ids but the merged embeddings, with 3-D rope positions and the
deepstack features added after the first decoder layers; transformers adds those with boolean indexing
(`hidden[visual_pos_masks] += ...`, a host sync), which no graph can capture. Here the deepstack features are
handed over dense ([rows, width, hidden], zero off the visual positions) and added by a forward hook on each of
those layers, which adds exactly nothing elsewhere, so the decoder captures as the text decoder does
(quantbench.engine.cudagraph): one graph per padded [rows, width] bucket, the same buckets, right padding that no
real token attends to, no attention mask. Each bucket's first replay is judged against the same forward run
eagerly on the same static inputs, on the answers' probabilities against the spread of two valid attention kernels
(quantbench.engine.cudagraph.check_replay; the error against transformers' own deepstack path is recorded beside
it); a bucket whose replay is refused runs eagerly, with the reason kept (`report`), and a capture that fails turns
the graphs off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from quantbench.engine.cudagraph import CudaCapture, bucket, check_replay, refusal


class GraphedMediaDecoder:
    """`decoder(inputs_embeds, position_ids, deepstack) -> last hidden states`, replayed from CUDA graphs.
    `head`: the model's output layer, which judges each bucket's first replay (None: the mean relative error of
    the hidden states must stay within 1%); `capture`: as GraphedDecoder's."""

    def __init__(self, decoder: Any, deep_layers: int, *, max_width: int, mode: str = "auto", width_step: int = 16,
                 max_graphs: int = 16, max_tokens: int = 1 << 14, head: Any = None, capture: Any = None):
        self.decoder, self.deep_layers, self.max_width, self.head = decoder, deep_layers, max_width, head
        self.width_step, self.max_graphs, self.max_tokens = width_step, max_graphs, max_tokens
        self.disabled: str | None = None if mode == "auto" else "off (asked for)"
        self.captured: list[list[int]] = []
        self.replays = 0
        self.checks: list[dict[str, Any]] = []  # each bucket's first replay against the eager decoder
        self.refused: dict[str, str] = {}  # "[rows, width]" -> why that bucket runs eagerly
        self._graphs: dict[tuple[int, int], tuple[Any, Tensor, Tensor, Tensor, Tensor]] = {}
        self._deep_now: Tensor | None = None  # the static deepstack buffer while a graph is captured
        self._capture_fn = capture
        self._on_any_device = capture is not None
        self._hooks = [decoder.layers[i].register_forward_hook(self._adder(i)) for i in range(deep_layers)]

    def has(self, rows: int, width: int) -> bool:
        """Whether a [rows, width] batch has its graph already (or none will be made for it)."""
        key = bucket(rows, width, self.width_step, self.max_width)
        return (key in self._graphs or str(list(key)) in self.refused or len(self._graphs) >= self.max_graphs
                or key[0] * key[1] > self.max_tokens)

    def report(self) -> dict[str, Any]:
        return {"captured": self.captured, "replays": self.replays, "disabled": self.disabled, "checks": self.checks,
                "refused": self.refused}

    def _adder(self, i: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> Any:
            if self._deep_now is None:  # an eager forward: transformers adds deepstack itself
                return None
            if isinstance(output, tuple):
                return (output[0] + self._deep_now[i], *output[1:])
            return output + self._deep_now[i]

        return hook

    def __call__(self, embeds: Tensor, positions: Tensor, deep: Tensor | None, eager: Any) -> Tensor | None:
        """The decoder's last hidden states [rows, width, hidden] replayed from this shape's graph (a view: read it
        before the next call), or None when no graph serves it (the caller runs `eager()` instead). `deep`: the
        dense deepstack features [deepstack layers, rows, width, hidden] (None: no picture). `eager`: the
        eager forward with transformers' deepstack path, recorded beside the first replay's check."""
        if self.disabled or (embeds.device.type != "cuda" and not self._on_any_device):
            return None
        rows, width = embeds.shape[:2]
        key = bucket(rows, width, self.width_step, self.max_width)
        if str(list(key)) in self.refused:
            return None
        entry = self._graphs.get(key)
        fresh = entry is None
        if fresh:
            if len(self._graphs) >= self.max_graphs or key[0] * key[1] > self.max_tokens:
                return None
            try:
                entry = self._graphs[key] = self._capture(key, embeds)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly, and say why
                self.disabled = f"capture of {list(key)} failed: {type(exc).__name__}: {str(exc)[:300]}"
                if embeds.device.type == "cuda":
                    torch.cuda.synchronize()
                return None
        replay, s_embeds, s_positions, s_deep, s_out = entry
        s_embeds.zero_()
        s_embeds[:rows, :width].copy_(embeds)
        s_positions.zero_()
        s_positions[:, :rows, :width].copy_(positions)
        s_deep.zero_()
        if deep is not None:
            s_deep[:, :rows, :width].copy_(deep)
        replay()
        self.replays += 1
        out = s_out[:rows, :width]
        if fresh:
            return self._check(key, out, rows, width, s_embeds, s_positions, s_deep, eager)
        return out

    def _check(self, key: tuple[int, int], out: Tensor, rows: int, width: int, s_embeds: Tensor, s_positions: Tensor,
               s_deep: Tensor, eager: Any) -> Tensor | None:
        """A bucket's first replay against the same forward run eagerly (the static inputs, no mask, deepstack by
        the hooks), judged by check_replay. The error against transformers' own path (attention mask, deepstack by
        indexing) is recorded beside it: it holds the kernels' other summation orders through 48 random layers
        (0.013-0.023 mean relative error on the H200, 2026-12-02), so it is no test of the graph;
        tests/test_omni_shape_towers.py pins the two paths' equality in fp32 on the CPU."""

        def same(n: int | None) -> Tensor:
            self._deep_now = s_deep[:, :n]
            try:
                return self.decoder(inputs_embeds=s_embeds[:n], position_ids=s_positions[:, :n],
                                    use_cache=False).last_hidden_state[:rows, :width]
            finally:
                self._deep_now = None

        replayed = out.clone()
        if self.head is not None:
            check = check_replay(replayed, lambda n: same(n)[:n], self.head)
        else:
            want = same(None).float()
            err = float((replayed.float() - want).abs().mean() / want.abs().mean().clamp_min(1e-12))
            check = {"shape": list(key), "mean_relative_error": err, "ok": err <= 1e-2}
        reference = eager().float()
        check["against_transformers_path"] = float((replayed.float() - reference).abs().mean()
                                                   / reference.abs().mean().clamp_min(1e-12))
        check["shape"] = list(key)
        self.checks.append(check)
        if not check["ok"]:
            self.refused[str(list(key))] = refusal(check) if "bound" in check else (
                f"the replay of {list(key)} differs from the same forward run eagerly (mean relative error "
                f"{check['mean_relative_error']:.3g})")
            self._graphs.pop(key, None)
            return None
        return out

    def _capture(self, key: tuple[int, int], like: Tensor) -> tuple[Any, Tensor, Tensor, Tensor, Tensor]:
        rows, width = key
        device, hidden = like.device, like.shape[-1]
        s_embeds = torch.zeros(rows, width, hidden, dtype=like.dtype, device=device)
        s_positions = torch.zeros(3, rows, width, dtype=torch.long, device=device)
        s_deep = torch.zeros(max(1, self.deep_layers), rows, width, hidden, dtype=like.dtype, device=device)
        if self._capture_fn is None:
            self._capture_fn = CudaCapture()

        def run() -> Tensor:  # the deepstack adds of the hooks are recorded with the forward they belong to
            self._deep_now = s_deep
            try:
                return self.decoder(inputs_embeds=s_embeds, position_ids=s_positions,
                                    use_cache=False).last_hidden_state
            finally:
                self._deep_now = None

        replay, out = self._capture_fn(run, device)
        self.captured.append(list(key))
        return replay, s_embeds, s_positions, s_deep, out
