"""Qwen2-VL's image and video preprocessing as torch ops on the model's device, equal to transformers' PIL processor.

transformers' `Qwen2VLImageProcessorPil` prepares a picture on the host with numpy and PIL: resize (bicubic, to
`smart_resize`'s multiple of patch x merge), rescale, normalise, patchify. For one 448 x 448 picture that was 11.3 ms
of a 44.5 ms INT4 decision on the H200's host (docs/BENCHMARKS.md), and the 4.8 MB of float32 patches it makes then
crossed to the GPU. Here the uint8 picture (600 KB) is copied to the model's device once and the rest runs there.

The result equals the PIL processor's bit for bit, resized or not (tests/test_omni_media_pixels.py, several sizes,
up and down, and a video): the resize is PIL's own algorithm, not torch's bicubic (which differs from PIL's by up
to one 8-bit level, qwen3-omni.md §2). PIL resamples 8-bit images in fixed point: per output pixel the bicubic
(a = -0.5) weights of its input window (widened by the scale when shrinking), normalised, scaled by 2^22 and
truncated to integers; a horizontal pass rounded and clipped to uint8, then a vertical one (libImaging/Resample.c).
Those integer weights are computed here with the same double arithmetic in the same order, and both passes are
integer sums (exact in any order), so the device's result is PIL's; which pass goes first (Pillow 13 chooses by
cost) is found once per pair of sizes from Pillow itself. Rescale and normalise follow transformers'
numpy steps (float64 rescale cast to float32, then (x - mean) / std in float32, IEEE division on CPU and CUDA).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

PRECISION_BITS = 22  # PIL's fixed point for 8-bit images: 32 - 8 - 2


def _bicubic(x: np.ndarray) -> np.ndarray:
    """PIL's bicubic filter (a = -0.5), the same operations in the same order as libImaging's bicubic_filter."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@lru_cache(maxsize=64)
def pil_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(input index [out, taps], integer weight [out, taps]) of PIL's 8-bit bicubic resample of one axis from
    `in_size` to `out_size` pixels (precompute_coeffs + normalize_coeffs_8bpc); padded taps weigh 0."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    taps = np.arange(ksize)
    valid = taps[None, :] < xmax[:, None]
    weights = np.where(valid, _bicubic((taps[None, :] + xmin[:, None] - center[:, None] + 0.5) * (1.0 / filterscale)), 0.0)
    total = np.cumsum(weights, axis=1)[:, -1:]  # summed left to right, as the C loop does
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), weights)
    fixed = np.where(weights < 0, np.trunc(-0.5 + weights * (1 << PRECISION_BITS)),
                     np.trunc(0.5 + weights * (1 << PRECISION_BITS)))
    index = np.where(valid, xmin[:, None] + taps[None, :], 0)
    return index.astype(np.int64), fixed.astype(np.int32)


@lru_cache(maxsize=64)
def _device_taps(in_size: int, out_size: int, device: str) -> tuple[Tensor, Tensor]:
    """pil_taps on `device`, copied there once per pair of sizes."""
    index, weight = pil_taps(in_size, out_size)
    return torch.from_numpy(index).to(device), torch.from_numpy(weight).to(device)


def _pass(image: Tensor, out_size: int) -> Tensor:
    """One PIL resample pass of an int32 image along its first dimension, rounded and clipped to 0..255 as
    libImaging's clip8 (the first dimension, so each tap gathers whole rows: fast on CPU and GPU alike)."""
    index_t, weight_t = _device_taps(image.shape[0], out_size, str(image.device))
    weight_t = weight_t.view(out_size, index_t.shape[1], *[1] * (image.dim() - 1))
    acc = image.index_select(0, index_t[:, 0]) * weight_t[:, 0]
    for t in range(1, index_t.shape[1]):
        acc += image.index_select(0, index_t[:, t]) * weight_t[:, t]
    acc += 1 << (PRECISION_BITS - 1)
    return torch.clamp(torch.div(acc, 1 << PRECISION_BITS, rounding_mode="floor"), 0, 255)


def _passes(image: Tensor, height: int, width: int, vertical_first: bool) -> Tensor:
    for axis in ((0, 1) if vertical_first else (1, 0)):
        if axis == 1 and image.shape[1] != width:
            image = _pass(image.transpose(0, 1), width).transpose(0, 1)
        if axis == 0 and image.shape[0] != height:
            image = _pass(image, height)
    return image


@lru_cache(maxsize=256)
def pil_vertical_first(in_h: int, in_w: int, out_h: int, out_w: int) -> bool:
    """Whether the installed Pillow resamples these sizes vertical pass first. libImaging long ran the horizontal
    pass first; Pillow 13 picks the order by cost (measured: 150 x 100 -> 160 x 96 runs vertical first), and the
    uint8 rounding between the passes makes the order visible. Found once per sizes by resizing a noise picture
    with Pillow itself and comparing both orders."""
    from PIL import Image

    noise = np.random.RandomState(in_h * 7919 + in_w).randint(0, 256, (in_h, in_w, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(noise).resize((out_w, out_h), Image.BICUBIC))
    probe = torch.from_numpy(noise).to(torch.int32)
    return bool(np.array_equal(_passes(probe, out_h, out_w, True).numpy(), want)
                and not np.array_equal(_passes(probe, out_h, out_w, False).numpy(), want))


def pil_resize(image: Tensor, height: int, width: int) -> Tensor:
    """An int32 [H, W, C] image with values 0..255 resized as PIL's `Image.resize((width, height), BICUBIC)`
    resizes the uint8 picture: one pass per axis whose size changes, in the order this Pillow takes."""
    both = image.shape[0] != height and image.shape[1] != width
    first = both and pil_vertical_first(image.shape[0], image.shape[1], height, width)
    return _passes(image, height, width, first)


class DevicePixels:
    """The image and video inputs of a Qwen2-VL-style processor (`pixel_values` [patches, C * T * ps * ps] float32,
    grids [n, 3] int64 on the host), made on `device` from the settings of the checkpoint's PIL image processor
    (patch, merge and temporal patch sizes, size bounds, rescale factor, mean, std)."""

    def __init__(self, image_processor: Any, device: torch.device | str, video_size: dict[str, int] | None = None):
        import importlib

        from transformers.image_utils import PILImageResampling

        ip = image_processor
        # the image processor's own module's smart_resize (transformers keeps one beside each Qwen2-VL class)
        self._smart_resize = getattr(importlib.import_module(type(ip).__module__), "smart_resize", None)
        if self._smart_resize is None:
            from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

            self._smart_resize = smart_resize
        if ip.resample not in (PILImageResampling.BICUBIC, int(PILImageResampling.BICUBIC)):
            raise ValueError(f"resample {ip.resample!r}: only bicubic, the Qwen2-VL processor's, is reproduced")
        self.device = torch.device(device)
        self.patch_size, self.merge_size, self.temporal_patch_size = ip.patch_size, ip.merge_size, ip.temporal_patch_size
        self.image_size = {"shortest_edge": int(ip.size["shortest_edge"]), "longest_edge": int(ip.size["longest_edge"])}
        self.video_size = dict(video_size) if video_size else self.image_size
        self.do_resize, self.do_rescale, self.do_normalize = ip.do_resize, ip.do_rescale, ip.do_normalize
        self.rescale_factor = float(ip.rescale_factor)
        self.mean = torch.tensor(ip.image_mean, dtype=torch.float32, device=self.device).view(-1, 1, 1)
        self.std = torch.tensor(ip.image_std, dtype=torch.float32, device=self.device).view(-1, 1, 1)
        if getattr(ip, "do_convert_rgb", True) is False:
            raise ValueError("do_convert_rgb False: the decoded RGB pictures are what the processor reads")

    def describe(self) -> str:
        return f"quantbench DevicePixels on {self.device.type} (PIL's bicubic in fixed point, bit-equal to Qwen2VLImageProcessorPil)"

    def _target(self, height: int, width: int, size: dict[str, int]) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        return self._smart_resize(height, width, factor=self.patch_size * self.merge_size,
                            min_pixels=size["shortest_edge"], max_pixels=size["longest_edge"])

    def _frames(self, frames: Tensor, size: dict[str, int]) -> Tensor:
        """uint8 [N, H, W, 3] on the device -> float32 [N, 3, H', W'] resized, rescaled, normalised."""
        n, height, width, _ = frames.shape
        th, tw = self._target(height, width, size)
        if (th, tw) != (height, width):
            frames = torch.stack([pil_resize(f.to(torch.int32), th, tw) for f in frames])
        chw = frames.permute(0, 3, 1, 2)
        x = chw.to(torch.float64) * self.rescale_factor if self.do_rescale else chw.to(torch.float64)
        x = x.to(torch.float32)
        return (x - self.mean) / self.std if self.do_normalize else x

    def images(self, images: list[Any]) -> dict[str, Tensor]:
        """{"pixel_values", "image_grid_thw"} of RGB PIL pictures, in order (each broadcast over the temporal
        patch, as transformers' processor patchifies one picture)."""
        ps, m, tps = self.patch_size, self.merge_size, self.temporal_patch_size
        patches, grids = [], []
        for picture in images:
            raw = torch.from_numpy(np.array(picture)).to(self.device)  # [H, W, 3] uint8: the only upload
            x = self._frames(raw[None], self.image_size)[0]
            c, h, w = x.shape
            gh, gw = h // ps, w // ps
            p = x.reshape(c, gh // m, m, ps, gw // m, m, ps).permute(1, 4, 2, 5, 0, 3, 6)
            p = p.unsqueeze(5).expand(*p.shape[:5], tps, ps, ps)
            patches.append(p.reshape(gh * gw, c * tps * ps * ps))
            grids.append([1, gh, gw])
        return {"pixel_values": torch.cat(patches) if len(patches) > 1 else patches[0],
                "image_grid_thw": torch.tensor(grids, dtype=torch.int64)}

    def videos(self, videos: list[np.ndarray]) -> dict[str, Tensor]:
        """{"pixel_values_videos", "video_grid_thw"} of uint8 [frames, H, W, 3] videos: every frame resized to
        the video size, frames padded to a multiple of the temporal patch by repeating the last, Qwen2-VL's
        video patch order (quantbench.models.families.qwen3_omni.processor.NumpyVideoProcessor's, on the device)."""
        ps, m, tps = self.patch_size, self.merge_size, self.temporal_patch_size
        patches, grids = [], []
        for video in videos:
            raw = torch.from_numpy(np.ascontiguousarray(video)).to(self.device)
            x = self._frames(raw, self.video_size)
            if pad := -x.shape[0] % tps:
                x = torch.cat([x, x[-1:].expand(pad, *x.shape[1:])])
            t, c, h, w = x.shape
            gt, gh, gw = t // tps, h // ps, w // ps
            p = x.reshape(gt, tps, c, gh // m, m, ps, gw // m, m, ps).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
            patches.append(p.reshape(gt * gh * gw, c * tps * ps * ps))
            grids.append([gt, gh, gw])
        return {"pixel_values_videos": torch.cat(patches) if len(patches) > 1 else patches[0],
                "video_grid_thw": torch.tensor(grids, dtype=torch.int64)}
