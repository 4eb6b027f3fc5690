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

Each bucket's graph is checked once, when it is captured, against the same forward run eagerly on the same input
(`check_replay`): a replay may differ from an eager forward only as two valid kernels differ. It does differ: on
the H200 the attention (cuDNN's SDPA, the only SDPA backend that takes these GQA inputs there) computes another
plan under capture than eagerly, deterministic in each mode (two replays agree bit for bit, two eager forwards
too; the first differing module is layer 0's attention output; with the attention pinned to the math kernel,
replay and eager agree exactly): through 48 random layers that is a mean relative error of 0.013 in the last hidden
states and a total variation of 0.005 in the next-token distribution (benchmarks/graph_replay_diff.py,
docs/BENCHMARKS.md). So the replay is judged on the answers' probabilities (the next-token distribution at each
row's last column, through the model's head) against the spread of two valid kernels measured on the same input
(the eager forward against the same forward with the attention pinned to the math kernel), and never below the
card's practical margin (TV 0.01): a graph that replays stale or garbage inputs moves them by tenths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

MODES = ("auto", "off")
TV_MARGIN = 0.01  # the card's practical margin on TV (quantbench.analysis.stats): below it no verdict moves
SPREAD_FACTOR = 4.0  # a replay may move the answers up to this many times what two valid kernels move them
SPREAD_ROWS = 4  # the second kernel (math attention materialises [rows, heads, width, width]) runs on this many rows


@dataclass
class GraphReport:
    """What the graphs did in a run; recorded on the run row (extra.cuda_graph)."""

    mode: str
    captured: list[list[int]] = field(default_factory=list)  # [rows, width] of each captured bucket
    replays: int = 0
    eager_calls: int = 0
    disabled: str | None = None  # why graphs stopped being used, if they did
    checks: list[dict[str, Any]] = field(default_factory=list)  # each bucket's replay against the eager forward
    refused: dict[str, str] = field(default_factory=dict)  # "[rows, width]" -> why that bucket runs eagerly

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "captured": self.captured, "replays": self.replays,
                "eager_calls": self.eager_calls, "disabled": self.disabled, "checks": self.checks,
                "refused": self.refused}


class CudaCapture:
    """Captures `fn()` into a CUDA graph: two warm-up calls on a side stream (lazy inits happen there, as
    torch.cuda.graphs asks), the warm-up's cached blocks handed back, then the capture into one memory pool that
    every bucket of a decoder shares (each graph's output is read before the next replay, so buckets may reuse each
    other's scratch memory). Returns (replay, the graph's static output)."""

    def __init__(self) -> None:
        self._pool = None

    def __call__(self, fn: Callable[[], Tensor], device: torch.device) -> tuple[Callable[[], None], Tensor]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        # The warm-up's blocks stay cached for the side stream, where the capture cannot use them; at batch 32 of
        # the 30B shape that doubling ran the H200 out of memory (2026-11-29). Hand them back first.
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = fn()
        return graph.replay, out


def math_attention() -> Any:
    """SDPA pinned to its math kernel: the second valid attention kernel a replay is judged against."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


@torch.no_grad()
def _next_token(head: Any, hidden: Tensor) -> Tensor:
    return torch.softmax(head(hidden).float(), dim=-1)


def _tv(p: Tensor, q: Tensor) -> float:
    """Mean over rows of the total variation between two batches of distributions."""
    return float(0.5 * (p - q).abs().sum(-1).mean())


def check_replay(replayed: Tensor, run: Callable[[int | None], Tensor], head: Any) -> dict[str, Any]:
    """Judge a replay. `replayed`: the replay's last hidden states [rows, width, hidden]; `run(n)`: the same forward
    run eagerly on the same input's first n rows (None: all), [n, width, hidden]; `head`: the model's output
    layer. Compares the next-token distributions at the last column (what a label answer reads) of the replay
    and of the eager forward, and of the eager forward and the same forward with the attention pinned to the
    math kernel (the spread of two valid kernels, on SPREAD_ROWS rows); accepted when the first is within
    max(TV_MARGIN, SPREAD_FACTOR x the second). Returns the figures and `ok`."""
    eager = run(None)
    n = min(SPREAD_ROWS, replayed.shape[0])
    with math_attention():
        second = run(n)
    last = replayed.shape[1] - 1
    p_replay, p_eager = _next_token(head, replayed[:, last]), _next_token(head, eager[:, last])
    p_second = _next_token(head, second[:, last])
    a, b = replayed.float(), eager.float()
    tv_replay, tv_spread = _tv(p_replay, p_eager), _tv(p_second, p_eager[:n])
    bound = max(TV_MARGIN, SPREAD_FACTOR * tv_spread)
    return {"shape": list(replayed.shape[:2]), "tv_replay_vs_eager": tv_replay, "tv_two_kernels": tv_spread,
            "bound": bound, "mean_relative_error": float((a - b).abs().mean() / b.abs().mean().clamp_min(1e-12)),
            "ok": tv_replay <= bound}


def refusal(check: dict[str, Any]) -> str:
    return (f"the replay of {check['shape']} moves the next-token distribution by TV {check['tv_replay_vs_eager']:.3g} "
            f"against the eager forward, over its bound {check['bound']:.3g} (two valid attention kernels: "
            f"{check['tv_two_kernels']:.3g})")


def bucket(rows: int, width: int, width_step: int, max_width: int) -> tuple[int, int]:
    """The padded shape a [rows, width] batch runs at: rows up to a power of two, width up to a multiple of
    `width_step` or of 1/32 of the width's power of two, whichever is larger (at most ~6% padding when long)."""
    padded_rows = 1 << max(0, rows - 1).bit_length()
    step = max(width_step, (1 << max(0, width - 1).bit_length()) // 32)
    padded_width = min(max_width, -(-width // step) * step)
    return padded_rows, max(padded_width, width)


class GraphedDecoder:
    """`decoder(input_ids=ids, use_cache=False).last_hidden_state`, replayed from CUDA graphs where it can be.

    The returned hidden states are a view of a graph's static output: read them before the next call. `head`: the
    model's output layer, which judges each bucket's replay (check_replay); None: replays are not checked.
    `capture`: how a graph is made (CudaCapture; the tests hand a stand-in that replays by running again, to check
    on a CPU that every replay reads its own call's input)."""

    def __init__(self, decoder: Any, *, pad_id: int, max_width: int, mode: str = "auto", width_step: int = 16,
                 max_graphs: int = 64, max_tokens: int = 1 << 16, head: Any = None, capture: Any = None):
        if mode not in MODES:
            raise ValueError(f"cuda graph mode {mode!r}: use one of {', '.join(MODES)}")
        self.decoder, self.pad_id, self.max_width, self.head = decoder, pad_id, max_width, head
        self.width_step, self.max_graphs, self.max_tokens = width_step, max_graphs, max_tokens
        self.report = GraphReport(mode)
        self._graphs: dict[tuple[int, int], tuple[Callable[[], None], Tensor, Tensor]] = {}
        self._capture_fn = capture
        self._on_any_device = capture is not None
        if mode == "off":
            self.report.disabled = "off (asked for)"

    def disable(self, reason: str) -> None:
        self.report.disabled = reason

    def _eager(self, ids: Tensor) -> Tensor:
        self.report.eager_calls += 1
        return self.decoder(input_ids=ids, use_cache=False).last_hidden_state

    def ensure(self, rows: int, width: int, device: torch.device) -> bool:
        """Capture (and check) the graph a [rows, width] batch replays, if it has none yet; False when it will run
        eagerly. The runner calls this before it starts a decision's clock, so no timed decision includes a capture."""
        return self._graph_for(rows, width, device) is not None

    def _graph_for(self, rows: int, width: int, device: torch.device):
        """(replay, static input, static output) for this shape's bucket, captured on first use; None: eager."""
        if self.report.disabled or (device.type != "cuda" and not self._on_any_device):
            return None
        key = bucket(rows, width, self.width_step, self.max_width)
        if key in self._graphs:
            return self._graphs[key]
        if str(list(key)) in self.report.refused:
            return None
        if len(self._graphs) >= self.max_graphs or key[0] * key[1] > self.max_tokens:
            return None  # an unusual shape: not worth a graph's memory
        try:
            entry = self._capture(key, device)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly, and say why
            self.report.disabled = f"capture of {list(key)} failed: {type(exc).__name__}: {str(exc)[:300]}"
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return None
        if entry is None:
            return None
        self._graphs[key] = entry
        return entry

    def __call__(self, ids: Tensor) -> Tensor:
        rows, width = ids.shape
        entry = self._graph_for(rows, width, ids.device)
        if entry is None:
            return self._eager(ids)
        replay, static_ids, static_out = entry
        static_ids.fill_(self.pad_id)
        static_ids[:rows, :width].copy_(ids)
        replay()
        self.report.replays += 1
        return static_out[:rows, :width]

    def _capture(self, key: tuple[int, int], device: torch.device):
        """The bucket's graph, or None when its replay is refused (the bucket then runs eagerly, the reason kept)."""
        static_ids = torch.full(key, self.pad_id, dtype=torch.long, device=device)
        if self._capture_fn is None:
            self._capture_fn = CudaCapture()
        replay, static_out = self._capture_fn(
            lambda: self.decoder(input_ids=static_ids, use_cache=False).last_hidden_state, device)
        self.report.captured.append(list(key))
        if self.head is not None:
            # judged on random tokens of the bucket's shape: a kernel's choice depends on the shape, not the values
            gen = torch.Generator(device=device).manual_seed(0)
            vocab = self.decoder.get_input_embeddings().num_embeddings
            static_ids.copy_(torch.randint(0, vocab, key, generator=gen, device=device))
            replay()
            check = check_replay(static_out.clone(), lambda n: self.decoder(
                input_ids=static_ids[:n], use_cache=False).last_hidden_state, self.head)
            self.report.checks.append(check)
            if not check["ok"]:
                self.report.refused[str(list(key))] = refusal(check)
                return None
        return replay, static_ids, static_out
