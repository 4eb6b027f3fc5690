"""Issue #25 part 8: quantbench's vision and audio towers (quantbench.models.families.qwen3_omni.towers) compute what transformers'
own Qwen3-Omni towers compute, on CPU (where the CUDA-graph part is off; the body it would capture is what runs):
one image, two images of different sizes (unequal attention windows: the block-diagonal mask), a video (equal
windows: the batched path), one audio clip of 10 s (two windows of 104 and 26) and two clips; and the engine's
media forward (its towers, its merge, transformers' get_rope_index, the text decoder) equals the thinker's own
forward on the same inputs. fp32, so the only differences are summation order inside attention."""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
import torch

from quantbench.models.families.qwen3_omni.engine import OmniEngine
from quantbench.models.families.qwen3_omni.processor import processor_from_settings
from quantbench.models.families.qwen3_omni.towers import Towers
from tests.omni_tiny import AUDIO_FEATURES, IMAGE, full_model, omni_tokenizer


@cache
def thinker():
    """The tiny thinker in fp32, its towers' query and key weights scaled up: at the init's std of 0.02 every
    attention is near uniform, and attending across a window's edge would change the output by under 1e-5."""
    model = full_model().thinker.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(part in name for part in ("attn.qkv.", "self_attn.q_proj.", "self_attn.k_proj.")):
                p.mul_(30.0)
    return model


def engine(towers: str = "quantbench") -> OmniEngine:
    model, tok = thinker(), omni_tokenizer()
    media = processor_from_settings({"image": IMAGE, "audio": AUDIO_FEATURES, "video": IMAGE}, tok, model, "test")
    return OmniEngine(model, tok, media=media, towers=towers, cuda_graph="off", fused_ops="off")


@pytest.mark.parametrize("grids", [[[1, 6, 8]], [[1, 6, 8], [1, 4, 4]], [[2, 4, 6]]],
                         ids=["one-image", "two-image-sizes", "video"])
def test_the_vision_tower_equals_transformers(grids):
    model = thinker()
    grid = torch.tensor(grids)
    pixels = torch.randn(int(grid.prod(-1).sum()), 3 * 2 * 16 * 16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = model.get_image_features(pixels, grid, return_dict=True)
    ours = Towers(model, graphs="off")
    embeds, deepstack = ours.vision(pixels, grid)
    torch.testing.assert_close(embeds, torch.cat(list(want.pooler_output)), atol=1e-6, rtol=1e-5)
    want_deep = [torch.cat(list(f)) if isinstance(f, (list, tuple)) else f for f in want.deepstack_features]
    assert len(deepstack) == len(want_deep) == 1
    torch.testing.assert_close(deepstack[0], want_deep[0], atol=1e-6, rtol=1e-5)
    assert ours.counts.vision == 1 and ours.counts.plans == 1


@pytest.mark.parametrize("lengths", [[1000], [1000, 230], [37]], ids=["10s", "two-clips", "short"])
def test_the_audio_tower_equals_transformers(lengths):
    model = thinker()
    features = torch.randn(len(lengths), 128, max(lengths), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    with torch.inference_mode():
        want = model.get_audio_features(features, mask, return_dict=True).last_hidden_state
    flat = features.permute(0, 2, 1)[mask.bool()].permute(1, 0)
    ours = Towers(model, graphs="off")
    got = ours.audio(flat, mask.sum(-1))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    ours.audio(flat, mask.sum(-1))
    assert ours.counts.plans == 1  # the second call of the same shape reuses its plan


def last_hidden(ids: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The thinker's own forward (transformers 5.17 and 5.24 alike) with its head swapped out: its "logits" are
    the last hidden states."""
    model = thinker()
    head, model.lm_head = model.lm_head, torch.nn.Identity()
    try:
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **inputs).logits
    finally:
        model.lm_head = head


def test_the_media_forward_equals_the_thinkers_own():
    from tests.test_omni_media import request

    ours, theirs = engine(), engine(towers="transformers")
    for kind in ("image", "audio", "video", "frames"):
        prepared = ours.prepare(request(kind))
        prepared = dataclasses.replace(prepared, rows=prepared.rows[:1], media=prepared.media[:1],
                                       positions=prepared.positions[:1])  # one row
        ids = torch.tensor(prepared.rows)
        inputs = prepared.media[0]
        with torch.inference_mode():
            want = last_hidden(ids, inputs)
            got = ours._hidden([prepared], ids)
            reference = theirs._hidden([prepared], ids)  # transformers' towers, quantbench's merge
        torch.testing.assert_close(got[0, : ids.shape[1]], want[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(reference[0, : ids.shape[1]], want[0], atol=2e-5, rtol=1e-4)


def test_deepstack_added_densely_by_hooks_equals_transformers_path():
    """What the graphed media decoder captures (quantbench.models.families.qwen3_omni.decoder_graphs: no attention mask, deepstack as
    dense adds by forward hooks) computes what the eager decoder with transformers' deepstack path computes; the
    graph itself needs a GPU, this is the forward it records."""
    from quantbench.models.families.qwen3_omni.decoder_graphs import GraphedMediaDecoder
    from quantbench.models.families.qwen3_omni.media_batch import (
        dense_deepstack,
        join_media,
        visual_deepstack,
    )
    from tests.test_omni_media import request

    ours = engine()
    decoder = ours.model.get_decoder()
    graphed = GraphedMediaDecoder(decoder, 1, max_width=4096)
    try:
        for kind in ("image", "frames"):
            prepared = ours.prepare(request(kind))
            prepared = dataclasses.replace(prepared, rows=prepared.rows[:1], media=prepared.media[:1],
                                           positions=prepared.positions[:1])
            ids = torch.tensor(prepared.rows)
            media = prepared.media
            encoded = {id(media[0]): ours._run_towers(join_media(media, ours.device, ours.model.dtype, host_meta=True))}
            with torch.inference_mode():
                layout = ours._layout([prepared], media, ids.shape[1])
                embeds, deep = ours._merge(ids, layout, media, encoded)
                positions = layout.positions
                visual_at, deepstack = visual_deepstack(embeds, layout, deep)
                want = decoder(inputs_embeds=embeds, attention_mask=layout.mask, position_ids=positions,
                               use_cache=False, visual_pos_masks=visual_at,
                               deepstack_visual_embeds=deepstack).last_hidden_state
                graphed._deep_now = dense_deepstack(embeds, layout, deep)
                got = decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False).last_hidden_state
                graphed._deep_now = None
                plain = decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False).last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(plain, want, atol=1e-3)  # the deepstack features matter here
    finally:
        for hook in graphed._hooks:
            hook.remove()


def test_a_batch_mixing_media_and_text_requests_answers_as_each_alone():
    """One forward over several requests (a server's batch): picture, text only, audio and frames rows in one
    padded batch, their placeholders, positions and mask laid out by index (OmniEngine._layout), answer as each
    request does alone."""
    from quantbench.protocol import parse_request
    from tests.test_omni_media import request

    ours = engine()
    text = parse_request({"state": {"observation": "a wall ahead and a door"}, "questions": {"ok": {"type": "boolean"}}})
    prepared = [ours.prepare(r) for r in (request("image"), text, request("audio"), request("frames"))]
    alone = [ours.forward(p) for p in prepared]
    together = ours.forward_many(prepared)
    for one, batched in zip(alone, together, strict=True):
        for question, answer in one.items():
            for option, p in answer.probabilities.items():
                assert abs(batched[question].probabilities[option] - p) < 1e-6
