#!/usr/bin/env bash
# What the SM waits on in the committed batch-1 expert kernels (issue #34 item 5): ncu over one heavy layer's
# gate_up and down of the 512-token decision (benchmarks/tile_plans.py --profile, the model's own routing), with
# every warp-stall reason per issued instruction beside issue-slot use, occupancy, registers and DRAM throughput.
#
#   bash benchmarks/kernel_stalls.sh OUT [FORMATS]        # FORMATS: "int4 nvfp4" (default)
#
# Writes OUT/ncu-FORMAT.csv (ncu --csv --page raw) and prints a table per format (benchmarks/kernel_stalls.py).
# Needs quantbench importable with shared/device's wheels (as benchmarks/tile_probe.sh) and ncu on PATH.
set -u
out=${1:?usage: kernel_stalls.sh OUT [FORMATS]}
formats=${2:-int4 nvfp4}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
# the stall metrics this ncu knows, by name (their set differs between ncu versions)
stalls=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' \
  | grep -E '^smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active$' | sed 's/$/.ratio/' | paste -sd, -)
base="gpu__time_duration.sum,launch__registers_per_thread,launch__occupancy_limit_registers"
base+=",launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active"
base+=",smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
base+=",smsp__inst_executed.sum"
for fmt in $formats; do
  timeout 150 ncu --clock-control none --profile-from-start off --csv --page raw --metrics "$base${stalls:+,$stalls}" \
    python3 "$here/tile_plans.py" --profile default --formats "$fmt" --layers 4 > "$out/ncu-$fmt.csv" 2> "$out/ncu-$fmt.err"
  echo "== $fmt (ncu exit $?)"
  python3 "$here/kernel_stalls.py" "$out/ncu-$fmt.csv" || tail -n 5 "$out/ncu-$fmt.err"
done
