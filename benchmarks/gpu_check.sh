#!/usr/bin/env bash
# The GPU check: run it before any change to GPU code lands (engine/, backends/, the server, the omni path). One
# GPU, about 6 minutes on an H200, everything through quantbench's own commands at the real shapes (random weights:
# speed, memory, energy; never quality):
#   1. a 512-token text decision per variant at the Qwen3-30B-A3B shape (48 layers), batch 1: BF16 (quantbench's
#      engine), INT4, NVFP4 packed, FP8; p50 per decision and J per decision (NVML over a >= 4 s phase);
#   2. the media decisions of the Qwen3-Omni-30B-A3B thinker (48 layers): INT4 text / image / audio / video and
#      NVFP4 packed image, end to end (prepare + forward), and whether the media decoder ran from CUDA graphs;
#   3. `quantbench serve` of INT4 at the 30B shape under `quantbench load`, 1, 8 and 32 clients (32: past
#      saturation, the peak decisions/s of full batches of 16); then the INT4
#      Qwen3-Omni thinker served under a load of mixed text and picture decisions (half of them with a 448 x 448
#      picture: benchmarks/mixed_suite.py), 1 and 8 clients;
#   4. every figure beside the newest stored row of the same measurement on this GPU (benchmarks/gpu_check.py),
#      with the ratio, and a loud list of what is more than 5% worse (exit status 1).
#
#   bash benchmarks/gpu_check.sh OUT_DIR          # then, where results.duckdb is kept:
#   quantbench merge OUT_DIR/gpu_check.duckdb     # the rows the figures came from
#
# PARTS="text media serve mixed" by default; STORED=results.duckdb (the store to compare with); LAYERS=48 (LAYERS=1
# DEVICE=cpu: a smoke test of this script on a CPU, whose figures compare with nothing). Needs quantbench
# importable (PYTHONPATH=$PWD) and, on the H200 image, the wheels of ../shared/device (pydantic, duckdb, fastapi ...).
set -u
out=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$out"
db="$out/gpu_check.duckdb"
here=$(cd "$(dirname "$0")" && pwd)
parts=${PARTS:-text media serve mixed}
layers="--layers ${LAYERS:-48}"
device=${DEVICE:+--device $DEVICE}
start=$SECONDS
step() { echo "== $1 ($((SECONDS - start)) s into the check)"; }
tokens=${TOKENS:-512}
python3 "$here/long_suite.py" --tokens "$tokens" --n 16 --out "$out/suite-$tokens.jsonl" >/dev/null
python3 "$here/long_suite.py" --tokens "$tokens" --n 64 --out "$out/s$tokens.jsonl" >/dev/null
limit=${LIMIT_S:-180}

if [[ " $parts " == *" text "* ]]; then
  step "text decisions, 30B shape, batch 1"
  shape="--shape qwen3-30b-a3b $layers $device --suite $out/suite-$tokens.jsonl --warmup 2 --latency-min-decisions 16 --latency-min-seconds 4"
  for variant in "--backend bf16" "--backend int4" "--backend nvfp4 --nvfp4 packed" "--backend fp8"; do
    t=$SECONDS
    # shellcheck disable=SC2086  # the variant's flags, one word each
    timeout "$limit" python3 -m quantbench run $variant $shape --db "$db" > "$out/run.log" 2>&1
    echo "   $variant: rc $? ($((SECONDS - t)) s): $(grep -E "│ *[0-9a-f]{8}-" "$out/run.log" | tail -n 1 | tr -s ' ')"
    grep -E "Error|error" "$out/run.log" | tail -n 3
  done
fi

if [[ " $parts " == *" media "* ]]; then
  step "media decisions, Qwen3-Omni thinker at its real shape"
  # shellcheck disable=SC2086
  timeout 240 python3 "$here/omni_shape.py" $layers $device --variants int4 --kinds text,image,audio,video --reps 10 \
    --no-host-pixels --db "$db" > "$out/omni-int4.log" 2>&1
  echo "   int4: rc $?"; grep -E "end to end|kernels ran|decoder graphs|Error" "$out/omni-int4.log" | cut -c1-300
  # shellcheck disable=SC2086
  timeout 150 python3 "$here/omni_shape.py" $layers $device --variants nvfp4-packed --kinds image --reps 10 --no-host-pixels \
    --db "$db" > "$out/omni-nvfp4.log" 2>&1
  echo "   nvfp4-packed: rc $?"; grep -E "end to end|kernels ran|decoder graphs|Error" "$out/omni-nvfp4.log" | cut -c1-300
fi

if [[ " $parts " == *" serve "* ]]; then
  step "serving INT4 at the 30B shape"
  port=8123
  # shellcheck disable=SC2086
  python3 -m quantbench serve --backend int4 --shape qwen3-30b-a3b $layers $device --port $port > "$out/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do  # the port opens once the imports are done; `load --ready-timeout` waits for the model
    curl -s -o /dev/null http://127.0.0.1:$port/healthz && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  timeout 150 python3 -m quantbench load --endpoint http://127.0.0.1:$port --suite "$out/s$tokens.jsonl" \
    --concurrency 1,8,32 --requests 900 --seconds 5 --processes 4 --ready-timeout 120 --db "$db" > "$out/load.txt" 2>&1
  echo "   load: rc $?"; grep -E "│|saturation|Error" "$out/load.txt" | head -n 12
  curl -s http://127.0.0.1:$port/metrics > "$out/metrics.json"
  kill $server; wait $server 2>/dev/null
fi

if [[ " $parts " == *" mixed "* ]]; then
  step "serving INT4 of the Qwen3-Omni thinker, mixed text and picture decisions"
  port=8124
  python3 "$here/mixed_suite.py" --suite "$out/s$tokens.jsonl" --image-every 2 --out "$out/mixed.jsonl" >/dev/null
  # shellcheck disable=SC2086
  python3 -m quantbench serve --backend int4 --shape qwen3-omni-30b-a3b $layers $device --port $port \
    > "$out/serve-mixed.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do
    curl -s -o /dev/null http://127.0.0.1:$port/healthz && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  timeout 150 python3 -m quantbench load --endpoint http://127.0.0.1:$port --suite "$out/mixed.jsonl" \
    --concurrency 1,8 --requests 600 --seconds 5 --processes 4 --ready-timeout 120 --db "$db" > "$out/load-mixed.txt" 2>&1
  echo "   load: rc $?"; grep -E "│|saturation|Error" "$out/load-mixed.txt" | head -n 12
  curl -s http://127.0.0.1:$port/healthz > "$out/healthz-mixed.json"
  kill $server; wait $server 2>/dev/null
fi

step "compared with the newest stored rows (${STORED:-results.duckdb})"
python3 "$here/gpu_check.py" "$db" --stored "${STORED:-$here/../results.duckdb}"
rc=$?
echo "== done in $((SECONDS - start)) s; merge the rows: quantbench merge $db"
exit $rc
