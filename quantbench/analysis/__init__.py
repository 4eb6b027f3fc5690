"""quantbench.analysis."""
