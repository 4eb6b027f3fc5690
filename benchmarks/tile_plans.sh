#!/usr/bin/env bash
# One device call: the Gluon kernels' tile plans (benchmarks/tile_plans.py) on the real-shape model's routing,
# checked against the committed code's own outputs, an ncu profile of the default INT4 kernels, and the whole
# 48-layer model through `quantbench run` with the fastest INT4 plan and with the default, on the same machine.
#
#   bash benchmarks/tile_plans.sh OUT [COMMITTED_TREE] [SECONDS]
#
# COMMITTED_TREE: a copy of the code before the change (quantbench/ and benchmarks/, with this tile_plans.py):
# its default plan's outputs are the reference every plan's bits are held to. SECONDS (400): the call's budget;
# the later parts run only while enough of it is left. Needs quantbench importable with its dependencies
# (PYTHONPATH=$PWD and shared/device's wheels, see its README). Writes at most 8 files into OUT.
set -u
out=${1:?usage: tile_plans.sh OUT [COMMITTED_TREE] [SECONDS]}
orig=${2:-}
budget=${3:-400}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
left() { echo $((budget - SECONDS)); }
log() { echo "[$SECONDS s] $*" | tee -a "$out/calls.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv >> "$out/calls.log" 2>&1
ref=()
if [[ -n $orig ]]; then
  log "reference digests from the committed code ($orig)"
  (cd "$orig" && PYTHONPATH=$PWD:${PYTHONPATH:-} timeout 150 python3 benchmarks/tile_plans.py --save-ref /tmp/tile_ref.json) \
    >> "$out/calls.log" 2>&1 && ref=(--ref /tmp/tile_ref.json)
fi
log "plans"
timeout $(($(left) - 130)) python3 "$here/tile_plans.py" --out "$out" --warm 8 "${ref[@]}" > "$out/plans.log" 2>&1
tail -n 30 "$out/plans.log"
if (($(left) > 100)); then
  log "ncu: the default INT4 kernels, one layer of the decision"
  timeout 80 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 "$here/tile_plans.py" --profile one-size --formats int4 --layers 4 > "$out/ncu.txt" 2>&1
  grep -E "int4_wgmma_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occ|Issue Slots Busy|Warp Cycles Per Issued" "$out/ncu.txt" | head -n 30
fi
if [[ -f $out/best.json ]] && (($(left) > 60)); then
  # the backends' entry points (`--backend int4`), as shared/device's README says
  (cd "$here/.." && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1)
  python3 "$here/long_suite.py" --tokens 512 --n 16 --out /tmp/suite-512.jsonl > /dev/null
  tiles=$(python3 -c "import json; b = json.load(open('$out/best.json')); print(json.dumps({'int4': b['int4']['tiles']}, separators=(',', ':')))")
  for plan in best default; do
    (($(left) > 50)) || break
    log "quantbench run int4, $plan plan: $tiles"
    env $([[ $plan == best ]] && echo "QUANTBENCH_WGMMA_TILES=$tiles") timeout $(($(left) - 5)) python3 -m quantbench run \
      --gpu hopper --db "$out/runs.duckdb" --backend int4 --shape qwen3-30b-a3b --suite /tmp/suite-512.jsonl \
      --warmup 2 --latency-min-decisions 16 --latency-min-seconds 1 2>&1 | grep -E "│|Error|error" | tail -n 4 \
      | tee -a "$out/calls.log"
  done
fi
log "done"
