"""CUDA graphs around the decision forward: one captured graph per padded batch shape, replayed per decision.

A 48-layer MoE forward launches thousands of small kernels; run from Python, launching them costs more than
running them (measured on an H200 at the 30B shape: 80 ms eager, 31 ms replayed, NOTES.md). A graph is captured
for a static input shape, so the decision batch [rows, width] is padded up to a bucket: rows to a power of two,
width to a multiple of 16 tokens (of 1/32 of its power of two when longer, so padding stays under ~6%). Padding changes nothing the engine reads: scoring right-pads already
(causal attention never looks at later positions), padded rows are whole sequences of their own, and every other
op of the decoder (norms, MoE routing, experts) works on each token alone.

Capture needs a forward without host synchronisation (no `.item()`, no `nonzero()`): transformers'
`grouped_mm` experts and quantbench's grouped-MoE engine qualify; the `eager` experts loop does not. When a capture
fails the model runs eagerly from then on and the failure is reported (never a crash, never a silent mislabel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

MODES = ("auto", "off")


@dataclass
class GraphReport:
    """What the graphs did in a run; recorded on the run row (extra.cuda_graph)."""

    mode: str
    captured: list[list[int]] = field(default_factory=list)  # [rows, width] of each captured bucket
    replays: int = 0
    eager_calls: int = 0
    disabled: str | None = None  # why graphs stopped being used, if they did

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "captured": self.captured, "replays": self.replays,
                "eager_calls": self.eager_calls, "disabled": self.disabled}


def bucket(rows: int, width: int, width_step: int, max_width: int) -> tuple[int, int]:
    """The padded shape a [rows, width] batch runs at: rows up to a power of two, width up to a multiple of
    `width_step` or of 1/32 of the width's power of two, whichever is larger (at most ~6% padding when long)."""
    padded_rows = 1 << max(0, rows - 1).bit_length()
    step = max(width_step, (1 << max(0, width - 1).bit_length()) // 32)
    padded_width = min(max_width, -(-width // step) * step)
    return padded_rows, max(padded_width, width)


class GraphedDecoder:
    """`decoder(input_ids=ids, use_cache=False).last_hidden_state`, replayed from CUDA graphs where it can be.

    The returned hidden states are a view of a graph's static output: read them before the next call."""

    def __init__(self, decoder: Any, *, pad_id: int, max_width: int, mode: str = "auto", width_step: int = 16,
                 max_graphs: int = 64, max_tokens: int = 1 << 16):
        if mode not in MODES:
            raise ValueError(f"cuda graph mode {mode!r}: use one of {', '.join(MODES)}")
        self.decoder, self.pad_id, self.max_width = decoder, pad_id, max_width
        self.width_step, self.max_graphs, self.max_tokens = width_step, max_graphs, max_tokens
        self.report = GraphReport(mode)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}
        self._pool = None
        if mode == "off":
            self.report.disabled = "off (asked for)"

    def disable(self, reason: str) -> None:
        self.report.disabled = reason

    def _eager(self, ids: Tensor) -> Tensor:
        self.report.eager_calls += 1
        return self.decoder(input_ids=ids, use_cache=False).last_hidden_state

    def ensure(self, rows: int, width: int, device: torch.device) -> bool:
        """Capture the graph a [rows, width] batch replays, if it has none yet; False when it will run eagerly.
        The runner calls this before it starts a decision's clock, so no timed decision includes a capture."""
        return self._graph_for(rows, width, device) is not None

    def _graph_for(self, rows: int, width: int, device: torch.device):
        """(graph, static input, static output) for this shape's bucket, captured on first use; None: eager."""
        if self.report.disabled or device.type != "cuda":
            return None
        key = bucket(rows, width, self.width_step, self.max_width)
        if key in self._graphs:
            return self._graphs[key]
        if len(self._graphs) >= self.max_graphs or key[0] * key[1] > self.max_tokens:
            return None  # an unusual shape: not worth a graph's memory
        try:
            self._graphs[key] = self._capture(key, device)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly, and say why
            self.report.disabled = f"capture of {list(key)} failed: {type(exc).__name__}: {str(exc)[:300]}"
            torch.cuda.synchronize(device)
            return None
        return self._graphs[key]

    def __call__(self, ids: Tensor) -> Tensor:
        rows, width = ids.shape
        entry = self._graph_for(rows, width, ids.device)
        if entry is None:
            return self._eager(ids)
        graph, static_ids, static_out = entry
        static_ids.fill_(self.pad_id)
        static_ids[:rows, :width].copy_(ids)
        graph.replay()
        self.report.replays += 1
        return static_out[:rows, :width]

    def _capture(self, key: tuple[int, int], device: torch.device):
        static_ids = torch.full(key, self.pad_id, dtype=torch.long, device=device)
        if self._pool is None:
            # One memory pool for every bucket: each graph's output is read before the next replay, so buckets may
            # reuse each other's scratch memory.
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks: lazy inits happen here
            for _ in range(2):
                self.decoder(input_ids=static_ids, use_cache=False)
        torch.cuda.current_stream(device).wait_stream(side)
        # The warm-up's blocks stay cached for the side stream, where the capture cannot use them; at batch 32 of
        # the 30B shape that doubling ran the H200 out of memory (2026-11-29). Hand them back first.
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_out = self.decoder(input_ids=static_ids, use_cache=False).last_hidden_state
        self.report.captured.append(list(key))
        return graph, static_ids, static_out
