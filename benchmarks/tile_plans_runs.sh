#!/usr/bin/env bash
# The committed tile plans through `quantbench run`, one device call (after benchmarks/tile_plans.sh chose them):
#   1. answers: the fixture's INT4 variant with the committed kernels, with the tiles before 2026-12-03
#      (QUANTBENCH_WGMMA_TILES) and through auto-round's own per-expert loop (--no-fast-moe); `quantbench compare`
#      of the first against the other two (top-answer agreement, total variation);
#   2. speed and energy at the Qwen3-30B-A3B shape (random weights): INT4 one 512-token decision at a time and 8
#      per forward pass, each over a timed phase of at least PHASE_S seconds (NVML's energy counter over it), NVFP4
#      packed, and INT4 / NVFP4 with the previous tiles on the same machine.
#
#   bash benchmarks/tile_plans_runs.sh OUT [SECONDS]      # then: quantbench merge OUT/runs.duckdb
#
# Needs quantbench installed or on PYTHONPATH with its dependencies (shared/device's wheels, `pip install -e .` for
# the backends' entry points) and the fixture in $QUANTBENCH_CACHE. Parts run only while SECONDS (380) last.
set -u
out=${1:?usage: tile_plans_runs.sh OUT [SECONDS]}
budget=${2:-380}
phase=${PHASE_S:-12}
here=$(cd "$(dirname "$0")" && pwd)
db="$out/runs.duckdb"
mkdir -p "$out"
left() { echo $((budget - SECONDS)); }
# the tiles before 2026-12-03: one tile size, partial sums per block (int4_kernels / nvfp4 WGMMA_TILES then)
before='{"int4":{"mid":{"AHEAD":2,"SCALED":0,"SMALL_M":0,"MID_M":0},"large":{"AHEAD":2,"SCALED":0,"SMALL_M":0,"MID_M":0}},'
before+='"nvfp4":{"mid":{"SMALL_M":0,"MID_M":0}}}'
qb() {  # quantbench run ARGS; prints its row and keeps its run id in $run
  local t=$SECONDS line
  line=$(timeout $(($(left) > 20 ? $(left) - 5 : 15)) python3 -m quantbench run --gpu hopper --db "$db" "$@" 2>&1 \
    | grep -E "│|Error|error" | tail -n 3)
  echo "$line" | tee -a "$out/runs.log"
  run=$(echo "$line" | grep -oE "[0-9a-f]{8}-[0-9a-f]{4}" | head -n 1)
  echo "    ($((SECONDS - t)) s: $*)" | tee -a "$out/runs.log"
}
compare() {
  python3 -m quantbench compare "$1" --reference "$2" --db "$db" 2>&1 | tail -n 25 | tee -a "$out/runs.log"
}
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee -a "$out/runs.log"
python3 "$here/long_suite.py" --tokens 512 --n 16 --out "$out/suite-512.jsonl" > /dev/null
shape="--shape qwen3-30b-a3b --suite $out/suite-512.jsonl --warmup 2 --latency-min-decisions 16"

echo "== 1. answers: the fixture" | tee -a "$out/runs.log"
qb --backend int4; new=$run
QUANTBENCH_WGMMA_TILES=$before qb --backend int4; old=$run
qb --backend int4 --no-fast-moe; loop=$run
[[ -n $new && -n $old ]] && compare "$new" "$old"
[[ -n $new && -n $loop ]] && compare "$new" "$loop"

echo "== 2. the 30B shape" | tee -a "$out/runs.log"
qb --backend int4 $shape --latency-min-seconds "$phase"
(($(left) > 60)) && qb --backend nvfp4 --nvfp4 packed $shape --latency-min-seconds 1
(($(left) > 70)) && qb --backend int4 $shape --latency-min-seconds "$phase" --concurrency 8
(($(left) > 45)) && QUANTBENCH_WGMMA_TILES=$before qb --backend int4 $shape --latency-min-seconds 1
(($(left) > 45)) && QUANTBENCH_WGMMA_TILES=$before qb --backend nvfp4 --nvfp4 packed $shape --latency-min-seconds 1
echo "[$SECONDS s] done" | tee -a "$out/runs.log"
