"""What `quantbench quantize` checks of its source checkpoint before anything is removed or loaded, and how it reads
the source's tokenizer (never through the checkpoint's own code: quantize has no --trust-remote-code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError, LoadError
from quantbench.models.checkpoint import read_config


def check_source(source: Path, out: Path) -> None:
    """Refuse, before anything is removed or loaded, a --out that is --model's directory, holds it or lies inside
    it (--overwrite removed the source itself: the user's only copy of the model), a source that is quantized
    already (auto-round crashed with an AttributeError, compressed-tensors with an ImportError, ModelOpt's export
    loaded with UNEXPECTED keys), and one whose architecture exists only as the checkpoint's own code (quantize has
    no --trust-remote-code: transformers asked on stdin whether to run it, and ran it on a "y")."""
    src, dst = source.resolve(), out.resolve()
    if dst == src or dst in src.parents or src in dst.parents:
        where = "is" if dst == src else "holds" if dst in src.parents else "lies inside"
        raise ConfigError(f"--out {out} {where} the source checkpoint --model {source}; give a new directory outside "
                          "it (--overwrite would remove the source, and a variant inside it would change its hash)")
    config = read_config(source)
    from quantbench.models.layout import HF_QUANT_CONFIG

    qc = config.get("quantization_config")
    if qc or (source / HF_QUANT_CONFIG).is_file():
        what = (f"config.json quantization_config (quant_method {qc.get('quant_method')!r})" if isinstance(qc, dict)
                else "config.json quantization_config" if qc else HF_QUANT_CONFIG)
        raise LoadError(f"--model {source}: already quantized ({what}); quantize the BF16 checkpoint it was made "
                        "from (a variant is run as it is: `quantbench run --backend int4|nvfp4|fp8 --model DIR`)")
    model_type = config.get("model_type")
    if config.get("auto_map"):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if model_type not in CONFIG_MAPPING:
            raise LoadError(f"{source / 'config.json'}: model_type {model_type!r} is not built into transformers and "
                            "its auto_map names the checkpoint's own Python code, which `quantbench quantize` never "
                            "runs; quantize a checkpoint of an architecture transformers has")


def source_tokenizer(source: Path) -> Any:
    """The source checkpoint's tokenizer, never from the checkpoint's own code (quantize has no
    --trust-remote-code): transformers otherwise asks on stdin, where a "y" ran it."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise LoadError(f"{source}: its tokenizer is the checkpoint's own Python code (tokenizer_config.json "
                        "auto_map), which `quantbench quantize` never runs; give a checkpoint whose tokenizer "
                        "transformers has (tokenizer.json)") from None
