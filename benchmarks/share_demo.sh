#!/usr/bin/env bash
# Shared results end to end (issue #36): two stores made on different machines published as bundles, served by a
# local HTTP server on 127.0.0.1, pulled into a third store; a tampered bundle refused with nothing merged; a second
# pull adds nothing; `quantbench recommend` with a latency target and a VRAM budget.
#
#   bash benchmarks/share_demo.sh OUT_DIR [CPU_STORE]
#
# CPU_STORE: a store of this machine's `quantbench demo` (default: your own store, $QUANTBENCH_HOME/results.duckdb);
# the H200 rows are the shipped results.duckdb's. Writes only under OUT_DIR. No GPU, no network but 127.0.0.1.
set -euo pipefail
out=${1:?usage: share_demo.sh OUT_DIR [CPU_STORE]}
root=$(cd "$(dirname "$0")/.." && pwd)
cpu_store=${2:-${QUANTBENCH_HOME:-$HOME/.local/share/quantbench}/results.duckdb}
qb() { python3 -m quantbench "$@"; }
step() { printf '\n$ %s\n' "$*"; }

rm -rf "$out" && mkdir -p "$out/www"
third="$out/third.duckdb"
export QUANTBENCH_HOME="$out/home" QUANTBENCH_SHIPPED="" COLUMNS=${COLUMNS:-250}  # the third store alone
unset QUANTBENCH_DB

step quantbench publish --db "$cpu_store" --gpu cpu --out "$out/www/cpu-demo.tar.gz"
qb publish --db "$cpu_store" --gpu cpu --name cpu-demo --out "$out/www/cpu-demo.tar.gz" | tee "$out/publish-cpu.txt"
step quantbench publish --db results.duckdb --gpu hopper --out "$out/www/h200/"
qb publish --db "$root/results.duckdb" --gpu hopper --name h200-shipped --out "$out/www/h200" | tee "$out/publish-h200.txt"
h200_sha=$(sed -n 's/^manifest.json sha256 //p' "$out/publish-h200.txt")

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$out/www" >"$out/http.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
base="http://127.0.0.1:$port"

step quantbench pull "$base/h200/" --sha256 "$h200_sha" --db third.duckdb
qb pull "$base/h200/" --sha256 "$h200_sha" --db "$third"
step quantbench pull "$base/cpu-demo.tar.gz" --db third.duckdb
qb pull "$base/cpu-demo.tar.gz" --db "$third"

count() { qb runs --db "$third" --last 0 --format csv | tail -n +2 | wc -l; }
step "the store holds: $(count) runs"
step quantbench pull "$base/h200/" --db third.duckdb "  # again"
qb pull "$base/h200/" --db "$third"
step "the store holds: $(count) runs"

cp -r "$out/www/h200" "$out/www/h200-tampered"
python3 - "$out/www/h200-tampered/answers.parquet" <<'EOF'
import sys
p = sys.argv[1]
data = bytearray(open(p, "rb").read())
data[len(data) // 2] ^= 0x01  # one bit of one answer's bytes
open(p, "wb").write(bytes(data))
EOF
step quantbench pull "$base/h200-tampered/" --db third.duckdb "  # one bit flipped in answers.parquet"
qb pull "$base/h200-tampered/" --db "$third" || echo "(exit $?)"
step "the store holds: $(count) runs"
head -c $(( $(stat -c %s "$out/www/cpu-demo.tar.gz") / 2 )) "$out/www/cpu-demo.tar.gz" > "$out/www/cpu-cut.tar.gz"
step quantbench pull "$base/cpu-cut.tar.gz" --db third.duckdb "  # the archive cut in half"
qb pull "$base/cpu-cut.tar.gz" --db "$third" || echo "(exit $?)"

step quantbench sources --db third.duckdb
qb sources --db "$third"
step quantbench runs --db third.duckdb --model 9af210da --status ok --last 0 --format csv "  # variant | GPU | host | day | from"
qb runs --db "$third" --model 9af210da --status ok --last 0 --format csv \
  | python3 -c 'import csv,sys; r=list(csv.DictReader(sys.stdin)); [print(x["variant"], x["gpu_name"] or "cpu", x["host"], x["created_at"][:10], x["source"], sep=" | ") for x in r[-12:]]'
step quantbench report --db third.duckdb --gpu all --model 9af210da "| grep '^###\|Recommended\|Sources'"
qb report --db "$third" --gpu all --model 9af210da | grep -E '^###|^\*\*Recommended|Sources:|^\| \*\*Pick' | cut -c1-400
step quantbench recommend --db third.duckdb --gpu all --max-latency-ms 20 --max-vram-gib 2
qb recommend --db "$third" --gpu all --max-latency-ms 20 --max-vram-gib 2 | cut -c1-600 || echo "(exit $?)"
step quantbench recommend --db third.duckdb --gpu all --max-latency-ms 200 --max-vram-gib 2
qb recommend --db "$third" --gpu all --max-latency-ms 200 --max-vram-gib 2 | cut -c1-600 || echo "(exit $?)"
step quantbench recommend --db third.duckdb --gpu all --max-latency-ms 0.3 --concurrency 8 --max-vram-gib 1
qb recommend --db "$third" --gpu all --max-latency-ms 0.3 --concurrency 8 --max-vram-gib 1 | cut -c1-600 || echo "(exit $?)"

step "the dashboard over third.duckdb (streamlit's AppTest: what a browser would be sent)"
QUANTBENCH_DB="$third" python3 - "$root/dashboard/streamlit_app.py" <<'EOF'
import sys
from collections import Counter

from streamlit.testing.v1 import AppTest

at = AppTest.from_file(sys.argv[1], default_timeout=600).run()
assert not at.exception, at.exception
for family in at.selectbox(key="family").options:
    at.selectbox(key="family").set_value(family.lower()).run()
    print(f"GPU family {family}: GPUs {at.selectbox(key='gpu').options}")
at.selectbox(key="family").set_value("hopper").run()
table = at.dataframe[0].value
print("report page, NVIDIA H200:", [f"{v} <- {s}" for v, s in zip(table["Variant"], table["Source"])])
at.switch_page("page_runs.py").run()
print("runs page, rows by source:", dict(Counter(at.dataframe[0].value["source"])))
at.switch_page("page_sources.py").run()
print("sources page, bundles:", at.dataframe[1].value[["Bundle", "Published by", "Runs", "Runs it added"]].to_dict("records"))
EOF
