"""Qwen3-Omni-MoE (`qwen3_omni_moe`: thinker + talker + code2wav; `qwen3_omni_moe_thinker`: thinker only), run as
`Qwen3OmniMoeThinkerForConditionalGeneration`. transformers has no causal-LM class for it, and cannot load
auto-round's per-expert export of it, so every tensor is read by quantbench's meta-device loader (models/strict.py,
models/modelopt.py), which maps the three key layouts that exist onto the thinker's module names:

    transformers / hub save, auto-round      [thinker.]model.layers.N…, [thinker.]visual.…, audio_tower.…, lm_head
    ModelOpt export (module names)           model.language_model.layers.N…, model.visual.…, model.audio_tower.…

Its text decoder layer is Qwen3-MoE's (same forward source), so the MoE blocks route as Qwen3-MoE's. It reads
images, audio and video (this folder's engine.py, processor.py, towers.py), and has a real shape with random
weights (synthetic.py: `--shape qwen3-omni-30b-a3b`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from quantbench.errors import LoadError
from quantbench.models.families.base import (
    FamilyBase,
    HasKeyLayouts,
    HasSyntheticShapes,
    LoadsInt4Itself,
    Rename,
    SupportsMultiModal,
)
from quantbench.models.families.qwen3_omni.synthetic import OMNI_SHAPES

if TYPE_CHECKING:
    import torch
    from torch import nn

    from quantbench.engine.moe.engine import MoeLayout
    from quantbench.models.strict import Checkpoint

OMNI_FULL = "qwen3_omni_moe"  # thinker + talker + code2wav, thinker keys under `thinker.`
OMNI_THINKER = "qwen3_omni_moe_thinker"
OMNI_UNREAD = ("talker.", "code2wav.")  # a decision needs the thinker alone: these are never read
_HUB_TOWER = re.compile(r"^(visual|audio_tower)\.")
# transformers >= 5.21's module names of the thinker's parts -> 5.17-5.20's (Qwen3OmniThinkerFamily.renamer)
_TOP_LEVEL = (("model.language_model.", "model."), ("model.visual.", "visual."), ("model.audio_tower.", "audio_tower."))


class Qwen3OmniThinkerFamily(FamilyBase, SupportsMultiModal, HasKeyLayouts, LoadsInt4Itself, HasSyntheticShapes):
    """The Qwen3-Omni-MoE family, run as its thinker (see the module docstring)."""

    name = "qwen3_omni_thinker"
    title = "Qwen3-Omni-MoE"
    model_types = (OMNI_FULL, OMNI_THINKER)
    modeling_modules = ("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",)
    towers = {"vision": "visual", "audio": "audio_tower"}

    def check_config(self, root: Path, config: dict[str, Any]) -> None:
        """A config.json without its text decoder's config is refused before any model is built (else
        transformers fills in the 30B defaults and the load fails only after building them, naming tensors)."""
        model_type = config.get("model_type")
        if model_type == OMNI_FULL:
            where, text = "thinker_config.text_config", (config.get("thinker_config") or {}).get("text_config")
        else:
            where, text = "text_config", config.get("text_config")
        if not isinstance(text, dict) or not text:
            raise LoadError(f"{root}/config.json: model_type {model_type} without {where}; a Qwen3-Omni-MoE "
                            "checkpoint's config must describe its thinker's text decoder (restore the checkpoint's "
                            "own config.json)")

    # -- key layouts ----------------------------------------------------------------------------------------
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

    def renamer(self, config: dict[str, Any], model: nn.Module) -> Rename:
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

    # -- loading --------------------------------------------------------------------------------------------
    def model_class(self) -> type:
        from transformers import (  # lazy: transformers is imported in the child only
            Qwen3OmniMoeThinkerForConditionalGeneration,
        )

        return Qwen3OmniMoeThinkerForConditionalGeneration

    def standalone_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The thinker's own config.json (`qwen3_omni_moe_thinker`) of a full or a thinker-only config."""
        thinker = dict(config["thinker_config"]) if config.get("model_type") == OMNI_FULL else dict(config)
        thinker.pop("quantization_config", None)
        thinker.update(model_type=OMNI_THINKER, architectures=["Qwen3OmniMoeThinkerForConditionalGeneration"])
        thinker.setdefault("dtype", config.get("dtype") or config.get("torch_dtype") or "bfloat16")
        return thinker

    def build_meta(self, path: str | Path, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
        """The thinker on the meta device (no weights made); rotary and sinusoid buffers stay fp32 as
        transformers builds them (`_from_config(dtype=)`, not `.to(dtype)`)."""
        import torch
        from transformers import AutoConfig  # lazy: transformers is imported in the child only

        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        thinker = config.thinker_config if config.model_type == OMNI_FULL else config
        if hasattr(thinker, "quantization_config"):
            delattr(thinker, "quantization_config")
        with torch.device("meta"):
            return self.model_class()._from_config(thinker, dtype=dtype)

    def meta_model(self, root: Path, dtype: torch.dtype, trust_remote_code: bool = False) -> tuple[nn.Module, Rename]:
        from quantbench.models.checkpoint import read_config

        config = read_config(root)  # first: a missing or broken config.json is named as such
        model = self.build_meta(root, dtype, trust_remote_code)
        return model, self.renamer(config, model)

    def load(self, path: str | Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False) -> nn.Module:
        """The thinker in `dtype`, every tensor from the checkpoint (models/strict.py) or a LoadError. Per-expert
        tensors are stacked into transformers' fused experts (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]),
        so transformers' experts kernels (grouped_mm, eager) and quantbench's engine all run them."""
        from torch import nn

        from quantbench.models.strict import Checkpoint, finish, stacked_experts

        root = Path(path)
        model, rename = self.meta_model(root, dtype, trust_remote_code)
        ck = Checkpoint(root, device, rename=rename)
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
        from torch import nn

        from quantbench.engine.moe.engine import ExpertsBase, install_grouped_moe
        from quantbench.engine.moe.int4 import regroup_experts
        from quantbench.models.checkpoint import read_config
        from quantbench.models.strict import Checkpoint, finish

        root = Path(path)
        config = read_config(root)
        group_size = int((config.get("quantization_config") or {}).get("group_size", 128))
        model, rename = self.meta_model(root, dtype, trust_remote_code)
        ck = Checkpoint(root, device, rename=rename)
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
        from quantbench.models.checkpoint import load_causal_lm

        with _per_expert_init():
            return load_causal_lm(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                                  model_class=self.model_class())

    def load_for_calibration(self, source: Path, device: str) -> nn.Module:
        """The thinker as quantbench's loader reads it (full or thinker-only, any key layout; the talker and
        code2wav never read), on the `eager` experts path."""
        import torch

        model = self.load(source, torch.bfloat16, device)
        model.set_experts_implementation("eager")
        # a full checkpoint's thinker config names no class; the export writes it, and ModelOpt reads it
        model.config.architectures = model.config.architectures or [type(model).__name__]
        return model.eval()

    # -- the MoE blocks -------------------------------------------------------------------------------------
    def text_root(self, model: nn.Module) -> nn.Module:
        """The text decoder (embeddings, layers, norm): where MoE blocks, fused ops and CUDA graphs apply."""
        inner = model.model
        return inner.language_model if hasattr(inner, "language_model") else inner

    def moe_layout(self, model: nn.Module) -> MoeLayout:
        from quantbench.engine.moe.engine import MoEBlockRef, MoeLayout

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

    # -- media ----------------------------------------------------------------------------------------------
    def decision_engine(self, model: nn.Module, tokenizer: Any, spec: Any, checkpoint: str | Path | None) -> Any:
        """OmniEngine with the checkpoint's media processor (a synthetic thinker: the settings it carries; none:
        it reads text only, through TransformersEngine)."""
        from quantbench.models.families.qwen3_omni.engine import OmniEngine
        from quantbench.models.families.qwen3_omni.processor import processor_from_settings

        if checkpoint is None:  # a synthetic thinker (--shape) carries its processor settings; none: text only
            settings = getattr(model, "quantbench_processor_settings", None)
            if settings is None:
                return super().decision_engine(model, tokenizer, spec, checkpoint)
            media = processor_from_settings(settings, tokenizer, model, "synthetic model")
            return OmniEngine.for_spec(model, tokenizer, spec, media=media)
        return OmniEngine.for_spec(model, tokenizer, spec, media=self.media_processor(checkpoint, tokenizer, model))

    def media_processor(self, checkpoint: str | Path, tokenizer: Any, model: Any) -> Any:
        from quantbench.models.families.qwen3_omni.processor import omni_processor

        return omni_processor(checkpoint, tokenizer, model)

    def media_engine(self, model: Any, tokenizer: Any, **settings: Any) -> Any:
        from quantbench.models.families.qwen3_omni.engine import OmniEngine

        return OmniEngine(model, tokenizer, **settings)

    def media_inputs(self, media: dict[str, Any], device: Any, dtype: Any) -> dict[str, Any]:
        from quantbench.models.families.qwen3_omni.media_batch import join_media

        return join_media([media], device, dtype)

    # -- the real shape, random weights ---------------------------------------------------------------------
    @property
    def synthetic_shapes(self) -> dict[str, dict[str, Any]]:  # read anew: synthetic.OMNI_SHAPES is the registry
        """Each real shape's text decoder dims (what --layers and the names read); the whole thinker (vocab 152064,
        3-D rope, the vision and audio towers) is synthetic.py's."""
        return {name: dims["text"] for name, dims in OMNI_SHAPES.items()}

    def synthetic_config(self, shape: str, layers: int | None) -> tuple[Any, Any]:
        from quantbench.models.families.qwen3_omni.synthetic import omni_tokenizer, thinker_config

        tokenizer = omni_tokenizer()
        return thinker_config(shape, layers, tokenizer.pad_token_id, tokenizer.eos_token_id), tokenizer

    def synthetic_meta(self, config: Any, dtype: torch.dtype) -> nn.Module:
        from quantbench.models.families.qwen3_omni.synthetic import meta_thinker

        return meta_thinker(config, dtype)

    def synthetic_buffers(self, model: nn.Module, device: Any) -> None:
        from quantbench.models.families.qwen3_omni.synthetic import new_buffers

        new_buffers(model, device)

    def synthetic_marks(self) -> dict[str, Any]:
        """The processor settings decision_engine builds the media processor from (no checkpoint files)."""
        from quantbench.models.families.qwen3_omni.synthetic import processor_settings

        return {"quantbench_processor_settings": processor_settings()}

    def synthetic_files(self) -> dict[str, str]:
        """The processor file a real Omni checkpoint ships: media reads from a saved one as from that one."""
        from quantbench.models.families.qwen3_omni.synthetic import preprocessor_json

        return {"preprocessor_config.json": preprocessor_json()}


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
    # a GPTQ export's g_idx: read (regroup_experts refuses any but input order), never left over
    g_idx = {"g_idx": ck.take(f"{name}.g_idx")} if f"{name}.g_idx" in ck else {}
    return SimpleNamespace(qweight=qweight, qzeros=ck.take(f"{name}.qzeros", what), scales=ck.take(f"{name}.scales", what),
                           bits=4, group_size=group_size, infeatures=qweight.shape[0] * 8, outfeatures=qweight.shape[1],
                           **g_idx)
