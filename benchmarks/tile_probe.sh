#!/usr/bin/env bash
# One device call: candidate Gluon tiles of FORMAT (int4, the default, or nvfp4) against the committed ones, at a 512-token decision (the mid
# bucket) and at 16 decisions a pass (the large bucket), from the kernels alone to `quantbench run` at 48 layers.
#
#   [FORMAT=nvfp4] B1_PLANS=... B16_PLANS=... NCU_PLANS=... B1_TILES=JSON B16_TILES=JSON bash benchmarks/tile_probe.sh OUT [SECONDS]
#
# 1. tile_plans.py --plans $B1_PLANS (8 layers, the model's routing, outputs NaN-poisoned, bits against the
#    committed plan; its plans replace the mid and large buckets' tiles, so batch 8 runs them too);
# 2. batch_tiles.py --batches 16 --plans $B16_PLANS (the large bucket's candidates);
# 3. ncu of one layer's batch-1 kernels per plan of $NCU_PLANS ("default": the committed tiles);
# 4. `quantbench run` at the 30B shape, 48 layers, committed tiles and then QUANTBENCH_WGMMA_TILES=$B1_TILES (one
#    decision a forward) / $B16_TILES (16 a pass); either left empty is skipped. Those runs are not for merging:
#    a row's kernel string does not name every tile key.
# The 2026-12-04 calls (docs/BENCHMARKS.md):
#   B1_PLANS="scaled-a1+mixed16/32,scaled-a1+mixed16/32+n64,scaled-a1+mixed16/32+m128n64" \
#   B16_PLANS=current,m128-n64,m64-n64 NCU_PLANS="default scaled-a1+mixed16/32+n64" \
#   B1_TILES='{"int4":{"mid":{"BLOCK_N":64}}}' B16_TILES='{"int4":{"large":{"BLOCK_N":64}}}' bash benchmarks/tile_probe.sh OUT
#   B1_PLANS="scaled-a1+mixed16/32,scaled-a1+mixed16/32+r128" B16_PLANS=current,m64-r128 \
#   NCU_PLANS="scaled-a1+mixed16/32+r128" B1_TILES='{"int4":{"mid":{"maxnreg":128}}}' \
#   B16_TILES='{"int4":{"large":{"BLOCK_M":64,"maxnreg":128}}}' bash benchmarks/tile_probe.sh OUT
#   FORMAT=nvfp4 B1_PLANS="mixed16/32,mixed16/32+drain" B1_TILES='{"nvfp4":{"mid":{"DRAIN":1}}}' \
#   bash benchmarks/tile_probe.sh OUT
#   FORMAT=nvfp4 B1_PLANS="mixed16/32+drain,mixed16/32+drain+ring2,mixed16/32+drain+ring4" \
#   B16_PLANS=current,drain,drain-ring2 NCU_PLANS="mixed16/32+drain+ring2" \
#   B1_TILES='{"nvfp4":{"mid":{"DRAIN":1,"RING":2}}}' bash benchmarks/tile_probe.sh OUT
# Needs quantbench importable with shared/device's wheels and `pip install -e .` (the backends' entry points).
set -u
out=${1:?usage: tile_probe.sh OUT [SECONDS]}
fmt=${FORMAT:-int4}
backend=(--backend int4)
[[ $fmt == nvfp4 ]] && backend=(--backend nvfp4 --nvfp4 packed)
budget=${2:-540}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
left() { echo $((budget - SECONDS)); }
log() { echo "[$SECONDS s] $*" | tee -a "$out/calls.log"; }
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv \
  >> "$out/calls.log" 2>&1
if [[ -n ${B1_PLANS:-} ]]; then
  log "plans at batch 1 (mid bucket): $B1_PLANS"
  timeout 200 python3 "$here/tile_plans.py" --out "$out/plans" --formats "$fmt" --layers 8 --warm 8 \
    --plans "$B1_PLANS" > "$out/plans.log" 2>&1
  grep -E "^\| " "$out/plans.log" | grep -vE "\| - \| - \|" | cut -c1-400
fi
if [[ -n ${B16_PLANS:-} ]]; then
  log "plans at batch 16 (large bucket): $B16_PLANS"
  timeout $(($(left) > 300 ? 160 : 100)) python3 "$here/batch_tiles.py" --out "$out/batch" --formats "$fmt" --layers 8 --batches 16 \
    --plans "$B16_PLANS" > "$out/batch.log" 2>&1
  tail -n 8 "$out/batch.log"
fi
for plan in ${NCU_PLANS:-}; do
  (($(left) > 200)) || break
  log "ncu: batch-1 kernels, plan $plan"
  file="$out/ncu-${plan//[+\/]/_}.txt"
  timeout 70 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 "$here/tile_plans.py" --profile "$plan" --formats "$fmt" --layers 4 > "$file" 2>&1
  grep -E "${fmt}_wgmma_kernel|Duration|Registers Per|Achieved Occ|Theoretical Occ|Issue Slots Busy|Warp Cycles Per Issued" \
    "$file" | head -n 20
done
python3 "$here/long_suite.py" --tokens 512 --n 16 --out /tmp/s16.jsonl > /dev/null
python3 "$here/long_suite.py" --tokens 512 --n 64 --out /tmp/s64.jsonl > /dev/null
qb() {  # label, tiles JSON ('' = committed), quantbench run args
  local label=$1 tiles=$2; shift 2
  (($(left) > 45)) || { log "skipped (time): $label"; return; }
  log "quantbench run: $label"
  env ${tiles:+QUANTBENCH_WGMMA_TILES=$tiles} timeout $(($(left) - 5)) python3 -m quantbench run --gpu hopper \
    --db "$out/runs.duckdb" "${backend[@]}" --shape qwen3-30b-a3b --warmup 2 --latency-min-decisions 16 "$@" 2>&1 \
    | grep -E "│|Error|error" | tail -n 2 | tee -a "$out/calls.log"
}
if [[ -n ${B1_TILES:-} ]]; then
  qb "b1 committed" "" --suite /tmp/s16.jsonl --latency-min-seconds 3
  qb "b1 $B1_TILES" "$B1_TILES" --suite /tmp/s16.jsonl --latency-min-seconds 3
fi
if [[ -n ${B16_TILES:-} ]]; then
  qb "b16 committed" "" --suite /tmp/s64.jsonl --latency-min-seconds 3 --concurrency 16
  qb "b16 $B16_TILES" "$B16_TILES" --suite /tmp/s64.jsonl --latency-min-seconds 3 --concurrency 16
fi
log "done"
