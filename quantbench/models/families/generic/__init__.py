"""Any other transformers causal LM with MoE blocks, found by their structure."""

from quantbench.models.families.generic.family import GenericMoeFamily

__all__ = ["GenericMoeFamily"]
