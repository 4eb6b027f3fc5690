#!/usr/bin/env bash
# The GPU runs behind the Hopper rows of results.duckdb: every backend on the embedded fixture (its answers must
# agree with its CPU runs) and at the real Qwen3-30B-A3B shape with random weights (speed and memory only), one
# GPU, no network, everything through quantbench's own CLI.
#
#   bash benchmarks/h200.sh OUT_DIR [fixture|shape|throughput|throughput-more|lengths|all|autoround-start|autoround]
#   quantbench merge OUT_DIR/h200.duckdb --db results.duckdb && quantbench report --db results.duckdb --gpu hopper
#   (the shipped results; without --db, your own store under $QUANTBENCH_HOME)
#
# Parts (each fits one 10-minute device call): fixture = the fixture's variants; shape = every backend at the
# 30B shape, one ~512-token decision at a time; throughput = 8 and 32 decisions of 512 tokens per forward pass
# (BF16 and INT4; throughput-more: NVFP4, FP8 and the eager noise-floor kernel);
# lengths = 128- and 2048-token decisions; autoround (not in all) = the real-shape model of AUTOROUND_LAYERS (8)
# layers quantized by `quantbench quantize --shape` (auto-round RTN, from memory: no BF16 checkpoint on disk), run
# through auto-round's per-expert path and through the fast path, one and 8 decisions per forward pass, beside
# BF16 on the same weights (QB_GPU=cpu runs this part on a CPU machine: there the per-expert loop is auto-round's
# torch kernel). Before 2026-11-30 13:00 this part wrote the BF16 checkpoint first (`quantbench fixture --shape`).
# At 48 layers the quantizing outlasts a call: `autoround-start` starts it detached, and `autoround` in the next call
# (the same warm machine) waits for it and runs the paths. Needs quantbench importable
# (installed, or PYTHONPATH=$PWD) and, for the fixture, its cache ($QUANTBENCH_CACHE): carried from the machine
# that built it, or built here (~2 min).
set -u
out=${1:?usage: h200.sh OUT_DIR [fixture|shape|throughput|throughput-more|lengths|all|autoround-start|autoround]}
part=${2:-all}
mkdir -p "$out"
db="$out/h200.duckdb"
here=$(cd "$(dirname "$0")" && pwd)
qb() {
  local t=$SECONDS
  timeout "${QB_TIMEOUT:-300}" python3 -m quantbench run --gpu "${QB_GPU:-hopper}" --db "$db" "$@" 2>&1 | grep -E "│|Error|error" | tail -n 3
  echo "    ($((SECONDS - t)) s: $*)"
}
suite() {  # realistic-length decisions: the built-in records padded to N tokens (deterministic)
  [ -f "$out/suite-$1.jsonl" ] || python3 "$here/long_suite.py" --tokens "$1" --n 16 --out "$out/suite-$1.jsonl" >/dev/null
  echo "$out/suite-$1.jsonl"
}
shape() { echo --shape qwen3-30b-a3b --suite "$(suite "$1")" --warmup 2 --latency-min-decisions 16 --latency-min-seconds 1; }

ckpt=${TMPDIR:-/tmp}/quantbench-autoround  # the auto-round checkpoint of the `autoround` parts
layers=${AUTOROUND_LAYERS:-8}    # 48: the whole model; then AUTOROUND_DECISIONS=4 AUTOROUND_BATCHES=1 AUTOROUND_BF16=0
quantize_autoround() {  # quantized from memory: the synthetic model `run --shape` builds, no 61 GB BF16 checkpoint on
  # disk first; plain RTN (speed only: random weights; no calibration pass)
  python3 -m quantbench quantize --shape qwen3-30b-a3b --layers "$layers" --scheme int4 --iters 0 --plain-rtn \
    --nsamples 16 --seqlen 256 --out "$ckpt/int4"
}
if [[ $part == autoround-start ]]; then  # 48 layers: the quantizing alone is ~16 min (2026-11-30, H200 host), more
  # than one 10-minute call: start it detached and return; `autoround` in a later call on the same, still warm
  # machine waits for it (a detached process outlived its call there; give the next call at once)
  rm -rf "$ckpt" && mkdir -p "$ckpt"
  export layers ckpt
  setsid nohup bash -c "$(declare -f quantize_autoround); quantize_autoround > '$ckpt/quantize.log' 2>&1; \
    echo \$? > '$ckpt/quantize.rc'" < /dev/null > /dev/null 2>&1 &
  echo $! > "$ckpt/quantize.pid"
  echo "    auto-round RTN of the $layers-layer real-shape model started in the background (pid $!, log $ckpt/quantize.log)"
fi
if [[ $part == autoround ]]; then  # auto-round's own per-expert path against the fast path, on one checkpoint
  n_dec=${AUTOROUND_DECISIONS:-16} # decisions in the suite and timed at least (auto-round's loop: ~1.2 s each at 48)
  t=$SECONDS
  if [[ -f $ckpt/quantize.pid ]]; then  # started by `autoround-start`: wait for it
    while kill -0 "$(cat "$ckpt/quantize.pid")" 2>/dev/null; do sleep 5; done
    [[ $(cat "$ckpt/quantize.rc" 2>/dev/null) == 0 ]] || { tail -n 20 "$ckpt/quantize.log"; echo "quantize failed"; exit 1; }
    cp "$ckpt/quantize.log" "$out/autoround-quantize.log"
  else
    rm -rf "$ckpt" && mkdir -p "$ckpt"
    quantize_autoround > "$out/autoround-quantize.log" 2>&1
  fi
  grep -v -i warn "$out/autoround-quantize.log" | tail -n 4
  echo "    ($((SECONDS - t)) s: auto-round RTN of the $layers-layer real-shape model)"
  s512=$out/autoround-suite-$n_dec.jsonl
  python3 "$here/long_suite.py" --tokens 512 --n "$n_dec" --out "$s512" >/dev/null
  timing="--suite $s512 --warmup 1 --latency-min-decisions $n_dec --latency-min-seconds 1"
  for n in ${AUTOROUND_BATCHES:-1 8}; do
    for fast in --no-fast-moe --fast-moe; do
      qb --backend int4 --model "$ckpt/int4" $timing --concurrency "$n" $fast
    done
  done
  [[ ${AUTOROUND_BF16:-1} == 1 ]] && qb --backend bf16 --shape qwen3-30b-a3b --layers "$layers" $timing
  rm -rf "$ckpt"
fi
if [[ $part == fixture || $part == all ]]; then
  qb --backend bf16 --reference
  qb --backend bf16 --noise-floor
  qb --backend int4
  qb --backend nvfp4 --nvfp4 packed
  qb --backend fp8
fi
if [[ $part == shape || $part == all ]]; then
  s512=$(shape 512)
  qb --backend bf16 $s512
  qb --backend bf16 --experts-impl quantbench $s512
  qb --backend bf16 --experts-impl eager $s512
  qb --backend int4 $s512
  qb --backend nvfp4 --nvfp4 packed $s512
  qb --backend nvfp4 --nvfp4 unpacked $s512
  qb --backend fp8 $s512
fi
if [[ $part == throughput || $part == all ]]; then
  s512=$(shape 512)
  for n in 8 32; do
    qb --backend bf16 $s512 --concurrency $n
    qb --backend bf16 --experts-impl quantbench $s512 --concurrency $n
    qb --backend int4 $s512 --concurrency $n
  done
fi
if [[ $part == throughput-more || $part == all ]]; then  # the other backends at 8 and 32 decisions per pass
  s512=$(shape 512)
  for n in 8 32; do
    qb --backend nvfp4 --nvfp4 packed $s512 --concurrency $n
    qb --backend nvfp4 --nvfp4 unpacked $s512 --concurrency $n
    qb --backend fp8 $s512 --concurrency $n
    qb --backend bf16 --experts-impl eager $s512 --concurrency $n
  done
fi
if [[ $part == lengths || $part == all ]]; then
  for tokens in 128 2048; do
    qb --backend bf16 $(shape $tokens)
    qb --backend int4 $(shape $tokens)
  done
fi
[[ -f $db ]] && python3 -m quantbench runs --db "$db" --last 40 2>&1 | tail -n 50
