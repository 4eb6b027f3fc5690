#!/usr/bin/env bash
# Energy per decision on a real GPU (issue #26 part 3): BF16 (quantbench engine) and INT4 at the Qwen3-30B-A3B shape
# (random weights), one 512-token decision at a time and 8 per forward pass, each over a timed phase of at least
# PHASE_S seconds (NVML's energy counter is read at its two ends, never per decision); then one run whose phase is
# kept under 2 s, which must store NULL with its reason. Prints the stored energy columns and the report with cost.
#
#   bash benchmarks/energy_check.sh OUT_DIR          # LAYERS=48 PHASE_S=12 PRICE=3.5 by default
#   quantbench merge OUT_DIR/energy.duckdb --db results.duckdb   # into the shipped results (no --db: your store)
#
# One GPU, no network, about 4 minutes at 48 layers on an H200. Needs quantbench importable (PYTHONPATH=$PWD).
set -u
out=${1:?usage: energy_check.sh OUT_DIR}
mkdir -p "$out"
db="$out/energy.duckdb"
here=$(cd "$(dirname "$0")" && pwd)
layers=${LAYERS:-48}
phase=${PHASE_S:-12}
[ -f "$out/suite-512.jsonl" ] || python3 "$here/long_suite.py" --tokens 512 --n 16 --out "$out/suite-512.jsonl" >/dev/null
shape="--shape qwen3-30b-a3b --layers $layers --suite $out/suite-512.jsonl --warmup 2 --gpu ${QB_GPU:-auto}"
qb() {
  local t=$SECONDS
  timeout "${QB_TIMEOUT:-300}" python3 -m quantbench run "$@" 2>&1 | grep -E "│|Error|error" | tail -n 3
  echo "    ($((SECONDS - t)) s: $*)"
}
qb --backend bf16 --experts-impl quantbench $shape --db "$db" --latency-min-decisions 16 --latency-min-seconds "$phase"
qb --backend int4 $shape --db "$db" --latency-min-decisions 16 --latency-min-seconds "$phase"
qb --backend int4 $shape --db "$db" --latency-min-decisions 16 --latency-min-seconds "$phase" --concurrency 8
# The rule: a phase under 2 s stores no energy, and says why (16 decisions of ~12 ms and no repeats); a store of
# its own, so that the report's int4 row stays the measured one.
qb --backend int4 $shape --db "$out/short.duckdb" --latency-min-decisions 0 --latency-min-seconds 0
python3 -m quantbench report --db "$db" --price-per-gpu-hour "${PRICE:-3.5}"
for store in "$db" "$out/short.duckdb"; do
python3 -m quantbench report --db "$store" --format json --price-per-gpu-hour "${PRICE:-3.5}" | python3 -c '
import json, sys
cols = ("j_per_decision", "j_above_idle_per_decision", "mean_w", "idle_w", "energy_phase_s", "energy_decisions",
        "cost_per_million_decisions")
for rep in json.load(sys.stdin)["reports"]:
    for r in rep["rows"] + rep["throughput"]:
        print(r["variant"], "batch", r.get("batch", 1), r["run_id"][:13], {c: r[c] for c in cols},
              r["energy_note"] or "")
'
done
