"""What a library's calibration forwards actually ran, observed from outside the library.

auto-round feeds the dicts of its `dataset` to the model's forward itself (`model(**sample)`, in its MLLM
calibrator for a Qwen3-Omni thinker) and, should a forward raise, logs a warning and goes on with the next sample;
ModelOpt runs quantbench's own loop. Either way, quantbench counts with forward pre-hooks: the model's forwards, how
many of them reached its first decoder layer (the inputs every later layer is calibrated from), and the calls of a
multimodal model's vision and audio towers. `check` then holds the count against the samples given: every sample's
forward reached the decoder, and the towers ran once per sample carrying their media (the vision tower once for
a sample's images and once for its videos), so media calibration that silently ran text only is an error.
"""

from __future__ import annotations

from typing import Any

import torch

from quantbench.errors import QuantbenchError
from quantbench.models.calibration import media_kinds
from quantbench.models.families import family_of_model, supports_multimodal

MEDIA_OF = {"vision": ("image", "video"), "audio": ("audio",)}  # what a tower of each medium reads


class CalibrationWatch:
    """Counts forwards of `model` while it is attached (a context manager)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        family = family_of_model(model)
        # the encoder towers the model's family declares, by module name (Qwen3-Omni: visual, audio_tower)
        self.tower_media = {name: MEDIA_OF[medium] for medium, name in family.towers.items()} \
            if supports_multimodal(family) else {}
        self.counts = {"forwards": 0, "reached_decoder": 0, **dict.fromkeys(self.tower_media, 0)}
        self._armed = False
        self._handles: list[Any] = []

    def __enter__(self) -> CalibrationWatch:
        self._hook(self.model, self._started)
        self._hook(self.model.get_decoder().layers[0], self._reached)
        for name, tower in self.towers().items():
            self._hook(tower, lambda *_, name=name: self._count(name))
        return self

    def towers(self) -> dict[str, torch.nn.Module]:
        """The model's vision and audio towers by name, at whatever depth its transformers version keeps them
        (`model.visual` in 5.24, the thinker's own `visual` in 5.17)."""
        found: dict[str, torch.nn.Module] = {}
        for name, module in self.model.named_modules():
            last = name.rsplit(".", 1)[-1]
            if last in self.tower_media and last not in found:
                found[last] = module
        return found

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, module: torch.nn.Module, fn: Any) -> None:
        self._handles.append(module.register_forward_pre_hook(lambda *_: fn()))

    def _started(self) -> None:
        self.counts["forwards"] += 1
        self._armed = True

    def _reached(self) -> None:  # the layer's own later calls (a library replaying it block by block) not counted
        if self._armed:
            self.counts["reached_decoder"] += 1
            self._armed = False

    def _count(self, name: str) -> None:
        self.counts[name] += 1

    def check(self, batches: list[dict[str, Any]], library: str) -> dict[str, Any]:
        """The counts beside what `batches` (the forward inputs given to `library`) must have made them; a
        QuantbenchError when they differ."""
        kinds = [media_kinds(b) for b in batches]
        towers = self.towers()
        expected = {"forwards": len(batches), "reached_decoder": len(batches),
                    **{name: sum(sum(kind in k for kind in media) for k in kinds)
                       for name, media in self.tower_media.items() if name in towers}}
        found = {k: self.counts[k] for k in expected}
        if found != expected:
            raise QuantbenchError(
                f"{library} calibration ran {found} for {len(batches)} samples, not {expected}: some samples' "
                "forwards did not run (or did not run their media through the towers); its log says why (auto-round "
                "logs 'Calibration forward pass failed' and goes on)")
        return {**found, "samples_with": {kind: sum(kind in k for k in kinds) for kind in ("image", "audio", "video")}}
