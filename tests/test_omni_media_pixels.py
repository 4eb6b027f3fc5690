"""Issue #25 part 8: the media inputs made without transformers' per-call processor machinery, and the pictures and
video frames made on the model's device (quantbench.models.families.qwen3_omni.pixels), equal what transformers' processor makes.

- DevicePixels equals `Qwen2VLImageProcessorPil` bit for bit (torch.equal) on pictures of several sizes, shrunk,
  enlarged and left alone, under the real checkpoint's settings, the test checkpoint's and CLIP's mean / std; and
  quantbench's NumpyVideoProcessor (PIL per frame) on videos, an odd frame count padded.
- MediaProcessor's call (one tokenization, placeholders repeated by id) equals `Qwen3OmniMoeProcessor.__call__`
  key by key (token ids, pixel values, grids, audio features and mask, video timing) for an image, audio, a video
  and all of them with two pictures, with pixels on the host and on the device.
- A request's questions share one set of media tensors: the picture is processed once a request.
- The run records which image processor ran.
On the CPU (CI): the device here is the CPU; on a GPU the same torch ops run on the model's device (integer
resampling and IEEE float32 division: the same bits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from quantbench.models.families.qwen3_omni import synthetic as SO
from quantbench.models.families.qwen3_omni.pixels import DevicePixels, pil_resize
from quantbench.models.families.qwen3_omni.processor import NumpyVideoProcessor, processor_from_settings
from quantbench.protocol import parse_request
from tests.omni_tiny import AUDIO_FEATURES, IMAGE, omni_tokenizer
from tests.test_omni_shape_towers import thinker

CLIP = dict(IMAGE, image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711])
SIZES = [(120, 90), (448, 448), (640, 480), (20, 30), (333, 517), (64, 64), (150, 100)]  # (width, height)


def picture(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("settings", [SO.IMAGE_PROCESSOR, IMAGE, CLIP], ids=["real", "test", "clip"])
def test_device_pixels_equal_the_pil_processor_bit_for_bit(settings):
    reference = Qwen2VLImageProcessorPil(**settings)
    ours = DevicePixels(reference, "cpu")
    resized = 0
    for i, (width, height) in enumerate(SIZES):
        image = picture(width, height, i)
        want = reference(images=[image], return_tensors="pt")
        got = ours.images([image])
        assert torch.equal(got["image_grid_thw"], want["image_grid_thw"]), (width, height)
        assert torch.equal(got["pixel_values"], want["pixel_values"]), (width, height)
        resized += int(want["image_grid_thw"][0, 1:].prod()) * 256 != width * height
    assert resized >= 3  # half the sizes or more are resized (shrunk or enlarged), not only patched
    two = [picture(120, 90, 7), picture(64, 96, 8)]
    want = reference(images=two, return_tensors="pt")
    assert torch.equal(ours.images(two)["pixel_values"], want["pixel_values"])


def test_the_pil_resize_is_pils_own_up_and_down():
    image = picture(97, 61, 3)
    for width, height in ((45, 30), (200, 150), (97, 20), (13, 61), (120, 50), (60, 90)):
        want = np.asarray(image.resize((width, height), Image.BICUBIC))
        got = pil_resize(torch.from_numpy(np.asarray(image).copy()).to(torch.int32), height, width)
        assert np.array_equal(got.numpy().astype(np.uint8), want), (width, height)


def test_device_video_frames_equal_the_numpy_video_processor():
    reference = Qwen2VLImageProcessorPil(**IMAGE)
    size = {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}
    video = np.random.RandomState(5).randint(0, 256, (3, 100, 150, 3), dtype=np.uint8)  # resized, padded to 4
    want = NumpyVideoProcessor(reference, size)([video])
    got = DevicePixels(reference, "cpu", size).videos([video])
    assert torch.equal(got["video_grid_thw"], want["video_grid_thw"]) and got["video_grid_thw"].tolist() == [[2, 6, 10]]
    assert torch.equal(got["pixel_values_videos"], torch.as_tensor(want["pixel_values_videos"]))


def media_processor(pixels: str):
    settings = {"image": IMAGE, "audio": AUDIO_FEATURES, "video": IMAGE}
    return processor_from_settings(settings, omni_tokenizer(), thinker(), "test", pixels=pixels)


PROMPT = {"image": "<|vision_start|><|image_pad|><|vision_end|>", "video": "<|vision_start|><|video_pad|><|vision_end|>",
          "audio": "<|audio_start|><|audio_pad|><|audio_end|>"}


@pytest.mark.parametrize("pixels", ["host", "device"])
@pytest.mark.parametrize("kinds", [["image"], ["audio"], ["video"], ["image", "audio", "video", "image"]],
                         ids=["image", "audio", "video", "all"])
def test_the_media_processor_equals_transformers_processor(pixels, kinds):
    media = media_processor(pixels)
    assert (media.pixels is not None) == (pixels == "device")
    rng = np.random.RandomState(2)
    images = [picture(120, 90, 1), picture(50, 70, 2)][: kinds.count("image")]
    audio = [(0.3 * np.sin(np.arange(16000) * 0.05) + 0.01 * rng.randn(16000)).astype(np.float32)] * ("audio" in kinds)
    videos = [rng.randint(0, 256, (4, 64, 96, 3), dtype=np.uint8)] * ("video" in kinds)
    fps = [2.0] * len(videos)
    text = "State: a " + " then ".join(PROMPT[k] for k in kinds) + " done. Answer:"
    want = media.through_transformers(text, images, audio, videos, fps)
    got = media(text, images, audio, videos, fps)
    keys = {"input_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
            "video_second_per_grid", "input_features", "feature_attention_mask"}
    assert set(got) == keys & set(want)
    for key in got:
        assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(want[key])), key


def test_a_requests_questions_process_the_picture_once(monkeypatch):
    from tests.test_omni_media import STATES
    from tests.test_omni_shape_towers import engine

    ours = engine()
    ours.media = media_processor("device")
    calls = []
    real = DevicePixels.images
    monkeypatch.setattr(DevicePixels, "images", lambda self, images: calls.append(len(images)) or real(self, images))
    questions = {"ok": {"type": "boolean"}, "danger": {"type": "boolean"},
                 "action": {"type": "choice", "criteria": {"left": "Turn left", "right": "Turn right"}}}
    prepared = ours.prepare(parse_request({"state": STATES["image"], "questions": questions}))
    assert calls == [1] and len({id(m) for m in prepared.media}) == 1
    assert all(p is not None and p.shape == (3, len(r)) for p, r in zip(prepared.positions, prepared.rows, strict=True))
    described = ours.report().media
    assert described["image_processor"].startswith("quantbench DevicePixels on cpu")
    assert media_processor("host").describe()["image_processor"] == "transformers Qwen2VLImageProcessorPil (host)"
