"""CUDA graphs around the decision forward (quantbench.engine.cudagraph): the bucket shapes, and the claim that makes
them safe: padding a batch up to its bucket changes no hidden state the engine reads. Capture itself needs a GPU;
it is exercised on the H200 (docs/BENCHMARKS.md)."""

import pytest
import torch

from quantbench.engine.cudagraph import GraphedDecoder, bucket
from quantbench.engine.moe.engine import DenseExperts, install_grouped_moe
from quantbench.models.families import moe_layout
from tests.tiny import tiny_model


@pytest.mark.parametrize(("rows", "want"), [
    ((1, 1), (1, 16)), ((3, 64), (4, 64)), ((5, 65), (8, 80)), ((8, 500), (8, 512)), ((1, 513), (1, 544)),
    ((2, 2000), (2, 2048)), ((32, 2049), (32, 2176)),
])
def test_buckets_round_rows_to_a_power_of_two_and_pad_width_by_at_most_a_few_percent(rows, want):
    assert bucket(*rows, 16, max_width=40960) == want
    assert (want[1] - rows[1]) / rows[1] <= 0.07 or want[1] - rows[1] < 16


def test_bucket_never_exceeds_the_context_unless_the_input_already_does():
    assert bucket(1, 500, 64, max_width=510) == (1, 510)
    assert bucket(1, 600, 64, max_width=510) == (1, 600)


@pytest.mark.parametrize("engine", ["transformers", "grouped-moe"])
def test_padding_to_the_bucket_changes_no_real_token(engine):
    model = tiny_model(seed=3)
    if engine == "grouped-moe":
        install_grouped_moe(model, lambda i, ex: (DenseExperts(ex.gate_up_proj.data), DenseExperts(ex.down_proj.data)),
                            layout=moe_layout(model))
    decoder = model.get_decoder()
    torch.manual_seed(0)
    ids = torch.randint(2, 600, (3, 37))
    rows, width = bucket(3, 37, 64, 512)
    padded = torch.zeros(rows, width, dtype=torch.long)  # pad id 0, as the engine's tokenizer pads
    padded[:3, :37] = ids
    with torch.inference_mode():
        alone = decoder(input_ids=ids, use_cache=False).last_hidden_state
        inside = decoder(input_ids=padded, use_cache=False).last_hidden_state[:3, :37]
    torch.testing.assert_close(inside, alone, rtol=1e-5, atol=1e-5)


def test_on_the_cpu_the_decoder_runs_eagerly_and_says_so():
    model = tiny_model()
    graphed = GraphedDecoder(model.get_decoder(), pad_id=0, max_width=512, mode="auto")
    ids = torch.randint(2, 600, (2, 10))
    with torch.inference_mode():
        out = graphed(ids)
        ref = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(out, ref)
    assert graphed.report.replays == 0 and graphed.report.eager_calls == 1 and graphed.report.captured == []


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, off"):
        GraphedDecoder(tiny_model().get_decoder(), pad_id=0, max_width=512, mode="always")
