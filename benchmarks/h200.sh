#!/usr/bin/env bash
# The GPU run behind the Hopper rows of results.duckdb: every backend on the embedded fixture (quality parity with
# its CPU runs) and at the real Qwen3-30B-A3B shape with random weights (speed and memory only), one GPU, no network.
#
#   bash benchmarks/h200.sh OUT_DIR          # then, here:  quantbench merge OUT_DIR/h200.duckdb
#
# Needs quantbench importable (PYTHONPATH=$PWD or installed) and, for the fixture, its cache ($QUANTBENCH_CACHE):
# carried from the machine that built it, or built here (about a minute).
set -u
out=${1:?usage: h200.sh OUT_DIR}
mkdir -p "$out"
db="$out/h200.duckdb"
qb() { python3 -m quantbench run --gpu hopper --db "$db" "$@" 2>&1 | tail -n 4; }

# 1. The fixture, every variant: its answers must agree with the CPU runs (same top answer on >= 99%).
qb --backend bf16 --reference
qb --backend bf16 --noise-floor
qb --backend int4
qb --backend nvfp4 --nvfp4 packed
qb --backend fp8

# 2. The real 30B-A3B shape with random weights, one ~512-token decision at a time.
python3 benchmarks/long_suite.py --tokens 512 --n 16 --out "$out/suite-512.jsonl"
shape=(--shape qwen3-30b-a3b --suite "$out/suite-512.jsonl" --warmup 2 --latency-min-decisions 20 --latency-min-seconds 1)
qb --backend bf16 "${shape[@]}"
qb --backend int4 "${shape[@]}"
qb --backend nvfp4 --nvfp4 packed "${shape[@]}"
qb --backend fp8 "${shape[@]}"
# Throughput: 8 decisions of 512 tokens per forward pass.
qb --backend bf16 "${shape[@]}" --concurrency 8
qb --backend int4 "${shape[@]}" --concurrency 8
python3 -m quantbench runs --db "$db" --last 20
