"""What a model family is: what every family answers (`ModelFamily`, with `FamilyBase`'s answers for a plain
transformers causal LM), and the capabilities a family may declare.

As in vLLM's model registry (`vllm/model_executor/models/interfaces.py`), a capability is a small interface with a
class attribute set to True; a family declares it by inheriting the interface, and a caller asks the helper beside
it (`supports_multimodal(family)`), never `isinstance` on a family's own class. What a caller needs from a family
that does not declare a capability has a default here, so a new family overrides only where it differs:

    supports_multimodal(family)   it reads media in a decision's state: its own decision engine and media
                                  processor, and it is quantized by the multimodal route
                                  (quantbench.make.quantize.multimodal)
    has_key_layouts(family)       its checkpoints come in several key layouts and may hold components a decision
                                  never reads (`module_name`, `unread_prefixes`, `renamer`)
    loads_int4_itself(family)     it reads an auto-round int4 export straight into the grouped-MoE engine
                                  (transformers cannot load that export of it)
    has_synthetic_shapes(family)  it has real shapes built with seeded random weights (`run --shape`)

Nothing here, nor in any family's `family.py`, imports torch or transformers at module level: the parent asks a
family about a config.json (its checks, the quantize route, the synthetic shapes' names) without them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeGuard

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantbench.engine.moe.engine import MoeLayout
    from quantbench.protocol import DecisionRequest

Rename = Callable[[str], str | None]  # a checkpoint key -> the model's module name (None: a tensor never read)


class ModelFamily(Protocol):
    """What every family answers. `FamilyBase` answers all but `name` and `moe_layout` for a transformers causal
    LM; the capability interfaces below add what only some families can do."""

    name: str  # stored on a run row (`extra.family`) where the family reads part of a checkpoint
    title: str  # how a message names the family's checkpoints ("Qwen3-Omni-MoE")
    model_types: tuple[str, ...]  # config.json `model_type` values of the family: spelled here, nowhere else
    modeling_modules: tuple[str, ...]  # transformers modeling modules auto-round may patch (backends/int4.py)

    def detect(self, config: dict[str, Any]) -> bool:
        """Whether a checkpoint with this config.json belongs to the family."""
        ...

    def check_config(self, root: Path, config: dict[str, Any]) -> None:
        """Refuse (LoadError naming the file and the fix), before any model is built, a config.json the family
        cannot load."""
        ...

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        """The checkpoint as a model in `dtype` on `device`, filled exactly or refused (LoadError)."""
        ...

    def load_per_expert(self, path: str | Path, dtype: torch.dtype, device: str,
                        trust_remote_code: bool = False) -> nn.Module:
        """A quantized export as transformers and its quantizer load it (auto-round's per-expert QuantLinears:
        `--no-fast-moe`)."""
        ...

    def meta_model(self, root: Path, dtype: torch.dtype, trust_remote_code: bool = False) -> tuple[nn.Module, Rename | None]:
        """The checkpoint's model on the meta device (no weights made), and how checkpoint keys map onto its module
        names (None: they are its module names): what quantbench's own loaders fill (quantbench.models.modelopt)."""
        ...

    def load_for_calibration(self, source: Path, device: str) -> nn.Module:
        """The BF16 model on transformers' `eager` experts path, where ModelOpt intercepts fused experts."""
        ...

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        """The prompt for `question` of `request`."""
        ...

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        """Where `model`'s MoE blocks are and how they route."""
        ...

    def decision_engine(self, model: nn.Module, tokenizer: Any, spec: Any, checkpoint: str | Path | None) -> Any:
        """The decision engine a backend builds for a loaded model of the family (`checkpoint`: where it was
        loaded from, for its processor files; None for a synthetic model)."""
        ...


class FamilyBase:
    """The answers of a plain transformers causal LM, for every question a family may leave alone."""

    name: str
    title: str
    model_types: tuple[str, ...] = ()
    modeling_modules: tuple[str, ...] = ()

    def detect(self, config: dict[str, Any]) -> bool:
        return config.get("model_type") in self.model_types

    def check_config(self, root: Path, config: dict[str, Any]) -> None:
        return None

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        from quantbench.models.checkpoint import load_causal_lm

        return load_causal_lm(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)

    def load_per_expert(self, path: str | Path, dtype: torch.dtype, device: str,
                        trust_remote_code: bool = False) -> nn.Module:
        return self.load(path, dtype, device, trust_remote_code)

    def meta_model(self, root: Path, dtype: torch.dtype, trust_remote_code: bool = False) -> tuple[nn.Module, Rename | None]:
        import torch
        from transformers import (  # lazy: transformers is imported in the child only
            AutoConfig,
            AutoModelForCausalLM,
        )

        hf_config = AutoConfig.from_pretrained(root, trust_remote_code=trust_remote_code)
        if hasattr(hf_config, "quantization_config"):
            delattr(hf_config, "quantization_config")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, trust_remote_code=trust_remote_code)
        return model, None

    def load_for_calibration(self, source: Path, device: str) -> nn.Module:
        import torch

        from quantbench.models.checkpoint import load_causal_lm

        return load_causal_lm(source, dtype=torch.bfloat16, device=device, experts_implementation="eager")

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        from quantbench.protocol.prompt import render_prompt

        return render_prompt(tokenizer, request, question)

    def decision_engine(self, model: nn.Module, tokenizer: Any, spec: Any, checkpoint: str | Path | None) -> Any:
        from quantbench.engine.scoring import TransformersEngine

        return TransformersEngine.for_spec(model, tokenizer, spec)


# -- capabilities -----------------------------------------------------------------------------------------------
class SupportsMultiModal(Protocol):
    """A family whose models read images, audio or video in a decision's state. Its `decision_engine` builds its
    own engine with the checkpoint's media processor; its checkpoints are quantized by the multimodal route
    (experts only, the part a decision reads as a checkpoint of its own, each library in a child process)."""

    supports_multimodal: ClassVar[Literal[True]] = True
    towers: ClassVar[Mapping[str, str]]  # medium ("vision", "audio") -> its encoder's module name, kept BF16 whole

    def media_processor(self, checkpoint: str | Path, tokenizer: Any, model: Any) -> Any:
        """The checkpoint's media processor (its `modalities`), or None: it ships no processor files and reads
        text only."""
        ...

    def media_engine(self, model: Any, tokenizer: Any, **settings: Any) -> Any:
        """The family's decision engine over `model` with the given settings (`media`: a media processor,
        `limits`, `media_base`, `cuda_graph`, `fused_ops`, ...): what calibration and training prepare media
        with, exactly as a decision is prepared."""
        ...

    def media_inputs(self, media: dict[str, Any], device: Any, dtype: Any) -> dict[str, Any]:
        """One prepared row's media inputs (a `Prepared.media` item of media_engine's) as the model's forward
        takes them, on `device`."""
        ...

    def model_class(self) -> type:
        """The transformers class the family runs as (for `from_pretrained` of a variant made from it)."""
        ...

    def standalone_config(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The config.json of a checkpoint holding only the part a decision reads, made from `config`; None when
        `config` is one already."""
        ...


def supports_multimodal(family: Any) -> TypeGuard[SupportsMultiModal]:
    return bool(getattr(family, "supports_multimodal", False))


class HasKeyLayouts(Protocol):
    """A family whose checkpoints come in several key layouts (a full checkpoint and the part a decision reads,
    hub names and module names), some holding components a decision never reads."""

    has_key_layouts: ClassVar[Literal[True]] = True

    def unread_prefixes(self, config: dict[str, Any]) -> tuple[str, ...]:
        """Checkpoint key prefixes of the components a decision never reads."""
        ...

    def module_name(self, key: str, config: dict[str, Any]) -> str | None:
        """One name per tensor across the layouts (the model's module name); None for a component never read."""
        ...

    def renamer(self, config: dict[str, Any], model: Any) -> Rename:
        """Checkpoint key -> `model`'s own module name (its transformers version may nest them otherwise)."""
        ...


def has_key_layouts(family: Any) -> TypeGuard[HasKeyLayouts]:
    return bool(getattr(family, "has_key_layouts", False))


class LoadsInt4Itself(Protocol):
    """A family whose auto-round int4 export transformers cannot load: quantbench reads it straight into the
    grouped-MoE engine (the int4 backend's fast path)."""

    loads_int4_itself: ClassVar[Literal[True]] = True

    def load_int4(self, path: str | Path, dtype: torch.dtype, device: str, *, sym: bool, kernel: str = "auto",
                  trust_remote_code: bool = False) -> tuple[nn.Module, str]:
        """(model, kernel path) of the export at `path`, every tensor from the checkpoint or a LoadError."""
        ...


def loads_int4_itself(family: Any) -> TypeGuard[LoadsInt4Itself]:
    return bool(getattr(family, "loads_int4_itself", False))


class HasSyntheticShapes(Protocol):
    """A family with real model shapes built in memory with seeded random weights (`run --shape`, speed and
    memory only): quantbench.models.synthetic builds, quantizes and saves them from what the family says here."""

    has_synthetic_shapes: ClassVar[Literal[True]] = True
    synthetic_shapes: ClassVar[Mapping[str, dict[str, Any]]]  # name -> its text decoder's dims (--layers reads them)

    def synthetic_config(self, shape: str, layers: int | None) -> tuple[Any, Any]:
        """(the model's config, its tokenizer) for `shape`; `layers` shrinks the text decoder."""
        ...

    def synthetic_meta(self, config: Any, dtype: torch.dtype) -> nn.Module:
        """The shape's model on the meta device, its parameters typed `dtype`."""
        ...

    def synthetic_buffers(self, model: nn.Module, device: Any) -> None:
        """The computed buffers (rotary frequencies, ...) a meta model has no values for, made on `device`."""
        ...

    def synthetic_marks(self) -> dict[str, Any]:
        """Attributes a built synthetic model carries besides its weights (a media processor's settings)."""
        ...

    def synthetic_files(self) -> dict[str, str]:
        """Files a saved synthetic checkpoint ships besides weights, config and tokenizer (name -> text)."""
        ...


def has_synthetic_shapes(family: Any) -> TypeGuard[HasSyntheticShapes]:
    return bool(getattr(family, "has_synthetic_shapes", False))
