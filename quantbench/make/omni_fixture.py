"""The omni default model: a small trained Qwen3-Omni-MoE thinker, built by quantbench (`quantbench fixture
--family omni`), with vision and audio towers, so quantized variants have media decisions to keep or lose.

`omni_default_model_dir()` returns a `qwen3_omni_moe_thinker` checkpoint that quantbench's omni loader and
transformers (`AutoModelForImageTextToText`) both load: the text fixture's decoder shape (hidden 256, 2 layers, 8
experts top-2, QK-norm; interleaved 3-D rope), a 2-block vision tower (patch 16, merge 2, deepstack after layer 0)
and a 2-layer audio encoder, with the text fixture's byte-level BPE tokenizer plus Qwen-Omni's media special
tokens, and `preprocessor_config.json` (the image processor's and the Whisper feature extractor's settings), so
`quantbench.models.families.qwen3_omni.processor` builds its processor offline. Pictures are 32 wide and 64 tall (2 tokens), a second
of audio 13 tokens, a 4-frame clip 4 tokens: the towers cost little.

Its text decoder and head are the trained text fixture's (quantbench.make.fixture, built first if not cached;
its recipe hash is part of this one's) and stay frozen, so the text families keep what the text
fixture learned; the vision and audio towers are trained from scratch on CPU on the media families' train
split (quantbench.protocol.omnigen), so that on the held-out suite `quantbench-omni-v1` every family is answered well
above chance; `quantbench fixture --family omni` prints the accuracy per family. Built like the text fixture
(quantbench.make.fixture: the same lock, cache folder, deterministic training), under its own recipe hash, in
`$QUANTBENCH_CACHE/models/omni-fixture-<hash>`; the text fixture is never rebuilt for it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from quantbench.make import fixture
from quantbench.make.fixture import FIXTURE_INFO_FILE, FixtureInfo, read_info
from quantbench.models.tokenizer import TOKENIZER, build_tokenizer
from quantbench.paths import cache_dir

OMNI_FIXTURE_VERSION = 2
MEDIA_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>", "audio_token_id": "<|audio_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                "audio_start_token_id": "<|audio_start|>", "audio_end_token_id": "<|audio_end|>"}

# The recipe: every value goes into the cache key.
TEXT = {**{k: v for k, v in fixture.MODEL.items() if k != "rope_theta"},
        "rope_parameters": {"rope_type": "default", "rope_theta": fixture.MODEL["rope_theta"],
                            "mrope_section": [12, 10, 10], "interleaved": True, "mrope_interleaved": True}}
VISION = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "patch_size": 16,
          "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 256, "num_position_embeddings": 64,
          "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.02}
AUDIO = {"num_mel_bins": 128, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 128,
         "d_model": 64, "output_dim": 256, "downsample_hidden_size": 32, "n_window": 50, "n_window_infer": 800}
IMAGE_PROCESSOR = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5] * 3,
                   "image_std": [0.5] * 3, "size": {"shortest_edge": 32 * 32, "longest_edge": 128 * 128}}
AUDIO_FEATURES = {"feature_size": 128, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 300, "n_fft": 400,
                  "padding_value": 0.0, "return_attention_mask": True}
TRAIN = {
    # The text decoder and head come from the trained text fixture (same shape, same tokenizer plus the media
    # tokens) and stay frozen: the text families keep its answers, and only the towers (from scratch) train, on
    # the media families' train split, at learning rates a from-scratch tower needs (the vision tower's lower:
    # omni_fixture_train). Small batches, more steps: the towers learn per step, and a step of 8 costs about a
    # fifth of a second on 2 idle cores.
    "media_per_family": 100,
    "steps": 600,
    "batch_size": 8,
    "tower_lr": 1e-2,  # the audio tower's
    "vision_lr": 1e-3,
    "warmup": 4,
    "weight_decay": 0.0,
    "threads": 2,
}


# -- identity and cache ---------------------------------------------------------------------------------------
def _train_settings(steps: int | None, train: dict[str, Any] | None) -> dict[str, Any]:
    settings = {**TRAIN, **(train or {})}
    if steps is not None:
        settings["steps"] = steps
    return settings


def _recipe(seed: int = 0, steps: int | None = None, train: dict[str, Any] | None = None) -> dict[str, Any]:
    from quantbench.protocol import omnigen, suitegen

    source = hashlib.sha256(Path(suitegen.__file__).read_bytes() + Path(omnigen.__file__).read_bytes()
                            + Path(__file__).with_name("omni_fixture_train.py").read_bytes()).hexdigest()
    return {"version": OMNI_FIXTURE_VERSION, "generators_source": source, "text_fixture": fixture.recipe_hash(),
            "text": TEXT, "vision": VISION,
            "audio": AUDIO, "image_processor": IMAGE_PROCESSOR, "audio_features": AUDIO_FEATURES,
            "tokenizer": TOKENIZER, "train": _train_settings(steps, train),
            "seed": seed, "dtype": "bfloat16"}


def omni_recipe_hash(seed: int = 0, steps: int | None = None, train: dict[str, Any] | None = None) -> str:
    return hashlib.sha256(json.dumps(_recipe(seed, steps, train), sort_keys=True).encode()).hexdigest()


def omni_fixture_id(seed: int = 0, steps: int | None = None, train: dict[str, Any] | None = None) -> str:
    """The model_id of the omni model built from this recipe (its variants share it)."""
    return f"quantbench-omni-fixture-{omni_recipe_hash(seed, steps, train)[:8]}"


def _cached_target() -> Path:
    return cache_dir() / "models" / f"omni-fixture-{omni_recipe_hash()[:8]}"


def omni_default_model_dir(progress: bool = True) -> Path:
    """The trained omni default model's checkpoint directory, built (about 4 minutes on 2 cores) if not cached."""
    target = _cached_target()
    if not (target / FIXTURE_INFO_FILE).is_file():
        _build_into(target, rebuild=False, progress=progress)
    return target


def find_or_build_omni(rebuild: bool = False, out: Path | None = None) -> FixtureInfo:
    """The omni default model at `out` (default: the cache), built there unless it is already, or `rebuild`."""
    target = _cached_target() if out is None else Path(out).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    return _build_into(target, rebuild=rebuild, progress=True) or read_info(target)


def _build_into(target: Path, *, rebuild: bool, progress: bool, seed: int = 0,
                steps: int | None = None) -> FixtureInfo | None:
    """As the text fixture's: built in a temp sibling under the target's lock, renamed into place."""
    with fixture._locked(target.parent / f".{target.name}.lock", f"building {target.name}"):
        if (target / FIXTURE_INFO_FILE).is_file() and not rebuild:
            return None
        if progress:
            from quantbench.term import load_note

            busy = load_note()
            print(f"building the omni default model {target.name} into {target} ({steps or TRAIN['steps']} "
                  "training steps; an estimate for this machine from its first steps follows; nothing is "
                  "downloaded)" + (f"; {busy}" if busy else ""), file=sys.stderr, flush=True)
        return fixture.build_in_place(target, lambda tmp: build_omni_fixture(tmp, seed=seed, steps=steps,
                                                                               progress=progress))


# -- tokenizer, config, processor files ------------------------------------------------------------------------
def build_omni_tokenizer():
    """The text fixture's tokenizer with Qwen-Omni's media special tokens added after its vocabulary."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(MEDIA_TOKENS.values())})
    return tok


def thinker_config(tokenizer: Any) -> Any:
    from transformers import Qwen3OmniMoeThinkerConfig

    ids = {name: tokenizer.convert_tokens_to_ids(text) for name, text in MEDIA_TOKENS.items()}
    text = dict(TEXT, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    # user_token_id is read by the talker only (a thinker checkpoint has none): the eos token stands in
    return Qwen3OmniMoeThinkerConfig(text_config=text, vision_config=VISION, audio_config=AUDIO,
                                     position_id_per_seconds=13, seconds_per_chunk=2,
                                     user_token_id=tokenizer.eos_token_id, **ids)


def save_processor_files(out: Path, tokenizer: Any) -> None:
    """The tokenizer and preprocessor_config.json (the image processor's and the feature extractor's settings in
    one file, as Qwen's Omni checkpoints ship it; video frames use the image settings)."""
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    tokenizer.save_pretrained(out)
    image = json.loads(Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR).to_json_string())
    audio = json.loads(WhisperFeatureExtractor(**AUDIO_FEATURES).to_json_string())
    settings = {**audio, **image, "processor_class": "Qwen3OmniMoeProcessor"}
    (out / "preprocessor_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def start_from_text_fixture(model: Any, text_dir: Path) -> None:
    """Copy the trained text fixture's decoder and head into the thinker `model` (float32): every tensor of the
    text model has its place and shape in the thinker's language model (qwen3-omni.md §3: the decoder layers are
    Qwen3-MoE's), except that the thinker's embedding and head have rows for the media tokens too, which keep
    their initialisation. Anything else is a LoadError, never a half-copied model."""
    from transformers import AutoModelForCausalLM

    from quantbench.errors import LoadError

    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32, use_safetensors=True)
    targets = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in text.state_dict().items():
            place = "lm_head.weight" if name == "lm_head.weight" else "model.language_model." + name.removeprefix("model.")
            target = targets.pop(place, None)
            if target is None:
                raise LoadError(f"{text_dir}: the text fixture's {name} has no place {place} in the omni thinker")
            if target.shape == tensor.shape:
                target.copy_(tensor)
            elif name in ("model.embed_tokens.weight", "lm_head.weight") and target.shape[1:] == tensor.shape[1:]:
                target[: tensor.shape[0]].copy_(tensor)  # the rows after them are the media tokens'
            else:
                raise LoadError(f"{text_dir}: {name} is {tuple(tensor.shape)}, the thinker's {place} "
                                f"{tuple(target.shape)}")
    left = [n for n in targets if n.startswith("model.language_model.")]
    if left:
        raise LoadError(f"{text_dir}: the text fixture has no {left[0]} (and {len(left) - 1} more) for the thinker")


# -- build and evaluate ------------------------------------------------------------------------------------------
def _engine(model: Any, tokenizer: Any, checkpoint: Path) -> Any:
    from quantbench.models.families.qwen3_omni.engine import OmniEngine
    from quantbench.models.families.qwen3_omni.processor import omni_processor

    return OmniEngine(model, tokenizer, media=omni_processor(checkpoint, tokenizer, model))


def build_omni_fixture(out_dir: Path, *, seed: int = 0, steps: int | None = None, progress: bool = False,
                       train: dict[str, Any] | None = None, eval_records: list[Any] | None = None) -> FixtureInfo:
    """Train the omni model from scratch into `out_dir` (deterministic for a given recipe). `train` overrides
    entries of TRAIN (tests train on a few records; the model id says so), `eval_records` the records its
    accuracy is measured on (default: the built-in omni suite)."""
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    from quantbench.make.omni_fixture_train import record_examples
    from quantbench.make.omni_fixture_train import train as train_model
    from quantbench.protocol.omnigen import MEDIA_FAMILIES, generate_media

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _train_settings(steps, train)
    steps = settings["steps"]
    with fixture._deterministic(settings["threads"]):
        torch.manual_seed(seed)
        tokenizer = build_omni_tokenizer()
        config = thinker_config(tokenizer)
        model = Qwen3OmniMoeThinkerForConditionalGeneration._from_config(config, dtype=torch.float32)
        start_from_text_fixture(model, fixture.default_model_dir(progress=progress))
        model.set_experts_implementation("eager")  # on CPU its backward is 4x faster than grouped_mm
        save_processor_files(out_dir, tokenizer)
        prep = time.perf_counter()
        engine = _engine(model, tokenizer, out_dir)
        records = generate_media("train", dict.fromkeys(MEDIA_FAMILIES, settings["media_per_family"]))
        examples = record_examples(engine, records)
        prep_seconds = time.perf_counter() - prep
        start = time.perf_counter()
        final_loss = train_model(model, examples, tokenizer.pad_token_id, settings, seed=seed, steps=steps,
                                 progress=progress)
        seconds = time.perf_counter() - start
        model = model.to(torch.bfloat16)
        model.config.quantbench_model_id = omni_fixture_id(seed, steps, train)
        model.save_pretrained(out_dir, safe_serialization=True)
        if progress:
            print("evaluating the omni model on the built-in omni suite", file=sys.stderr, flush=True)
        accuracy = evaluate_omni(out_dir, eval_records)
    info = FixtureInfo(
        path=out_dir, model_id=omni_fixture_id(seed, steps, train), recipe_hash=omni_recipe_hash(seed, steps, train),
        seed=seed,
        steps=steps, final_loss=round(final_loss, 6), accuracy={k: round(v, 6) for k, v in accuracy.items()},
        overall=round(sum(accuracy.values()) / len(accuracy), 6),
        parameters=sum(p.numel() for p in model.parameters()),
        size_bytes=(out_dir / "model.safetensors").stat().st_size, train_seconds=seconds,
        extra={"prepare_seconds": prep_seconds},
    )
    record = {k: v for k, v in asdict(info).items() if k not in ("path", "train_seconds", "extra")}
    (out_dir / FIXTURE_INFO_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return info


def evaluate_omni(model_dir: Path, records: list[Any] | None = None, batch: int = 16) -> dict[str, float]:
    """Per-family share of questions whose top answer is gold, the checkpoint loaded as transformers loads it and
    scored by OmniEngine (the built-in omni suite by default)."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from quantbench.protocol.omnigen import omni_suite_records

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.bfloat16, use_safetensors=True).eval()
    engine = _engine(model, AutoTokenizer.from_pretrained(model_dir), Path(model_dir))
    return fixture.accuracy_by_family(engine, records if records is not None else omni_suite_records(), batch)
