"""CUDA-graph replays judged and fed on a CPU (quantbench.engine.cudagraph, quantbench.models.families.qwen3_omni.decoder_graphs).

A graph replays the kernels it captured on its static input buffers: a decoder that forgot to refresh one of them
(ids, embeddings, 3-D positions, deepstack features) would answer the previous request. The decoders take their
capture as a parameter, so here a stand-in "captures" by running the forward once and "replays" by running it
again on the same static buffers, which is what a graph computes: every request must then get its own answer,
and the check every bucket passes once must accept an exact replay and refuse a stale one. The CUDA graphs
themselves run on the H200 (benchmarks/graph_replay_diff.py, benchmarks/gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch

from quantbench.engine.cudagraph import SPREAD_FACTOR, TV_MARGIN, GraphedDecoder, check_replay
from quantbench.models.families.qwen3_omni.decoder_graphs import GraphedMediaDecoder
from tests.tiny import tiny_model


class RerunCapture:
    """A CPU stand-in for CudaCapture: the replay runs the captured forward again on the static buffers and writes
    the result into the output the capture returned (a graph's replay rewrites its static output in place)."""

    def __call__(self, fn, device):
        out = fn().clone()
        return (lambda: out.copy_(fn())), out


class StaleCapture(RerunCapture):
    """A capture whose replay recomputes nothing: the output keeps what the capture computed (from the buffers'
    contents at capture time), as a graph would whose input buffer is not the one the decoder refreshes."""

    def __call__(self, fn, device):
        out = fn().clone()
        return (lambda: None), out


def test_each_request_gets_its_own_answer_from_a_replayed_text_decoder():
    model = tiny_model(seed=3)
    decoder = model.get_decoder()
    graphed = GraphedDecoder(decoder, pad_id=0, max_width=512, head=model.get_output_embeddings(), capture=RerunCapture())
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows, width in ((2, 30), (2, 27), (1, 30), (2, 30)):  # the first two share a bucket: a replay each
            ids = torch.randint(2, 600, (rows, width), generator=gen)
            got = graphed(ids).clone()
            want = decoder(input_ids=ids, use_cache=False).last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert graphed.report.replays == 4 and graphed.report.eager_calls == 0
    assert len(graphed.report.checks) == 2 and all(c["ok"] for c in graphed.report.checks)
    assert graphed.report.checks[0]["tv_replay_vs_eager"] < 1e-6


def test_a_stale_replay_is_refused_and_its_bucket_runs_eagerly_with_the_reason():
    model = tiny_model(seed=3)
    decoder = model.get_decoder()
    graphed = GraphedDecoder(decoder, pad_id=0, max_width=512, head=model.get_output_embeddings(), capture=StaleCapture())
    ids = torch.randint(2, 600, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = graphed(ids)
        want = decoder(input_ids=ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(got, want)  # answered, eagerly
    assert graphed.report.eager_calls == 1 and graphed.report.replays == 0
    (check,) = graphed.report.checks
    assert not check["ok"] and check["tv_replay_vs_eager"] > check["bound"]
    assert "[2, 32]" in graphed.report.refused and "TV" in graphed.report.refused["[2, 32]"]
    assert graphed.report.disabled is None  # only that bucket: another shape still gets its graph


def test_the_bound_is_the_cards_margin_or_a_multiple_of_two_kernels_spread():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden = torch.randn(3, 5, 8)

    def judged(replay_noise: float, spread_noise: float) -> dict:
        def run(n):
            out = hidden if n is None else hidden[:n]
            if torch.nn.attention.sdpa_kernel is not None and _math_pinned():
                out = out + spread_noise * torch.randn_like(out)
            return out
        return check_replay(hidden + replay_noise * torch.randn_like(hidden), run, head)

    exact = judged(0.0, 0.0)
    assert exact["ok"] and exact["tv_replay_vs_eager"] == 0 and exact["bound"] == TV_MARGIN
    wide = judged(0.0, 1.0)
    assert wide["bound"] == pytest.approx(SPREAD_FACTOR * wide["tv_two_kernels"]) and wide["bound"] > TV_MARGIN
    far = judged(3.0, 0.0)
    assert not far["ok"] and far["tv_replay_vs_eager"] > TV_MARGIN


def _math_pinned() -> bool:
    """Whether the caller runs under check_replay's second kernel (SDPA pinned to math)."""
    from torch.nn.attention import SDPBackend, _cur_sdpa_kernel_backends

    return list(_cur_sdpa_kernel_backends()) == [SDPBackend.MATH]


def test_a_replayed_media_decoder_answers_each_picture_not_the_one_before():
    """Two requests whose pictures differ, one after the other through the same bucket's graph: each answer is
    the eager engine's for its own picture (the embeddings, 3-D positions and deepstack features refreshed)."""
    from quantbench.protocol import parse_request
    from tests.test_omni_media import QUESTIONS, STATES, uri
    from tests.test_omni_media import png as picture
    from tests.test_omni_shape_towers import engine

    eager = engine()
    graphed = engine()
    graphed.media_graphs = GraphedMediaDecoder(
        graphed.model.get_decoder(), len(graphed.model.config.vision_config.deepstack_visual_indexes),
        max_width=graphed.max_tokens, head=graphed.model.get_output_embeddings(), capture=RerunCapture())
    try:
        for seed in (1, 2, 3):
            camera = {"type": "image", "data": uri("image/png", picture(seed))}
            req = parse_request({"state": {**STATES["image"], "camera": camera}, "questions": QUESTIONS})
            got = graphed.forward(graphed.prepare(req))
            want = eager.forward(eager.prepare(req))
            for name in want:
                assert got[name].probabilities == pytest.approx(want[name].probabilities, abs=1e-6)
        report = graphed.media_graphs.report()
        assert report["replays"] == 3 and len(report["checks"]) == 1 and report["checks"][0]["ok"]
    finally:
        for hook in graphed.media_graphs._hooks:
            hook.remove()
