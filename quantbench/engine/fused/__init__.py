"""quantbench.engine.fused."""
