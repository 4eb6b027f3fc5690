"""The Qwen3-Omni-MoE family."""
