"""The Qwen3-Omni-30B-A3B thinker at its real shape with seeded random weights (`--shape qwen3-omni-30b-a3b`):
its config, a tokenizer that spells the real media token ids, and the processor settings that make its media
inputs, all made in memory. quantbench.models.synthetic builds and quantizes it (quantbench.make.synthetic saves
it) as it does the text shape, from what the family (family.py) says.

The shape is the public `Qwen3-Omni-30B-A3B-Instruct` config.json's thinker (../shared/reference/qwen3-omni.md §1,
§7): the text decoder is Qwen3-30B-A3B's but with vocab 152064, max position 65536 and interleaved 3-D rope
[24, 20, 20]; the vision tower (27 blocks of 1152, deepstack after blocks 8, 16, 24) and the audio tower (32 layers of
1280) are the real ones. transformers' config defaults for the towers' output width are Qwen2.5-Omni-7B's 3584;
the real value, the text hidden size 2048, is set here. At 48 layers the thinker counts 31.72 B parameters
(tests/test_omni_shape.py counts them on the meta device)."""

from __future__ import annotations

import json
from typing import Any

# The thinker config's media token ids (the real checkpoint's) and the special token each names.
MEDIA_TOKEN_IDS = {
    "vision_start_token_id": ("<|vision_start|>", 151652), "vision_end_token_id": ("<|vision_end|>", 151653),
    "image_token_id": ("<|image_pad|>", 151655), "video_token_id": ("<|video_pad|>", 151656),
    "audio_start_token_id": ("<|audio_start|>", 151669), "audio_end_token_id": ("<|audio_end|>", 151670),
    "audio_token_id": ("<|audio_pad|>", 151675),
}
OMNI_TEXT = {
    "vocab_size": 152064, "hidden_size": 2048, "intermediate_size": 768, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
    "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "initializer_range": 0.02, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20],
                        "interleaved": True, "mrope_interleaved": True},
}
OMNI_VISION = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24], "hidden_act": "gelu_pytorch_tanh", "out_hidden_size": 2048,
    "initializer_range": 0.02,
}
OMNI_AUDIO = {
    "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
    "d_model": 1280, "output_dim": 2048, "n_window": 50, "n_window_infer": 800, "downsample_hidden_size": 480,
    "max_source_positions": 1500, "conv_chunksize": 500, "activation_function": "gelu", "initializer_range": 0.02,
}
OMNI_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-omni-30b-a3b": {"text": OMNI_TEXT, "vision": OMNI_VISION, "audio": OMNI_AUDIO,
                           "position_id_per_seconds": 13, "seconds_per_chunk": 2, "user_token_id": 872},
}
# The real checkpoint's processor settings (Qwen2-VL image processor at patch 16 / merge 2; Whisper features at
# 16 kHz, 128 mel bins, hop 160): a 448 x 448 picture is a [1, 28, 28] grid, 196 tokens; 10 s of audio 130 tokens.
IMAGE_PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                   "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 16384}}
AUDIO_FEATURES = {"feature_size": 128, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 300,
                  "n_fft": 400, "padding_value": 0.0, "return_attention_mask": True}


def thinker_config(shape: str, layers: int | None, pad_token_id: int, eos_token_id: int):
    """The Qwen3OmniMoeThinkerConfig of `shape`; `layers` shrinks the text decoder only (the towers stay real)."""
    from transformers import Qwen3OmniMoeThinkerConfig  # lazy: as models.build.moe_config

    dims = OMNI_SHAPES[shape]
    text = dict(dims["text"], pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    if layers is not None:
        text["num_hidden_layers"] = layers
    ids = {name: token_id for name, (_, token_id) in MEDIA_TOKEN_IDS.items()}
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text, vision_config=dict(dims["vision"]), audio_config=dict(dims["audio"]),
        position_id_per_seconds=dims["position_id_per_seconds"], seconds_per_chunk=dims["seconds_per_chunk"],
        user_token_id=dims["user_token_id"], initializer_range=0.02, pad_token_id=pad_token_id, **ids)
    # transformers' __init__ may drop the ids it does not declare (vision_start_token_id): get_rope_index reads them
    for name, token_id in ids.items():
        setattr(config, name, token_id)
    return config


def omni_tokenizer():
    """The fixture's byte-level BPE tokenizer with the media special tokens at the real checkpoint's ids: filler
    tokens (`<|unused_N|>`, which no text encodes to) keep the ids between the fixture's vocabulary and them."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from quantbench.models.tokenizer import EOS, PAD, tokenizer_json

    spec = json.loads(tokenizer_json())
    vocab = spec["model"]["vocab"]
    by_id = {token_id: text for text, token_id in MEDIA_TOKEN_IDS.values()}
    for i in range(len(vocab), max(by_id) + 1):
        vocab[by_id.get(i, f"<|unused_{i}|>")] = i
    for token_id, text in sorted(by_id.items()):
        spec["added_tokens"].append({"id": token_id, "content": text, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), pad_token=PAD,
                                        eos_token=EOS)
    tokenizer.model_max_length = OMNI_TEXT["max_position_embeddings"]
    return tokenizer


def processor_settings() -> dict[str, dict[str, Any]]:
    """The image / audio / video settings a checkpoint's processor files would hold (models.processor reads
    these): the video frames take the image size."""
    return {"image": dict(IMAGE_PROCESSOR), "audio": dict(AUDIO_FEATURES), "video": dict(IMAGE_PROCESSOR)}


def preprocessor_json() -> str:
    """preprocessor_config.json as Qwen's Omni checkpoints ship it: both parts' settings in one file."""
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    image = json.loads(Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR).to_json_string())
    audio = json.loads(WhisperFeatureExtractor(**AUDIO_FEATURES).to_json_string())
    return json.dumps({**audio, **image, "processor_class": "Qwen3OmniMoeProcessor"}, indent=1) + "\n"


def meta_thinker(config, dtype):
    """A Qwen3OmniMoeThinkerForConditionalGeneration on the meta device, its parameters typed `dtype`."""
    import torch
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    with torch.device("meta"):
        return Qwen3OmniMoeThinkerForConditionalGeneration(config).to(dtype=dtype)


def new_buffers(model, device) -> None:
    """The computed buffers a meta (or to_empty) thinker has no values for, made on the device in fp32: the text
    decoder's mrope frequencies, the vision tower's rotary frequencies, the audio tower's sinusoids."""
    decoder = model.get_decoder()
    decoder.rotary_emb = type(decoder.rotary_emb)(decoder.config).to(device)
    visual, audio = model_towers(model)
    visual.rotary_pos_emb = type(visual.rotary_pos_emb)(visual.config).to(device)
    pos = audio.positional_embedding
    audio.positional_embedding = type(pos)(audio.config.max_source_positions, audio.config.d_model).to(device)


def model_towers(model):
    """(vision tower, audio tower) of a thinker: under `model.model` from transformers 5.21, on the thinker before."""
    owner = model.model if hasattr(model.model, "visual") else model
    return owner.visual, owner.audio_tower
