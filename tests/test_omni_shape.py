"""Issue #25 part 8 (CPU side): `--shape qwen3-omni-30b-a3b`, media decisions made cheap, and the benchmark.

- The real-shape thinker's config (counted on the meta device, no memory): 31.72 B parameters at 48 layers, the
  encoders' output width 2048 (not transformers' 3584 default), the real vocabulary, rope and token ids; `--layers`
  shrinks the text decoder only.
- A synthetic Omni thinker (a small registered shape, the same code path) built by the backends, BF16 and
  layer-by-layer INT4, reads media: its engine is OmniEngine with the processor the model carries.
- Each media part is decoded once per process (a run prepares a record many times; a server decoded in its media
  gate and again in the engine), and a record's questions run the towers once, not once per question row.
- benchmarks/omni_shape.py runs end to end on CPU at --layers 4 with tiny media and stores its rows.
"""

from __future__ import annotations

import duckdb
import pytest
import torch

from quantbench.make.synthetic import save_synthetic
from quantbench.models.families import synthetic_shapes
from quantbench.models.families.qwen3_omni import synthetic as SO
from quantbench.models.families.qwen3_omni.engine import OmniEngine
from quantbench.protocol import media_cache, parse_request
from tests.test_media import audio_bytes, uri
from tests.test_omni_media import STATES, png
from tests.test_omni_shape_towers import engine as tiny_engine

SMALL = {"text": dict(SO.OMNI_TEXT, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, num_hidden_layers=2,
                      rope_parameters=dict(SO.OMNI_TEXT["rope_parameters"], mrope_section=[12, 10, 10])),
         "vision": dict(SO.OMNI_VISION, depth=3, hidden_size=64, intermediate_size=128, num_heads=4,
                        out_hidden_size=256, deepstack_visual_indexes=[0, 1], num_position_embeddings=256),
         "audio": dict(SO.OMNI_AUDIO, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64,
                       output_dim=256, downsample_hidden_size=32),
         "position_id_per_seconds": 13, "seconds_per_chunk": 2, "user_token_id": 872}


@pytest.fixture
def small_shape(monkeypatch):
    """`omni-small`: the Omni thinker's layout (real vocabulary and token ids) with small dims."""
    monkeypatch.setitem(SO.OMNI_SHAPES, "omni-small", SMALL)
    return "omni-small"


def test_the_real_shape_thinker_counts_31_72_b_parameters_with_2048_wide_encoders():
    config = SO.thinker_config("qwen3-omni-30b-a3b", None, 0, 1)
    model = SO.meta_thinker(config, torch.bfloat16)
    visual, audio = SO.model_towers(model)
    assert sum(p.numel() for p in model.parameters()) == 31_719_205_488  # 31.72 B, 59.08 GiB in BF16
    assert sum(p.numel() for p in visual.parameters()) == 538_631_408
    assert sum(p.numel() for p in audio.parameters()) == 647_927_168
    assert config.vision_config.out_hidden_size == config.audio_config.output_dim == 2048
    text = config.text_config
    assert (text.vocab_size, text.head_dim, text.num_hidden_layers, text.num_experts, text.num_experts_per_tok,
            text.moe_intermediate_size) == (152064, 128, 48, 128, 8, 768)
    assert text.rope_parameters["mrope_section"] == [24, 20, 20] and text.rope_parameters["mrope_interleaved"]
    assert (config.vision_config.depth, config.vision_config.deepstack_visual_indexes,
            config.audio_config.encoder_layers) == (27, [8, 16, 24], 32)
    assert (config.image_token_id, config.audio_token_id, config.vision_start_token_id) == (151655, 151675, 151652)
    assert "qwen3-omni-30b-a3b" in synthetic_shapes() and "qwen3-omni-30b-a3b-thinker" not in synthetic_shapes()
    shrunk = SO.meta_thinker(SO.thinker_config("qwen3-omni-30b-a3b", 4, 0, 1), torch.bfloat16)
    assert len(shrunk.get_decoder().layers) == 4
    assert sum(p.numel() for p in SO.model_towers(shrunk)[0].parameters()) == 538_631_408  # the towers stay real


def test_the_tokenizer_spells_the_real_media_token_ids():
    tok = SO.omni_tokenizer()
    for text, token_id in SO.MEDIA_TOKEN_IDS.values():
        assert tok.convert_tokens_to_ids(text) == token_id
    ids = tok("a <|image_pad|> b <|unused_2000|>")["input_ids"]
    assert 151655 in ids and 2000 not in ids  # fillers are never produced by text


def test_a_synthetic_omni_thinker_reads_media_in_bf16_and_layer_by_layer_int4(small_shape):
    from backends.bf16 import Bf16Backend
    from backends.int4 import Int4Backend
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    request = parse_request({"state": STATES["image"], "questions": {"ok": {"type": "boolean"}}})
    got = {}
    for backend in (Bf16Backend(), Int4Backend()):
        loaded = backend.load(RunSpec(backend=backend.name, shape=small_shape, layers=2, device="cpu"), detect())
        assert isinstance(loaded.engine, OmniEngine) and loaded.engine.modalities == {"image", "audio", "video"}
        assert loaded.info.weights == "synthetic"
        prepared = loaded.engine.prepare(request)
        assert prepared.media is not None and prepared.media[0]["image_grid_thw"].tolist() == [[1, 6, 8]]
        got[backend.name] = loaded.engine.forward(prepared)["ok"].probabilities
        assert loaded.engine.report().media["towers"].startswith("quantbench")
    # the same seeded BF16 weights, its experts RTN-quantized: close answers, not equal ones
    assert abs(got["bf16"]["yes"] - got["int4"]["yes"]) < 0.1


def test_each_media_part_is_decoded_once_per_process(monkeypatch):
    calls = []
    real = media_cache.decode_part
    monkeypatch.setattr(media_cache, "decode_part", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    media_cache.SHARED.clear()
    engine = tiny_engine()
    state = {"camera": {"type": "image", "data": uri("image/png", png(7))},
             "microphone": {"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 0.5))}}
    request = parse_request({"state": state, "questions": {"ok": {"type": "boolean"}}})
    for _ in range(3):  # the cold decision, warm-up, the suite and the latency phase prepare a record again
        engine.prepare(request)
    assert sorted(calls) == ["state.camera", "state.microphone"]
    # the same bytes under another key, in another record: found, under its own field name
    other = parse_request({"state": {"left": state["camera"]}, "questions": {"ok": {"type": "boolean"}}})
    assert [d.field for d in media_cache.decode_media_once(other.state, engine.limits)] == ["state.left"]
    assert len(calls) == 2


def test_the_server_decodes_a_part_once_for_its_engine_and_its_gate_even_over_the_cache_bound(monkeypatch):
    """The server prepares a request in one request scope (quantbench.server.endpoint): the engine decodes each
    part there and the gate finds it, even a part the shared cache would not keep (issue #33: a part over the
    cache's bound was decoded twice, by the gate and by the engine)."""
    import json

    from quantbench.server.schema import decode_gate, decode_request

    calls = []
    real = media_cache.decode_part
    monkeypatch.setattr(media_cache, "decode_part", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    media_cache.SHARED.clear()
    monkeypatch.setattr(media_cache.SHARED, "max_bytes", 0)  # the cache keeps nothing: only the scope holds it
    engine = tiny_engine()
    body = json.dumps({"state": {"camera": {"type": "image", "data": uri("image/png", png(8))}},
                       "questions": {"ok": {"type": "boolean"}}}).encode()
    request = decode_request(body, limits=engine.limits, modalities=engine.modalities)
    assert calls == []  # parsing and checking decode nothing
    with media_cache.request_scope() as held:
        prepared = engine.prepare(request)
        decode_gate(request, engine.limits)
        assert len(held) == 1
    engine.forward(prepared)
    assert calls == ["state.camera"]


def test_a_records_questions_run_the_towers_once():
    engine = tiny_engine()
    engine.method = "continuation"  # every option its own row, each carrying the prompt's media
    questions = {"action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right",
                                                           "wait": "Wait"}},
                 "ok": {"type": "boolean"}, "danger": {"type": "boolean"}}
    state = dict(STATES["image"], microphone={"type": "audio", "data": uri("audio/wav", audio_bytes("WAV", 1.0))})
    prepared = engine.prepare(parse_request({"state": state, "questions": questions}))
    assert len(prepared.rows) == 7 and len({id(m) for m in prepared.media}) == 1
    before = (engine.towers.counts.vision, engine.towers.counts.audio)
    engine.forward(prepared)
    assert (engine.towers.counts.vision - before[0], engine.towers.counts.audio - before[1]) == (1, 1)


def test_the_benchmark_runs_on_cpu_and_stores_its_rows(small_shape, tmp_path, capsys):
    from benchmarks import omni_shape

    db = tmp_path / "omni.duckdb"
    out = omni_shape.main(["--shape", small_shape, "--layers", "4", "--tiny-media", "--reps", "1", "--device", "cpu",
                           "--variants", "bf16,int4", "--text-tokens", "128", "--media-text-tokens", "64",
                           "--db", str(db)])
    printed = capsys.readouterr().out
    assert "| tower, medium | transformers ms | quantbench ms | speed-up |" in printed
    assert "| variant | decision | checks | decode | prompt | processor | positions | decode (uncached) |" in printed
    for variant in ("bf16", "int4"):
        kinds = out["results"][variant]["kinds"]
        assert set(kinds) == {"text", "image", "audio", "video"}
        assert 128 <= kinds["text"]["tokens"] < 140 and kinds["text"]["towers_ms"] == 0.0  # whole words
        assert all(kinds[k]["towers_ms"] > 0 and kinds[k]["end_to_end_ms"] > 0 for k in ("image", "audio", "video"))
        for kind in ("image", "audio", "video"):  # every phase of prepare and of the forward timed on its own
            assert set(kinds[kind]["prepare_phases"]) == set(omni_shape.PREPARE_PHASES)
            assert set(kinds[kind]["forward_phases"]) == set(omni_shape.FORWARD_PHASES)
            assert kinds[kind]["decode_uncached_ms"] > 0
        assert set(kinds["text"]["forward_phases"]) == {"head"}  # the text decoder: TransformersEngine's path
    assert set(out["towers"]) == {"image", "audio", "video"}
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT variant, weights, suite_id, json_extract(extra, '$.omni_shape.kinds.image.tokens') "
                       "FROM runs ORDER BY variant").fetchall()
    assert [r[:3] for r in rows] == [("bf16", "synthetic", "omni-shape-bench"), ("int4", "synthetic", "omni-shape-bench")]
    assert con.execute("SELECT count(*) FROM latencies").fetchone()[0] == 8


def test_a_saved_synthetic_omni_checkpoint_loads_and_reads_media(small_shape, tmp_path):
    from backends.bf16 import Bf16Backend
    from quantbench.models.checkpoint import model_identity
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    out = save_synthetic(small_shape, tmp_path / "omni", layers=1, seed=2)
    assert (out / "preprocessor_config.json").is_file() and model_identity(out)["weights"] == "synthetic"
    loaded = Bf16Backend().load(RunSpec(backend="bf16", model=str(out), device="cpu"), detect())
    assert isinstance(loaded.engine, OmniEngine) and loaded.engine.modalities == {"image", "audio", "video"}
    request = parse_request({"state": STATES["audio"], "questions": {"ok": {"type": "boolean"}}})
    assert set(loaded.engine.forward(loaded.engine.prepare(request))["ok"].probabilities) == {"yes", "no"}


def test_quantize_refuses_a_synthetic_omni_shape_and_names_run_shape():
    from quantbench.errors import ConfigError
    from quantbench.make.quantize import _synthetic_source

    with pytest.raises(ConfigError, match=r"run --shape qwen3-omni-30b-a3b --backend int4"):
        _synthetic_source("qwen3-omni-30b-a3b", 1, 0)
