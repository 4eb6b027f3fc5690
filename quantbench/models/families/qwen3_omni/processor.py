"""The media processor of a Qwen3-Omni-MoE checkpoint, built offline from the checkpoint's own files (the family's
`decision_engine` hands it to OmniEngine).

A real Qwen3-Omni checkpoint ships its tokenizer and `preprocessor_config.json` (one file holding the image
processor's and the Whisper feature extractor's settings), and may ship `video_preprocessor_config.json`; a
transformers 5 save may hold them nested in `processor_config.json`. quantbench reads them with transformers'
own classes: the tokenizer, `Qwen2VLImageProcessorPil` and `WhisperFeatureExtractor`, and for video
transformers' `Qwen2VLVideoProcessor` when torchvision imports. PyPI's torchvision does not import beside the
CPU torch 2.13 wheel (../shared/reference/qwen3-omni.md §2), so without it the video frames go through
`NumpyVideoProcessor`: the checkpoint's PIL image processor per frame (resize, rescale, normalise) and
Qwen2-VL's video patch order. Which one ran is recorded on the run (`extra.media.video_processor`).

Nothing is downloaded and no checkpoint code runs. The media tokens are the ones the model's config names
(`image_token_id`, `audio_start_token_id`, ...), spelled by the checkpoint's tokenizer: a tokenizer that does not
know them is a LoadError, not a model fed wrong ids. A checkpoint without processor files reads text only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quantbench.errors import LoadError

# The thinker config's token id fields -> the tokenizer attribute Qwen3OmniMoeProcessor reads for each.
MEDIA_TOKEN_FIELDS = {
    "image_token_id": "image_token", "video_token_id": "video_token", "audio_token_id": "audio_token",
    "vision_start_token_id": "vision_bos_token", "vision_end_token_id": "vision_eos_token",
    "audio_start_token_id": "audio_bos_token", "audio_end_token_id": "audio_eos_token",
}
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401  # probed: transformers' video processor needs it
    except Exception:  # noqa: BLE001 - PyPI's torchvision beside the CPU torch raises RuntimeError, not ImportError
        return False
    return True


class NumpyVideoProcessor:
    """Qwen2-VL video processing without torchvision: every frame resized (Qwen2-VL's smart resize to the video
    size), rescaled and normalised by the checkpoint's PIL image processor, frames padded to a multiple of
    `temporal_patch_size` by repeating the last one, then patched in `Qwen2VLVideoProcessor.patchify`'s order.
    Against transformers' torchvision processor it differs only by PIL's bicubic resize against torch's (one
    8-bit level; qwen3-omni.md §2). Every frame given is used: no sampling."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, image_processor: Any, size: dict[str, int]):
        self.image_processor = image_processor
        self.size = dict(size)
        self.patch_size = image_processor.patch_size
        self.temporal_patch_size = image_processor.temporal_patch_size
        self.merge_size = image_processor.merge_size

    def __call__(self, videos: list[np.ndarray], size: Any = None, **_: Any) -> Any:
        from transformers import BatchFeature  # lazy: transformers is imported in the child only
        from transformers.image_utils import SizeDict

        size = dict(size) if size is not None else self.size
        size = SizeDict(shortest_edge=size["shortest_edge"], longest_edge=size["longest_edge"])
        patches, grids = [], []
        for video in videos:
            flat, grid = self._one(np.asarray(video), size)
            patches.append(flat)
            grids.append(grid)
        return BatchFeature({"pixel_values_videos": np.concatenate(patches, axis=0),
                             "video_grid_thw": np.array(grids, dtype=np.int64)}, tensor_type="pt")

    def _one(self, video: np.ndarray, size: Any) -> tuple[np.ndarray, list[int]]:
        ip, ps, tps, m = self.image_processor, self.patch_size, self.temporal_patch_size, self.merge_size
        frames = []
        for frame in video:  # [H, W, 3] uint8 -> [3, H', W'] float32, as the image processor prepares one image
            chw = np.moveaxis(frame, -1, 0)
            chw = ip.resize(chw, size=size, resample=ip.resample, factor=ps * m)
            chw = ip.normalize(ip.rescale(chw, ip.rescale_factor), ip.image_mean, ip.image_std)
            frames.append(np.asarray(chw, dtype=np.float32))
        if pad := -len(frames) % tps:
            frames += [frames[-1]] * pad
        stack = np.stack(frames)  # [T, C, H, W]
        t, c, h, w = stack.shape
        gt, gh, gw = t // tps, h // ps, w // ps
        patches = stack.reshape(gt, tps, c, gh // m, m, ps, gw // m, m, ps)
        patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # Qwen2VLVideoProcessor.patchify, without the batch
        return patches.reshape(gt * gh * gw, c * tps * ps * ps), [gt, gh, gw]


def _processor_class() -> type:
    """Qwen3OmniMoeProcessor, taking NumpyVideoProcessor as its video processor (its class check goes through
    transformers' torchvision placeholder otherwise, which fails even for image-only use)."""
    from transformers import Qwen3OmniMoeProcessor  # lazy: transformers is imported in the child only

    class OmniProcessor(Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and isinstance(argument, NumpyVideoProcessor):
                return NumpyVideoProcessor
            return super().check_argument_for_proper_class(argument_name, argument)


    return OmniProcessor


@dataclass
class MediaProcessor:
    """A checkpoint's processor and what quantbench passes it on every call (the video size from the
    checkpoint's files, never the processor class's default; the audio encoder's window from the model).
    `pixels`: pictures and video frames made on the model's device (quantbench.models.families.qwen3_omni.pixels, bit-equal to the
    PIL processor); None: by the checkpoint's image / video processor on the host."""

    processor: Any
    modalities: frozenset[str]
    video_size: dict[str, int] | None
    n_window: int
    video_processor: str | None  # what ran for video, recorded on the run
    tokens: dict[str, str] = field(default_factory=dict)  # image_token, vision_bos_token, ... -> its text
    pixels: Any = None  # DevicePixels, or None
    pixels_note: str | None = None  # why pixels are made on the host when the device was asked for

    def __call__(self, text: str, images: list[Any], audio: list[np.ndarray], videos: list[np.ndarray],
                 fps: list[float], memo: dict | None = None) -> dict[str, Any]:
        """`input_ids` [1, T] and the media inputs of one prompt: what transformers' processor returns for it
        (`through_transformers`; tests/test_omni_media_pixels.py holds them equal), without its per-call
        machinery (keyword merging and validation, ~1-3 ms a call): the prompt is tokenized with one placeholder
        per part, and each placeholder repeated to its part's token count (the media tokens are special tokens,
        so the text around them tokenizes alike); pictures and frames through `pixels` or the checkpoint's
        processors; audio through its feature extractor. `memo` (one per prepared request) keeps the tensors of
        each list of parts, so a request's questions share them (the forward then runs the towers once)."""
        import torch  # lazy: as transformers, in the child only

        memo = {} if memo is None else memo
        out: dict[str, Any] = {}
        for kind, items, make in (("image", images, lambda: self._images(images)),
                                  ("video", videos, lambda: self._videos(videos, fps)),
                                  ("audio", audio, lambda: self._audio(audio))):
            if items:
                key = (kind, tuple(id(x) for x in items), tuple(fps) if kind == "video" else ())
                if key not in memo:
                    memo[key] = make()
                out.update(memo[key])
        ids = self.processor.tokenizer(text)["input_ids"]
        out["input_ids"] = torch.tensor([self._expand(ids, out)])
        return out

    def header_tokens(self, kind: str, *, width: int = 0, height: int = 0, frames: int = 1, samples: int = 0) -> int:
        """The tokens a part of these dimensions becomes, counted as the processor counts them but from a header
        alone (nothing decoded): an image by the image processor's own `get_number_of_image_patches` (what vLLM
        places placeholders with), a video the same per frame at the video size times its temporal patches, audio
        (`samples` at 16 kHz) by the audio encoder's output length for its feature frames. ValueError when the
        processor cannot take the dimensions (an aspect ratio over 200)."""
        ip = self.processor.image_processor
        m2 = ip.merge_size ** 2
        if kind == "image":
            return ip.get_number_of_image_patches(height, width, {}) // m2
        if kind == "video":
            size = self.video_size or {}
            bounds = {"min_pixels": size["shortest_edge"], "max_pixels": size["longest_edge"]} if size else {}
            temporal = self.processor.video_processor.temporal_patch_size
            return -(-frames // temporal) * ip.get_number_of_image_patches(height, width, bounds) // m2
        import torch
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni

        hop = self.processor.feature_extractor.hop_length
        feature_frames = torch.tensor([-(-samples // hop)])
        return int(omni._get_feat_extract_output_lengths(feature_frames, self.n_window)[0])

    def _images(self, images: list[Any]) -> dict[str, Any]:
        if self.pixels is not None:
            return self.pixels.images(images)
        got = self.processor.image_processor(images=images, return_tensors="pt")
        return {"pixel_values": got["pixel_values"], "image_grid_thw": got["image_grid_thw"]}

    def _videos(self, videos: list[np.ndarray], fps: list[float]) -> dict[str, Any]:
        import torch

        if self.pixels is not None:
            got = self.pixels.videos(videos)
        else:
            got = self.processor.video_processor(videos, size=self.video_size, return_tensors="pt")
        patch = self.processor.video_processor.temporal_patch_size
        # one frame rate per video: transformers' processor takes one rate for all the videos of a call
        return {"pixel_values_videos": got["pixel_values_videos"], "video_grid_thw": got["video_grid_thw"],
                "video_second_per_grid": torch.tensor([patch / rate for rate in fps])}

    def _audio(self, audio: list[np.ndarray]) -> dict[str, Any]:
        fe = self.processor.feature_extractor
        got = fe(audio, sampling_rate=fe.sampling_rate, padding=True, truncation=False, return_attention_mask=True,
                 return_tensors="pt")  # Qwen3OmniMoeProcessor's audio settings
        return {"input_features": got["input_features"], "feature_attention_mask": got["attention_mask"]}

    def _expand(self, ids: list[int], media: dict[str, Any]) -> list[int]:
        """`ids` with the k-th image / video / audio placeholder repeated to the k-th part's token count
        (transformers' counts: grid / merge^2; the audio encoder's output length)."""
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni

        tok, m2 = self.processor.tokenizer, self.processor.image_processor.merge_size ** 2
        counts: dict[int, list[int]] = {}
        if "image_grid_thw" in media:
            counts[tok.image_token_id] = (media["image_grid_thw"].prod(-1) // m2).tolist()
        if "video_grid_thw" in media:
            counts[tok.video_token_id] = (media["video_grid_thw"].prod(-1) // m2).tolist()
        if "feature_attention_mask" in media:
            lengths = media["feature_attention_mask"].sum(-1)
            counts[tok.audio_token_id] = omni._get_feat_extract_output_lengths(lengths, self.n_window).tolist()
        out: list[int] = []
        used = dict.fromkeys(counts, 0)
        for token in ids:
            if token in counts:
                if used[token] >= len(counts[token]):
                    raise ValueError(f"the prompt holds more {tok.convert_ids_to_tokens(token)} placeholders than parts")
                out.extend([token] * counts[token][used[token]])
                used[token] += 1
            else:
                out.append(token)
        for token, n in used.items():
            if n != len(counts[token]):
                raise ValueError(f"the prompt holds {n} {tok.convert_ids_to_tokens(token)} placeholders for "
                                 f"{len(counts[token])} parts")
        return out

    def through_transformers(self, text: str, images: list[Any], audio: list[np.ndarray], videos: list[np.ndarray],
                             fps: list[float]) -> Any:
        """The same inputs made by transformers' processor call itself (with the checkpoint's image / video
        processors): the reference `__call__` is held to."""
        kwargs: dict[str, Any] = {"n_window": self.n_window, "return_tensors": "pt"}
        if videos:
            kwargs["videos_kwargs"] = {"size": self.video_size}
        out = self.processor(text=[text], images=images or None, audio=audio or None, videos=videos or None,
                             **kwargs)
        if videos:
            import torch

            patch = self.processor.video_processor.temporal_patch_size
            out["video_second_per_grid"] = torch.tensor([patch / rate for rate in fps])
        return out

    def describe(self) -> dict[str, Any]:
        image = (self.pixels.describe() if self.pixels is not None
                 else "transformers Qwen2VLImageProcessorPil (host)") if "image" in self.modalities else None
        video = self.pixels.describe() if self.pixels is not None and "video" in self.modalities else self.video_processor
        return {"modalities": sorted(self.modalities), "image_processor": image, "video_processor": video,
                "video_size": self.video_size, **({"pixels_note": self.pixels_note} if self.pixels_note else {})}


def _settings(root: Path) -> dict[str, dict[str, Any]]:
    """The image / audio / video settings the checkpoint ships, by part (empty dict: none)."""
    def read(name: str) -> dict[str, Any]:
        path = root / name
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise LoadError(f"{path}: not readable JSON ({e}); restore the checkpoint's processor files") from None

    nested, legacy, video = read("processor_config.json"), read("preprocessor_config.json"), \
        read("video_preprocessor_config.json")
    image = nested.get("image_processor") or (legacy if "patch_size" in legacy else {})
    audio = nested.get("feature_extractor") or (legacy if "feature_size" in legacy else {})
    video = nested.get("video_processor") or video or image
    return {"image": image, "audio": audio, "video": video}


def _media_tokens(tokenizer: Any, config: Any, root: Path) -> dict[str, str]:
    """The tokenizer's spelling of each media token id the model's config names; LoadError if it has none, or
    if the tokenizer declares another token for the role (the processor would expand the wrong one)."""
    tokens = {}
    for id_field, role in MEDIA_TOKEN_FIELDS.items():
        token_id = getattr(config, id_field, None)
        if token_id is None:
            raise LoadError(f"{root}/config.json: the thinker config has no {id_field}; a Qwen3-Omni checkpoint "
                            "names its media token ids there")
        text = tokenizer.convert_ids_to_tokens(int(token_id))
        if text is None or tokenizer.convert_tokens_to_ids(text) != token_id:
            raise LoadError(f"{root}: the tokenizer has no token with id {token_id} ({id_field} of config.json); "
                            "ship the tokenizer the checkpoint was trained with")
        declared = getattr(tokenizer, role, None)
        if declared is not None and declared != text:
            raise LoadError(f"{root}: the tokenizer's {role} is {declared!r} but config.json's {id_field} "
                            f"{token_id} is {text!r}; the two must name the same token")
        tokens[role] = text
    return tokens


def omni_processor(path: str | Path, tokenizer: Any, model: Any) -> MediaProcessor | None:
    """The media processor of the Qwen3-Omni checkpoint at `path` (None: it ships no processor files, so it
    reads text only). `tokenizer`: the checkpoint's, already loaded; `model`: the loaded thinker."""
    root = Path(path)
    return processor_from_settings(_settings(root), tokenizer, model, root)


def processor_from_settings(settings: dict[str, dict[str, Any]], tokenizer: Any, model: Any,
                            root: str | Path, pixels: str = "auto") -> MediaProcessor | None:
    """The media processor from the image / audio / video settings a checkpoint's files hold (`_settings`), or a
    synthetic model carries (quantbench.models.families.qwen3_omni.synthetic); `root` names where they came from in errors.
    `pixels`: where pictures and frames are made: "auto" on the model's device when that is a GPU (bit-equal to
    the PIL processor, and faster there), else on the host by the checkpoint's processors; "device" on the
    model's device always; "host" by the checkpoint's processors always."""
    modalities = {kind for kind, found in (("image", settings["image"]), ("video", settings["image"]),
                                           ("audio", settings["audio"])) if found}
    if not modalities:
        return None
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor  # lazy: in the child only

    config = model.config
    tokens = _media_tokens(tokenizer, config, root)
    for role, text in tokens.items():  # what Qwen3OmniMoeProcessor.__init__ reads off the tokenizer
        setattr(tokenizer, role, text)
        setattr(tokenizer, f"{role}_id", tokenizer.convert_tokens_to_ids(text))
    try:
        # from_dict, as from_pretrained reads a file: a combined preprocessor_config.json holds both parts' keys
        image = Qwen2VLImageProcessorPil.from_dict(settings["image"] or {})
        audio = WhisperFeatureExtractor.from_dict(settings["audio"] or {})
    except (TypeError, ValueError) as e:
        raise LoadError(f"{root}: the processor settings do not build ({e}); check preprocessor_config.json") from None
    video_size = _size(settings["video"]) if "video" in modalities else None
    if _torchvision_imports():
        from transformers import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor.from_dict(settings["video"])
        video_name = "transformers Qwen2VLVideoProcessor (torchvision)"
    else:
        video = NumpyVideoProcessor(image, video_size or _size(settings["image"] or {}))
        video_name = "quantbench NumpyVideoProcessor (PIL per frame; torchvision does not import)"
    processor = _processor_class()(image_processor=image, video_processor=video, feature_extractor=audio,
                                   tokenizer=tokenizer)
    n_window = int(config.audio_config.n_window)  # what the encoder windows by: the processor must count the same
    device = next(model.parameters()).device
    on_device, note = None, None
    if pixels == "device" or (pixels == "auto" and device.type == "cuda"):
        from quantbench.models.families.qwen3_omni.pixels import DevicePixels

        try:
            on_device = DevicePixels(image, device, video_size)
        except ValueError as e:  # settings it does not reproduce: the host processor, and the reason recorded
            if pixels == "device":
                raise LoadError(f"{root}: pixels on the device: {e}") from None
            note = f"pixels on the host: {e}"
    elif pixels not in ("auto", "host"):
        raise ValueError(f"pixels must be auto, device or host, not {pixels!r}")
    return MediaProcessor(processor=processor, modalities=frozenset(modalities), video_size=video_size,
                          n_window=n_window, video_processor=video_name if "video" in modalities else None,
                          pixels=on_device, pixels_note=note, tokens=tokens)


def _size(settings: dict[str, Any]) -> dict[str, int]:
    """The pixel bounds of one image or video frame from a processor file (`size`, or the older
    `min_pixels` / `max_pixels`)."""
    size = dict(settings.get("size") or {})
    if "min_pixels" in settings:
        size["shortest_edge"] = settings["min_pixels"]
    if "max_pixels" in settings:
        size["longest_edge"] = settings["max_pixels"]
    if not {"shortest_edge", "longest_edge"} <= set(size):
        raise LoadError("the checkpoint's processor files give no frame size (size.shortest_edge / longest_edge, "
                        "or min_pixels / max_pixels); add them to preprocessor_config.json")
    return {"shortest_edge": int(size["shortest_edge"]), "longest_edge": int(size["longest_edge"])}
