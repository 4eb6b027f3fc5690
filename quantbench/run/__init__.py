"""quantbench.run."""
