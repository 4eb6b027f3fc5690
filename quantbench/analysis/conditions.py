"""The conditions a row was measured under, and how far it is from what its GPU could do at best:

- **busy**: a run timed while other processes used the machine (quantbench.run.machine.LoadProbe) is slower than
  the same run on an idle one; the report and the dashboard say so beside its figures.
- **floors**: one decision has to read the weights at least once, so on a GPU its latency is at least
  weight bytes ÷ the memory bandwidth of the GPU's spec sheet, and its energy at least that time at the board's
  power (TDP) of the same sheet — the energy of running at the bandwidth floor at full power. Each row shows its
  figures against them as a fraction (floor ÷ measured: 1.0 is at the floor). Assumes every weight is read once
  per decision, as at the 512-token decisions of the real shapes, where every expert is hit.
- **peak host memory**: only a run's own peak (`host_rss_peak_source` vmhwm | sampled) is shown; an older run's
  stored figure is ru_maxrss, which a child inherits from the process that launched it, so it reads "—".
"""

from __future__ import annotations

from dataclasses import dataclass

from quantbench.store.records import StoredRun

BUSY_OTHERS = 0.25  # other processes used at least a quarter of all CPU time during the timed phase
BUSY_STEAL = 0.05  # or the hypervisor gave at least 5% of it to other guests


def busy_note(run: StoredRun) -> str | None:
    """Why this run's machine was busy while it was timed, or None (idle, or not recorded: an older run)."""
    others, steal, load, cores = run.cpu_others_share, run.cpu_steal_share, run.load_avg_1m, run.cpu_cores
    reasons = []
    if others is not None and others >= BUSY_OTHERS:
        reasons.append(f"other processes used {others:.0%} of the CPUs")
    if steal is not None and steal >= BUSY_STEAL:
        reasons.append(f"the hypervisor took {steal:.0%} (steal)")
    if others is None and steal is None and load is not None and cores and load > cores:
        reasons.append(f"load average {load:.1f} on {cores:.0f} CPUs")
    if not reasons:
        return None
    context = f"; load average {load:.1f}" + (f" on {cores:.0f} CPUs" if cores else "") if load is not None else ""
    return "busy machine during the timed phase: " + ", ".join(reasons) + context


@dataclass(frozen=True)
class GpuSpec:
    bandwidth_bytes_s: float
    board_w: float
    source: str  # the spec sheet's words


# NVML names, most specific first (a name matches the first entry it contains). Figures from NVIDIA's datasheets.
GPU_SPECS: list[tuple[str, GpuSpec]] = [
    ("H200 NVL", GpuSpec(4.8e12, 600, "NVIDIA H200 NVL datasheet: 4.8 TB/s HBM3e, up to 600 W")),
    ("H200", GpuSpec(4.8e12, 700, "NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e, up to 700 W")),
    ("H100 NVL", GpuSpec(3.9e12, 400, "NVIDIA H100 NVL datasheet: 3.9 TB/s, up to 400 W")),
    ("H100 PCIe", GpuSpec(2.0e12, 350, "NVIDIA H100 PCIe datasheet: 2.0 TB/s, up to 350 W")),
    ("H100", GpuSpec(3.35e12, 700, "NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, up to 700 W")),
    ("B200", GpuSpec(8.0e12, 1000, "NVIDIA HGX B200 datasheet: 8 TB/s HBM3e, up to 1,000 W per GPU")),
    ("RTX PRO 6000 Blackwell Workstation", GpuSpec(1.792e12, 600, "NVIDIA RTX PRO 6000 Blackwell Workstation "
                                                   "Edition datasheet: 1,792 GB/s GDDR7, 600 W")),
    ("A100-SXM4-80GB", GpuSpec(2.039e12, 400, "NVIDIA A100 80GB SXM datasheet: 2,039 GB/s, 400 W")),
    ("A100 80GB PCIe", GpuSpec(1.935e12, 300, "NVIDIA A100 80GB PCIe datasheet: 1,935 GB/s, 300 W")),
    ("L40S", GpuSpec(8.64e11, 350, "NVIDIA L40S datasheet: 864 GB/s GDDR6, 350 W")),
    ("L4", GpuSpec(3.0e11, 72, "NVIDIA L4 datasheet: 300 GB/s GDDR6, 72 W")),
    ("RTX 4090", GpuSpec(1.008e12, 450, "GeForce RTX 4090 specifications: 1,008 GB/s GDDR6X, 450 W")),
    ("RTX 5090", GpuSpec(1.792e12, 575, "GeForce RTX 5090 specifications: 1,792 GB/s GDDR7, 575 W")),
]


def gpu_spec(gpu_name: str | None) -> GpuSpec | None:
    name = str(gpu_name or "")
    return next((spec for key, spec in GPU_SPECS if key in name), None)


@dataclass(frozen=True)
class Floors:
    """A GPU row's figures against its spec-sheet floors; a fraction is floor ÷ measured (None: not measured)."""

    spec: GpuSpec
    weights_bytes: int
    latency_floor_ms: float
    energy_floor_j: float
    latency_fraction: float | None
    energy_fraction: float | None

    def text(self) -> str:
        def frac(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"

        floor_ms = self.latency_floor_ms
        time = f"{floor_ms:.2f} ms" if floor_ms >= 0.1 else f"{1e3 * floor_ms:.2g} µs"
        joules = f"{self.energy_floor_j:.2f} J" if self.energy_floor_j >= 0.1 else f"{1e3 * self.energy_floor_j:.2g} mJ"
        return (f"latency {frac(self.latency_fraction)} of floor ({time}); energy {frac(self.energy_fraction)} of "
                f"floor ({joules})")


def floors(run: StoredRun, weights_bytes: int | None, p50_ms: float | None,
           j_per_decision: float | None) -> Floors | None:
    """The floors of a GPU run whose GPU has a spec-sheet entry and whose weights in VRAM are known."""
    if run.is_cpu or not weights_bytes:
        return None
    spec = gpu_spec(run.gpu_name)
    if spec is None:
        return None
    floor_s = weights_bytes / spec.bandwidth_bytes_s
    energy_j = floor_s * spec.board_w
    return Floors(spec, int(weights_bytes), 1e3 * floor_s, energy_j,
                  None if not p50_ms else 1e3 * floor_s / p50_ms,
                  None if not j_per_decision else energy_j / j_per_decision)


def floors_note(specs: list[GpuSpec]) -> str:
    sheets = "; ".join(sorted({s.source for s in specs}))
    return ("Floors: a decision reads every weight at least once, so its latency is at least the weights in VRAM ÷ "
            "the spec sheet's memory bandwidth, and its energy at least that time at the board's full power; the "
            "fractions are floor ÷ measured (1.00 = at the floor). It assumes every weight is read once a decision, "
            "as at 512-token decisions where every expert is hit: above 1.00, the decisions read less (short prompts "
            f"route to some experts only). Spec sheets: {sheets}.")

