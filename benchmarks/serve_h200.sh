#!/usr/bin/env bash
# Serving under load on one GPU, in one device call (~6-7 min): `quantbench serve --shape qwen3-30b-a3b` (48 layers,
# random weights) for INT4 and then BF16 (BACKENDS="int4 bf16"), each
# driven by `quantbench load` with 4 generator processes (closed loop 1, 8, 32, 128 clients; 512-token decisions),
# and a second pass at 128 clients whose refused clients do not wait out Retry-After (a storm of refusals).
#
# MODEL="" serves the embedded fixture instead (a smoke test of this script on a CPU). With OVERHEAD=1, first the server's own overhead with a fake 12.5 ms forward on this host's CPU (serve_overhead.py).
#
#   bash benchmarks/serve_h200.sh OUT_DIR            # then: quantbench merge OUT_DIR/serve.duckdb
#
# Needs quantbench importable (PYTHONPATH=$PWD) and the device wheels (pydantic ...) on PYTHONPATH. Writes each
# command's output to OUT_DIR/*.txt and the load runs to OUT_DIR/serve.duckdb.
set -u
out=${1:?usage: serve_h200.sh OUT_DIR}
mkdir -p "$out"
db="$out/serve.duckdb"
here=$(cd "$(dirname "$0")" && pwd)
port=8123
python3 -c "import httptools" 2>/dev/null && echo "uvicorn parses HTTP with httptools" || echo "uvicorn parses HTTP with h11"
python3 -c "import os; print('load average', os.getloadavg(), 'cores', os.cpu_count())"

# 1. The server's own overhead on this host: a 12.5 ms sleep for a forward pass, real parsing and tokenizing with
# the embedded fixture's engine (from $QUANTBENCH_CACHE: carry its models/ folder, 27 MB).
if [[ ${OVERHEAD:-0} == 1 ]]; then
  timeout 150 python3 "$here/serve_overhead.py" --requests 1500 --concurrency 1,32,128 --seconds 8 --processes 4 \
    > "$out/overhead.txt" 2>&1
  grep -E "│|1 client|saturation|load average" "$out/overhead.txt"
fi

# 2. The real-shape model for each backend.
python3 "$here/long_suite.py" --tokens 512 --n 64 --out "$out/s512.jsonl" > /dev/null
for backend in ${BACKENDS:-int4 bf16}; do
  t=$SECONDS
  # shellcheck disable=SC2086  # MODEL: the model flags, one word each
  python3 -m quantbench serve --backend "$backend" ${MODEL---shape qwen3-30b-a3b --layers 48} --port $port \
    > "$out/serve-$backend.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do  # the port opens once the imports are done; `load --ready-timeout` waits for the model
    curl -s -o /dev/null http://127.0.0.1:$port/healthz && break
    kill -0 $server 2>/dev/null || break
    sleep 1
  done
  timeout 330 python3 -m quantbench load --endpoint http://127.0.0.1:$port --suite "$out/s512.jsonl" \
    --concurrency 1,8,32,128 --requests 1000 --seconds 8 --processes 4 --ready-timeout 240 --db "$db" \
    > "$out/load-$backend.txt" 2>&1
  timeout 60 python3 -m quantbench load --endpoint http://127.0.0.1:$port --suite "$out/s512.jsonl" \
    --concurrency 128 --requests 1000 --seconds 6 --processes 4 --no-retry-after --warmup 0 --db "$db" \
    > "$out/load-$backend-storm.txt" 2>&1
  curl -s http://127.0.0.1:$port/metrics > "$out/metrics-$backend.json"
  kill $server; wait $server
  echo "== $backend ($((SECONDS - t)) s)"
  grep -E "│|saturation|stored" "$out/load-$backend.txt" "$out/load-$backend-storm.txt"
done
