"""Tiny Qwen3-Omni-MoE checkpoints for tests (random weights): a full `qwen3_omni_moe` one (thinker + talker +
code2wav, thinker keys under `thinker.`) and a thinker-only `qwen3_omni_moe_thinker` one with the same thinker
weights, as transformers saves them, with a tokenizer. The thinker's text decoder is Qwen3-MoE-shaped (2 layers, 8
experts top-2); the shapes follow ../shared/reference/qwen3-omni.md §1. Builds and saves in about a second.

Each checkpoint ships what a real Qwen3-Omni checkpoint ships for media: a tokenizer that knows the media special
tokens (`<|image_pad|>` ..., their ids the config's `image_token_id` ...) and `preprocessor_config.json`, the image
processor's and the Whisper feature extractor's settings in one file, as transformers serialises each."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
    WhisperFeatureExtractor,
)

from tests.tiny import tiny_tokenizer

VOCAB = 640  # the test tokenizer's tokens, then the media special tokens, then unused rows
FIRST_MEDIA_ID = 324  # the test tokenizer's own tokens are 0..323: the media tokens are added after them
# The thinker config's token id fields and the special token each names, in the order they are added.
MEDIA_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>", "audio_token_id": "<|audio_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                "audio_start_token_id": "<|audio_start|>", "audio_end_token_id": "<|audio_end|>"}
MEDIA_IDS = {name: FIRST_MEDIA_ID + i for i, name in enumerate(MEDIA_TOKENS)}
TEXT = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
            norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
            pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [12, 10, 10],
                                             "interleaved": True, "mrope_interleaved": True})
VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
              temporal_patch_size=2, out_hidden_size=256, num_position_embeddings=256, deepstack_visual_indexes=[0],
              hidden_act="gelu_pytorch_tanh")
AUDIO = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, d_model=64,
             output_dim=256, downsample_hidden_size=32, n_window=50, n_window_infer=800)
THINKER = dict(text_config=TEXT, vision_config=VISION, audio_config=AUDIO, position_id_per_seconds=13,
               seconds_per_chunk=2, user_token_id=612, **MEDIA_IDS)
# Small media sizes (a real checkpoint: 16 px patches, up to 12.8 M pixels): a 90 x 120 picture is 12 tokens.
IMAGE = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
             size={"shortest_edge": 64 * 64, "longest_edge": 128 * 128})
AUDIO_FEATURES = dict(feature_size=128, sampling_rate=16000, hop_length=160, chunk_length=300, n_fft=400,
                      padding_value=0.0, return_attention_mask=True)


def omni_tokenizer() -> PreTrainedTokenizerFast:
    """The test tokenizer with the media special tokens added at the ids the thinker config names."""
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(MEDIA_TOKENS.values())})
    got = {name: tok.convert_tokens_to_ids(text) for name, text in MEDIA_TOKENS.items()}
    assert got == MEDIA_IDS, (got, MEDIA_IDS)  # the test tokenizer changed: move FIRST_MEDIA_ID
    return tok


def save_processor_files(out: Path) -> None:
    """The tokenizer and preprocessor_config.json: the image processor's and the feature extractor's settings as
    transformers serialises them (to_json_string), merged into one file as Qwen's Omni checkpoints ship it."""
    omni_tokenizer().save_pretrained(out)
    image = json.loads(Qwen2VLImageProcessorPil(**IMAGE).to_json_string())
    audio = json.loads(WhisperFeatureExtractor(**AUDIO_FEATURES).to_json_string())
    settings = {**audio, **image, "processor_class": "Qwen3OmniMoeProcessor"}
    (out / "preprocessor_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def talker_config(hidden: int = 64, layers: int = 1) -> dict:
    """A talker whose size is set by `hidden` and `layers` (a large one makes "never read" measurable)."""
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5], "interleaved": True}
    return dict(text_config=dict(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                                 num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
                                 shared_expert_intermediate_size=hidden, rope_parameters=rope),
                code_predictor_config=dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                           num_code_groups=4),
                thinker_hidden_size=256, accept_hidden_layer=1, num_code_groups=4, spatial_merge_size=2)


CODE2WAV = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=128, codebook_size=64, num_quantizers=4, decoder_dim=64, upsample_rates=[2, 2],
                upsampling_ratios=[2, 2], sliding_window=16)


def full_model(seed: int = 0, talker_hidden: int = 64, talker_layers: int = 1) -> Qwen3OmniMoeForConditionalGeneration:
    config = Qwen3OmniMoeConfig(thinker_config=THINKER, talker_config=talker_config(talker_hidden, talker_layers),
                                code2wav_config=CODE2WAV, enable_audio_output=True)
    torch.manual_seed(seed)
    # _from_config(dtype=): rotary and sinusoid buffers stay fp32, as a reload makes them (never .to(bf16))
    return Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=torch.bfloat16).eval()


def build_full(out: Path, seed: int = 0, talker_hidden: int = 64, talker_layers: int = 1) -> Path:
    """A full `qwen3_omni_moe` checkpoint (sharded, so thinker and talker tensors share files) + processor files."""
    full_model(seed, talker_hidden, talker_layers).save_pretrained(out, max_shard_size="2MB")
    save_processor_files(out)
    return out


def build_thinker(out: Path, seed: int = 0) -> Path:
    """A thinker-only `qwen3_omni_moe_thinker` checkpoint with the same thinker weights as build_full(seed)."""
    full_model(seed).thinker.save_pretrained(out)
    save_processor_files(out)
    return out
