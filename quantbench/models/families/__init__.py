"""Model families: the one seam between quantbench and a kind of checkpoint. A family says how to detect a checkpoint
of its kind (its config.json), load it in BF16, render a decision prompt for it, and where its MoE blocks are and how
they route (`MoeLayout`, which the grouped-MoE engine installs from instead of probing the model).

`Qwen3MoeFamily` covers the embedded fixture and Qwen3-30B-A3B (and the synthetic real shapes). Any other
transformers causal LM falls to `GenericMoeFamily`, which finds MoE blocks by their structure (a router `gate` and
`experts`), as quantbench always has. `Qwen3OmniThinkerFamily` runs Qwen3-Omni-MoE checkpoints (full, or thinker
only) as their thinker, read by quantbench's own strict loader. Adding a family is a class here, listed in FAMILIES
ahead of the generic one, and its tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from quantbench.engine.moe.engine import ExpertsBase, MoEBlockRef, MoeLayout, install_grouped_moe
from quantbench.engine.moe.int4 import regroup_experts
from quantbench.errors import ConfigError, LoadError, UnsupportedError
from quantbench.models.checkpoint import load_causal_lm, read_config
from quantbench.models.strict import Checkpoint, finish, stacked_experts
from quantbench.protocol import DecisionRequest
from quantbench.protocol.prompt import render_prompt


class ModelFamily(Protocol):
    name: str

    def detect(self, config: dict[str, Any]) -> bool:
        """Whether a checkpoint with this config.json belongs to the family."""
        ...

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        """The checkpoint as a causal LM in `dtype` on `device`, filled exactly or refused (LoadError)."""
        ...

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        """The prompt for `question` of `request`."""
        ...

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        """Where `model`'s MoE blocks are and how they route."""
        ...


class _TransformersCausalLM:
    """Loading and prompting shared by the families that are plain transformers causal LMs."""

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        return load_causal_lm(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        return render_prompt(tokenizer, request, question)


class Qwen3MoeFamily(_TransformersCausalLM):
    """Qwen3-MoE (`Qwen3MoeForCausalLM`): the fixture, Qwen3-30B-A3B. Every decoder layer's `mlp` is a sparse MoE
    block unless the config lists it in `mlp_only_layers` or `decoder_sparse_step` skips it (transformers' rule);
    routing is softmax top-k, renormalised when `norm_topk_prob`, with no router bias and no shared experts."""

    name = "qwen3_moe"

    def detect(self, config: dict[str, Any]) -> bool:
        return config.get("model_type") == "qwen3_moe"

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        config = model.config
        blocks = []
        for i, layer in enumerate(model.model.layers):
            sparse = i not in config.mlp_only_layers and config.num_experts > 0 and (i + 1) % config.decoder_sparse_step == 0
            if sparse:
                blocks.append(MoEBlockRef(f"model.layers.{i}.mlp", i, layer, "mlp", layer.mlp))
        return MoeLayout(blocks=blocks, top_k=config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob,
                         hidden_act=config.hidden_act)


OMNI_FULL = "qwen3_omni_moe"  # thinker + talker + code2wav, thinker keys under `thinker.`
OMNI_THINKER = "qwen3_omni_moe_thinker"
OMNI_UNREAD = ("talker.", "code2wav.")  # a decision needs the thinker alone: these are never read
_HUB_TOWER = re.compile(r"^(visual|audio_tower)\.")
# transformers >= 5.21's module names of the thinker's parts -> 5.17-5.20's (Qwen3OmniThinkerFamily.renamer)
_TOP_LEVEL = (("model.language_model.", "model."), ("model.visual.", "visual."), ("model.audio_tower.", "audio_tower."))


class Qwen3OmniThinkerFamily:
    """Qwen3-Omni-MoE (`qwen3_omni_moe`: thinker + talker + code2wav; `qwen3_omni_moe_thinker`: thinker only), run
    as `Qwen3OmniMoeThinkerForConditionalGeneration`. transformers has no causal-LM class for it, and cannot load
    auto-round's per-expert export of it, so every tensor is read by quantbench's meta-device loader
    (models/modelopt.py), which maps the three key layouts that exist onto the thinker's module names:

        transformers / hub save, auto-round      [thinker.]model.layers.N…, [thinker.]visual.…, audio_tower.…, lm_head
        ModelOpt export (module names)           model.language_model.layers.N…, model.visual.…, model.audio_tower.…

    Its text decoder layer is Qwen3-MoE's (same forward source), so the MoE blocks route as Qwen3-MoE's."""

    name = "qwen3_omni_thinker"

    def detect(self, config: dict[str, Any]) -> bool:
        return config.get("model_type") in (OMNI_FULL, OMNI_THINKER)

    def unread_prefixes(self, config: dict[str, Any]) -> tuple[str, ...]:
        """Checkpoint key prefixes of the components a decision never reads (talker, code2wav of a full one)."""
        return OMNI_UNREAD if config.get("model_type") == OMNI_FULL else ()

    def module_name(self, key: str, config: dict[str, Any]) -> str | None:
        """The thinker's module name (transformers 5.24 layout) of checkpoint tensor `key`; None for a component
        that is never read. A key of no known layout is returned as it is, so the loader reports it as stray."""
        if key.startswith(self.unread_prefixes(config)):
            return None
        if config.get("model_type") == OMNI_FULL:
            if not key.startswith("thinker."):
                return key
            key = key[len("thinker."):]
        if key.startswith(("model.language_model.", "model.visual.", "model.audio_tower.")):
            return key  # ModelOpt's export: module names already
        if key.startswith("model."):
            return "model.language_model." + key[len("model."):]
        if _HUB_TOWER.match(key):
            return "model." + key
        return key

    def renamer(self, config: dict[str, Any], model: nn.Module) -> Callable[[str], str | None]:
        """Checkpoint key -> `model`'s own module name. `module_name` gives transformers >= 5.21's names (text
        decoder and towers under `model.`); 5.17-5.20 build them at the thinker's top (`model.layers`, `visual`,
        `audio_tower`: the hub layout), as the H200's image (5.17) does."""
        nested = hasattr(model.model, "language_model")

        def rename(key: str) -> str | None:
            name = self.module_name(key, config)
            if name is None or nested:
                return name
            for new, old in _TOP_LEVEL:
                if name.startswith(new):
                    return old + name[len(new):]
            return name

        return rename

    def build_meta(self, path: str | Path, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
        """The thinker on the meta device (no weights made); rotary and sinusoid buffers stay fp32 as
        transformers builds them (`_from_config(dtype=)`, not `.to(dtype)`)."""
        from transformers import (  # lazy: transformers is imported in the child only
            AutoConfig,
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        thinker = config.thinker_config if config.model_type == OMNI_FULL else config
        if hasattr(thinker, "quantization_config"):
            delattr(thinker, "quantization_config")
        with torch.device("meta"):
            return Qwen3OmniMoeThinkerForConditionalGeneration._from_config(thinker, dtype=dtype)

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        """The thinker in `dtype`, every tensor from the checkpoint (models/strict.py) or a LoadError. Per-expert
        tensors are stacked into transformers' fused experts (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]),
        so transformers' experts kernels (grouped_mm, eager) and quantbench's engine all run them."""
        root = Path(path)
        config = read_config(root)
        model = self.build_meta(root, dtype, trust_remote_code)
        ck = Checkpoint(root, device, rename=self.renamer(config, model))
        built: set[int] = set()
        for ref in self.moe_layout(model).blocks:
            experts, prefix = ref.block.experts, f"{ref.name}.experts"
            if not hasattr(experts, "gate_up_proj") or f"{prefix}.0.gate_proj.weight" not in ck:
                continue  # experts stored fused (as the model has them): filled by name like any tensor
            stacked = stacked_experts(ck, prefix, int(experts.gate_up_proj.shape[0]), dtype)
            for attr, tensor in zip(("gate_up_proj", "down_proj"), stacked, strict=True):
                if tuple(tensor.shape) != tuple(getattr(experts, attr).shape):
                    raise LoadError(f"{root}: the experts under {ck.key[f'{prefix}.0.gate_proj.weight'][:-20]} stack "
                                    f"to {tuple(tensor.shape)}; the model's {attr} is {tuple(getattr(experts, attr).shape)}")
                experts._parameters[attr] = nn.Parameter(tensor, requires_grad=False)
                built.add(id(experts._parameters[attr]))
        finish(model, ck, dtype, device, built)
        return model

    def load_int4(self, path: str | Path, dtype: torch.dtype, device: str, *, sym: bool, kernel: str = "auto",
                  trust_remote_code: bool = False) -> tuple[nn.Module, str]:
        """An auto-round (`auto_round:auto_gptq`) export of the thinker, its experts stored per expert
        (`…experts.E.{gate,up,down}_proj.{qweight,qzeros,scales}`), straight into quantbench's grouped-MoE engine;
        (model, kernel path). transformers cannot load this export itself (its `_init_weights` assumes fused
        experts); every tensor comes from the checkpoint, checked as auto-round's own QuantLinears are."""
        root = Path(path)
        config = read_config(root)
        group_size = int((config.get("quantization_config") or {}).get("group_size", 128))
        model = self.build_meta(root, dtype, trust_remote_code)
        ck = Checkpoint(root, device, rename=self.renamer(config, model))
        layout = self.moe_layout(model)
        experts_count = int(model.config.get_text_config().num_experts)
        built: dict[int, tuple[nn.Module, nn.Module]] = {}
        for ref in layout.blocks:
            prefix = f"{ref.name}.experts"
            mlps = nn.ModuleList(nn.Module() for _ in range(experts_count))
            for e, mlp in enumerate(mlps):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    setattr(mlp, proj, _int4_projection(ck, f"{prefix}.{e}.{proj}", group_size, dtype))
            built[ref.layer_index] = regroup_experts(mlps, sym=sym, name=prefix)
        dense = sorted(n for n in ck.where if n.endswith(".qweight") and n not in ck.used)
        if dense:
            raise LoadError(f"{root}: int4 tensors outside the thinker's experts ({ck.key[dense[0]]}, {len(dense)} in "
                            "all); quantbench runs this family with int4 experts only, the rest in BF16 (quantize "
                            "with `quantbench quantize --scheme int4`)")
        path_taken = install_grouped_moe(model, lambda i, _experts: built[i], kernel, layout=layout)
        built_ids = {id(t) for m in model.modules() if isinstance(m, ExpertsBase) for t in m.buffers(recurse=False)}
        finish(model, ck, dtype, device, built_ids)
        return model, path_taken

    def load_per_expert(self, path: str | Path, dtype: torch.dtype, device: str,
                        trust_remote_code: bool = False) -> nn.Module:
        """The thinker of a quantized export as transformers + its quantizer load it (auto-round's per-expert
        QuantLinears: `--no-fast-moe`), refused unless it fills the model exactly (load_causal_lm's check)."""
        from transformers import (  # lazy: transformers is imported in the child only
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )

        with _per_expert_init():
            return load_causal_lm(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                                  model_class=Qwen3OmniMoeThinkerForConditionalGeneration)

    def render(self, request: DecisionRequest, tokenizer: Any, question: str) -> str:
        return render_prompt(tokenizer, request, question)

    def text_root(self, model: nn.Module) -> nn.Module:
        """The text decoder (embeddings, layers, norm): where MoE blocks, fused ops and CUDA graphs apply."""
        inner = model.model
        return inner.language_model if hasattr(inner, "language_model") else inner

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        config = model.config.get_text_config()
        names = {id(m): n for n, m in model.named_modules()}
        blocks = []
        for i, layer in enumerate(self.text_root(model).layers):
            sparse = (i not in (config.mlp_only_layers or ()) and config.num_experts > 0
                      and (i + 1) % config.decoder_sparse_step == 0)
            if sparse:
                blocks.append(MoEBlockRef(names[id(layer.mlp)], i, layer, "mlp", layer.mlp))
        return MoeLayout(blocks=blocks, top_k=config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob,
                         hidden_act=config.hidden_act)


@contextmanager
def _per_expert_init() -> Iterator[None]:
    """transformers' Qwen3-Omni `_init_weights` initialises fused experts (`experts.gate_up_proj`), which a
    per-expert quantized export does not have (AttributeError); while loading, such a block gets the generic init
    only. Nothing stays random: load_causal_lm refuses any weight the checkpoint does not fill."""
    from transformers import PreTrainedModel  # lazy: transformers is imported in the child only
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni

    original = omni.Qwen3OmniMoePreTrainedModel._init_weights

    def init_weights(self: Any, module: nn.Module) -> None:
        sparse = isinstance(module, omni.Qwen3OmniMoeThinkerTextSparseMoeBlock)
        if sparse and not hasattr(module.experts, "gate_up_proj"):
            PreTrainedModel._init_weights(self, module)
            return
        original(self, module)

    omni.Qwen3OmniMoePreTrainedModel._init_weights = init_weights
    try:
        yield
    finally:
        omni.Qwen3OmniMoePreTrainedModel._init_weights = original


def _int4_projection(ck: Checkpoint, name: str, group_size: int, dtype: torch.dtype) -> SimpleNamespace:
    """One expert projection as regroup_experts reads auto-round's QuantLinear (int4), or a 16-bit weight."""
    if f"{name}.qweight" not in ck and f"{name}.weight" in ck:
        return SimpleNamespace(weight=ck.take(f"{name}.weight").to(dtype))
    what = "an int4 auto_round:auto_gptq expert projection"
    qweight = ck.take(f"{name}.qweight", what)
    return SimpleNamespace(qweight=qweight, qzeros=ck.take(f"{name}.qzeros", what), scales=ck.take(f"{name}.scales", what),
                           bits=4, group_size=group_size, infeatures=qweight.shape[0] * 8, outfeatures=qweight.shape[1])


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class GenericMoeFamily(_TransformersCausalLM):
    """Any other transformers causal LM: MoE blocks found by their structure (a module with a router `gate` that
    has a weight, and `experts`: a ModuleList or transformers' fused experts), routing read from the block or the
    (text) config. A model without such blocks still loads and answers through transformers."""

    name = "transformers"

    def detect(self, config: dict[str, Any]) -> bool:
        return True

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        blocks = []
        for name, module in model.named_modules():
            if not _is_moe_block(module):
                continue
            match = _LAYER.search(name)
            parent_name, _, attr = name.rpartition(".")
            blocks.append(MoEBlockRef(name, int(match.group(1)) if match else len(blocks),
                                      model.get_submodule(parent_name), attr, module))
        if not blocks:
            raise UnsupportedError(f"{type(model).__name__} has no MoE block (a module with `gate` and `experts`)")
        config = getattr(model, "config", None)
        config = getattr(config, "get_text_config", lambda: config)()
        first = blocks[0].block
        shared = next((f"{ref.name}.{extra}" for ref in blocks for extra in ("shared_expert", "shared_experts")
                       if getattr(ref.block, extra, None) is not None), None)
        return MoeLayout(
            blocks=blocks,
            top_k=int(_setting(first, config, "top_k", "num_experts_per_tok")),
            norm_topk_prob=bool(_setting(first, config, "norm_topk_prob")),
            hidden_act=getattr(config, "hidden_act", "silu") if config is not None else "silu",
            gate_bias=isinstance(getattr(first.gate, "bias", None), Tensor),
            shared_experts=shared,
        )


def _is_moe_block(module: nn.Module) -> bool:
    gate, experts = getattr(module, "gate", None), getattr(module, "experts", None)
    if gate is None or experts is None or not isinstance(getattr(gate, "weight", None), Tensor):
        return False
    return isinstance(experts, nn.ModuleList) or hasattr(experts, "gate_up_proj")


def _setting(block: nn.Module, config: Any, *names: str) -> Any:
    for owner in (block, getattr(block, "gate", None), getattr(block, "experts", None)):
        for n in names:
            if owner is not None and getattr(owner, n, None) is not None:
                return getattr(owner, n)
    for n in names:
        if getattr(config, n, None) is not None:
            return getattr(config, n)
    raise ConfigError(f"cannot tell the MoE block's {names[0]} (neither the block nor the config has {' / '.join(names)})")


FAMILIES: tuple[ModelFamily, ...] = (Qwen3MoeFamily(), Qwen3OmniThinkerFamily(), GenericMoeFamily())  # first match wins: generic last


def family_of(config: dict[str, Any]) -> ModelFamily:
    """The family of a checkpoint with this config.json (or a model's `config.to_dict()`)."""
    return next(f for f in FAMILIES if f.detect(config))


def moe_layout(model: nn.Module) -> MoeLayout:
    """The MoE layout of a loaded transformers model, from its family."""
    config = getattr(model, "config", None)
    return family_of(config.to_dict() if config is not None else {}).moe_layout(model)
