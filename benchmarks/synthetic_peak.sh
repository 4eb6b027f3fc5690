#!/usr/bin/env bash
# Peak GPU memory of the synthetic INT4 variant built in memory layer by layer (issue #26 part 4): each layer's BF16
# experts are RTN-quantized and freed before the next layer's exist, so the peak should be the INT4 model (17.0 GiB
# of weights at 48 layers) plus one layer of BF16 experts (~1.1 GiB) and the run's activations, not the 71.8 GiB
# measured when the whole BF16 model was resident. Then, at LAYERS_DISK layers, the same variant built in memory
# against the same shape quantized to a checkpoint on disk and loaded with --model: the two peaks should be close.
#
#   bash benchmarks/synthetic_peak.sh OUT_DIR     # LAYERS=48 LAYERS_DISK=4 by default
#   quantbench merge OUT_DIR/peak.duckdb --db results.duckdb   # into the shipped results (no --db: your store)
#
# One GPU, no network. Needs quantbench importable (PYTHONPATH=$PWD).
set -u
out=${1:?usage: synthetic_peak.sh OUT_DIR}
mkdir -p "$out"
db="$out/peak.duckdb"
layers=${LAYERS:-48}
disk=${LAYERS_DISK:-4}
common="--gpu ${QB_GPU:-auto} --db $db --latency-min-decisions 8 --latency-min-seconds 0"
qb() {
  local t=$SECONDS
  timeout "${QB_TIMEOUT:-400}" python3 -m quantbench "$@" 2>&1 | grep -E "│|Error|error" | tail -n 3
  echo "    ($((SECONDS - t)) s: $*)"
}
qb run --backend int4 --shape qwen3-30b-a3b --layers "$layers" $common
qb run --backend int4 --shape qwen3-30b-a3b --layers "$disk" $common
qb quantize --shape qwen3-30b-a3b --layers "$disk" --scheme int4 --out "$out/int4-${disk}l"
qb run --backend int4 --model "$out/int4-${disk}l" $common
python3 - "$db" <<'PY'
import sys
import duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
rows = con.execute("""SELECT coalesce(model_id, backend), coalesce(weights, status), mem_weights_bytes, mem_peak_allocated_bytes, mem_peak_reserved_bytes,
                             mem_nvml_peak_bytes FROM runs ORDER BY created_at""").fetchall()
gib = lambda b: "-" if b is None else f"{b / 2**30:.2f}"
print(f"{'model':44} {'weights':10} {'weights GiB':>11} {'peak alloc':>10} {'peak rsvd':>9} {'nvml peak':>9}")
for model, kind, w, alloc, rsvd, nvml in rows:
    print(f"{model:44} {kind:10} {gib(w):>11} {gib(alloc):>10} {gib(rsvd):>9} {gib(nvml):>9}")
PY
