"""Model families: the one seam between quantbench and a kind of checkpoint, one folder each.

    qwen3_moe/    Qwen3-MoE: the embedded default model, Qwen3-30B-A3B and its real shape
    qwen3_omni/   Qwen3-Omni-MoE, run as its thinker: key layouts, its int4 loader, media (engine, processor,
                  towers), its real shape
    generic/      any other transformers causal LM, MoE blocks found by their structure (last: it takes any config)

A family says how to detect a checkpoint of its kind (its config.json's model types, spelled in its folder only),
load it, render a decision prompt for it, where its MoE blocks are and how they route (`MoeLayout`, which the
grouped-MoE engine installs from instead of probing the model), which decision engine to build, and which
capabilities it has (base.py: `supports_multimodal(family)` and its siblings; callers ask those, never isinstance on a
family). Adding a family is a folder here, an entry in FAMILIES ahead of the generic one, and its tests: nothing
elsewhere branches on a family.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantbench.errors import LoadError
from quantbench.models.families.base import (
    FamilyBase,
    HasKeyLayouts,
    HasSyntheticShapes,
    LoadsInt4Itself,
    ModelFamily,
    SupportsMultiModal,
    has_key_layouts,
    has_synthetic_shapes,
    loads_int4_itself,
    supports_multimodal,
)
from quantbench.models.families.generic import GenericMoeFamily
from quantbench.models.families.qwen3_moe import Qwen3MoeFamily
from quantbench.models.families.qwen3_omni import Qwen3OmniThinkerFamily

if TYPE_CHECKING:
    from torch import nn

    from quantbench.engine.moe.engine import MoeLayout

FAMILIES: tuple[ModelFamily, ...] = (Qwen3MoeFamily(), Qwen3OmniThinkerFamily(), GenericMoeFamily())  # first match wins: generic last

__all__ = ["FAMILIES", "FamilyBase", "GenericMoeFamily", "HasKeyLayouts", "HasSyntheticShapes", "LoadsInt4Itself",
           "ModelFamily", "Qwen3MoeFamily", "Qwen3OmniThinkerFamily", "SupportsMultiModal", "decision_engine", "family_of", "family_of_model", "has_key_layouts",
           "has_synthetic_shapes", "loads_int4_itself", "modeling_modules", "moe_layout", "shape_family",
           "supports_multimodal", "synthetic_shapes"]


def family_of(config: dict[str, Any]) -> ModelFamily:
    """The family of a checkpoint with this config.json (or a model's `config.to_dict()`)."""
    return next(f for f in FAMILIES if f.detect(config))


def family_of_model(model: nn.Module) -> ModelFamily:
    """The family of a loaded transformers model, from its config."""
    config = getattr(model, "config", None)
    return family_of(config.to_dict() if config is not None else {})


def moe_layout(model: nn.Module) -> MoeLayout:
    """The MoE layout of a loaded transformers model, from its family."""
    return family_of_model(model).moe_layout(model)


def decision_engine(model: nn.Module, tokenizer: Any, spec: Any, checkpoint: str | Path | None) -> Any:
    """The engine every local backend builds for its loaded model: its family's (OmniEngine with the checkpoint's
    media processor for a family that reads media, TransformersEngine otherwise). The one place a backend asks, so
    no backend carries its own copy of the choice. A tokenizer that encodes text to nothing is refused first."""
    refuse_empty_tokenizer(tokenizer, checkpoint)
    refuse_broken_chat_template(tokenizer, checkpoint)
    return family_of_model(model).decision_engine(model, tokenizer, spec, checkpoint)


def refuse_empty_tokenizer(tokenizer: Any, checkpoint: str | Path | None) -> None:
    """LoadError when `tokenizer` encodes a word to no tokens: what transformers' AutoTokenizer gives for a
    checkpoint without tokenizer files (an empty tokenizer of the config's class, vocabulary of 1). Every prompt
    then becomes zero tokens and the run's child crashed inside the model (IndexError) instead of naming the files."""
    if tokenizer("State: decision", add_special_tokens=False)["input_ids"]:
        return
    where = f"{checkpoint}: " if checkpoint else ""
    raise LoadError(f"{where}its tokenizer encodes text to no tokens (vocabulary of {len(tokenizer)}): the checkpoint "
                    "has no tokenizer files (tokenizer.json, or tokenizer.model / vocab.json + merges.txt, with "
                    "tokenizer_config.json); copy them from the model it was made from")


def refuse_broken_chat_template(tokenizer: Any, checkpoint: str | Path | None) -> None:
    """LoadError when the checkpoint's chat template does not render a decision's message: the run's child crashed
    on the first question with a bare jinja2 TemplateSyntaxError naming no file."""
    from jinja2 import TemplateError

    from quantbench.protocol.prompt import uses_chat_template

    if not uses_chat_template(tokenizer):
        return
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "State: decision"}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=False)
    except (TemplateError, ValueError, TypeError, KeyError) as e:
        where = f"{checkpoint}: " if checkpoint else ""
        raise LoadError(f"{where}its chat template (tokenizer_config.json chat_template, or chat_template.jinja) does "
                        f"not render a message: {type(e).__name__}: {e}; fix it, or copy it from the model the "
                        "checkpoint was made from") from e


def synthetic_shapes() -> dict[str, dict[str, Any]]:
    """Every family's real shapes (`--shape`): name -> its text decoder's dims. Imports no torch."""
    return {name: dims for family in FAMILIES if has_synthetic_shapes(family)
            for name, dims in family.synthetic_shapes.items()}


def shape_family(shape: str) -> HasSyntheticShapes:
    """The family whose real shape `shape` is; ValueError naming the known shapes when none is."""
    for family in FAMILIES:
        if has_synthetic_shapes(family) and shape in family.synthetic_shapes:
            return family
    raise ValueError(f"unknown synthetic shape {shape!r}; known: {', '.join(sorted(synthetic_shapes()))}")


def modeling_modules() -> tuple[str, ...]:
    """The transformers modeling modules of every family (what an auto-round load may patch, backends/int4.py)."""
    return tuple(m for family in FAMILIES for m in family.modeling_modules)
