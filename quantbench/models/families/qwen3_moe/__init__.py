"""The Qwen3-MoE family: the embedded default model and Qwen3-30B-A3B (and its real shape, `--shape qwen3-30b-a3b`)."""

from quantbench.models.families.qwen3_moe.family import Qwen3MoeFamily

__all__ = ["Qwen3MoeFamily"]
