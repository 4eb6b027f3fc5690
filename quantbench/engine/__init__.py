"""quantbench.engine."""
