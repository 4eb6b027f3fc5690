"""quantbench.models."""
