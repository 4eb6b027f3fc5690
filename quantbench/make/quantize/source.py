"""What `quantbench quantize` checks of its source checkpoint before anything is removed or loaded, and how it reads
the source's tokenizer (never through the checkpoint's own code: quantize has no --trust-remote-code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantbench.errors import ConfigError, LoadError
from quantbench.models.checkpoint import (
    check_safetensors_header,
    check_tokenizer_json,
    load_tokenizer,
    read_config,
    refuse_code_only_architecture,
)


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
    check_tokenizer_json(source)  # read by the library's child: a bad file there was a traceback in its log
    from quantbench.models.layout import HF_QUANT_CONFIG

    qc = config.get("quantization_config")
    if qc or (source / HF_QUANT_CONFIG).is_file():
        what = (f"config.json quantization_config (quant_method {qc.get('quant_method')!r})" if isinstance(qc, dict)
                else "config.json quantization_config" if qc else HF_QUANT_CONFIG)
        raise LoadError(f"--model {source}: already quantized ({what}); quantize the BF16 checkpoint it was made "
                        "from (a variant is run as it is: `quantbench run --backend int4|nvfp4|fp8 --model DIR`)")
    _refuse_other_than_bf16(source)
    refuse_code_only_architecture(source, config, ", which `quantbench quantize` never runs; quantize a checkpoint "
                                  "of an architecture transformers has")


FLOAT_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "BF16": "bfloat16"}  # safetensors' names


def _refuse_other_than_bf16(source: Path) -> None:
    """Refuse a source whose non-expert weights are not bfloat16 (a float16 or float32 checkpoint): the libraries
    load it in bfloat16, so its variant's embeddings, norms and router were not the source's, and quantizing failed
    only after calibration, at the byte-identical check, saying the quantizer had changed them."""
    from quantbench.make.quantize.unchanged import non_expert_tensors  # lazy: reads the family registry

    try:
        for file in source.glob("*.safetensors"):
            check_safetensors_header(file)
    except LoadError:
        return  # a damaged file: the load names it
    other = [t for t in non_expert_tensors(source).values() if t.dtype in FLOAT_DTYPES and t.dtype != "BF16"]
    if other:
        kinds = sorted({FLOAT_DTYPES[t.dtype] for t in other})
        raise LoadError(f"--model {source}: its weights are {' and '.join(kinds)} ({other[0].file.name}: "
                        f"{other[0].key} and {len(other) - 1} more non-expert tensors), not bfloat16; `quantbench "
                        "quantize` makes variants of a BF16 checkpoint and keeps every non-expert tensor byte for "
                        "byte: save the model in bfloat16 first (transformers: from_pretrained(dtype=torch.bfloat16)"
                        ".save_pretrained(DIR))")


def source_tokenizer(source: Path) -> Any:
    """The source checkpoint's tokenizer, never from the checkpoint's own code (quantize has no
    --trust-remote-code): transformers otherwise asks on stdin, where a "y" ran it."""
    try:
        return load_tokenizer(source)
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise LoadError(f"{source}: its tokenizer is the checkpoint's own Python code (tokenizer_config.json "
                        "auto_map), which `quantbench quantize` never runs; give a checkpoint whose tokenizer "
                        "transformers has (tokenizer.json)") from None
