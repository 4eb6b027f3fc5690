"""Checkpoints made elsewhere, not through `quantbench quantize`: a tiny BF16 Qwen3-MoE `Tiny-MoE` saved by
transformers, its INT4 made by auto-round itself, its NVFP4 made by ModelOpt itself, an unrelated BF16 model
`other`, the INT4 again as auto-round's GPTQ export `int4-gptq` (`format="auto_gptq"`: quant_method gptq, a g_idx
per projection, attention quantized too), and two INT4 checkpoints auto-round made with some experts kept at 16
bits (its `layer_config`, written to the config's `extra_config` while `bits` still says 4): `int4-half` (layer 1's
experts) and `int4-bf16-experts` (every expert). Built once per test session in one child process (about 40 s on 2 cores): once auto_round is
imported it patches transformers' MoE blocks, so every model is loaded before it. Shared by tests/test_lineage.py
(pairing with a base) and tests/test_experts_claim.py (a variant is what it claims)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MAKE = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tests.tiny import save_tiny, tiny_model
    out = Path(sys.argv[1])
    save_tiny(out / "Tiny-MoE")
    tiny_model(seed=1, dtype=torch.bfloat16).save_pretrained(out / "other")
    src = out / "Tiny-MoE"
    tok = AutoTokenizer.from_pretrained(src)
    for_int4, for_nvfp4, for_half, for_bf16_experts, for_gptq = (
        AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16) for _ in range(5))
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    ids = tok(["State: Question: Answer: A B C yes no left right " * 4] * 2, return_tensors="pt").input_ids
    mtq.quantize(for_nvfp4, mtq.NVFP4_DEFAULT_CFG, lambda m: m(ids))
    export_hf_checkpoint(for_nvfp4, export_dir=str(out / "nvfp4"))
    tok.save_pretrained(out / "nvfp4")
    from auto_round import AutoRound
    text = "State: Question: Answer: A B C D E yes no left right forward wall player observation alpha beta " * 8
    common = dict(scheme="W4A16", iters=0, dataset=[text] * 4, nsamples=4, seqlen=32, group_size=32, disable_opt_rtn=True)
    AutoRound(for_int4, tok, **common).quantize_and_save(str(out / "int4"), format="auto_round")
    AutoRound(for_gptq, tok, **common).quantize_and_save(str(out / "int4-gptq"), format="auto_gptq")
    AutoRound(for_half, tok, layer_config={r"model.layers.1.mlp.experts": {"bits": 16}},
              **common).quantize_and_save(str(out / "int4-half"), format="auto_round")
    AutoRound(for_bf16_experts, tok, layer_config={r"mlp.experts": {"bits": 16}},
              **common).quantize_and_save(str(out / "int4-bf16-experts"), format="auto_round")
""")


def make(out: Path) -> dict[str, Path]:
    """Build them into `out`; returns their directories by name (auto-round writes into a subfolder)."""
    done = subprocess.run([sys.executable, "-c", MAKE, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    def made_by_autoround(name: str) -> Path:
        [path] = [p.parent for p in (out / name).rglob("config.json")]
        return path

    paths = {"bf16": out / "Tiny-MoE", "int4": made_by_autoround("int4"), "nvfp4": out / "nvfp4", "other": out / "other",
             "int4-gptq": made_by_autoround("int4-gptq"), "int4-half": made_by_autoround("int4-half"), "int4-bf16-experts": made_by_autoround("int4-bf16-experts")}
    assert not any((p / "quantbench_provenance.json").exists() for p in paths.values())
    return paths
