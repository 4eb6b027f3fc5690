"""quantbench's grouped-MoE engine and its weight formats (see quantbench.engine.moe.engine for the contract)."""

from quantbench.engine.moe.engine import (
    DenseExperts,
    ExpertWeights,
    GroupedMoE,
    MoeLayout,
    experts_nbytes,
    install_grouped_moe,
    kernel_paths,
    route,
)

__all__ = [
    "DenseExperts",
    "ExpertWeights",
    "GroupedMoE",
    "experts_nbytes",
    "install_grouped_moe",
    "MoeLayout",
    "kernel_paths",
    "route",
]
