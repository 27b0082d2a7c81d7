#!/usr/bin/env bash
# Ephemeral Set throughput with jemalloc's defaults and with dreyd's malloc_conf (background
# thread, 1 s dirty decay: src/dreyd/main.c), alternating rounds on one machine. 4 KiB values
# so the allocator's purging has something to do. Prints numbers, never fails on them.
set -euo pipefail
BIN=$(cd "$(dirname "$0")/../.." && pwd)/bazel-bin   # build //:dreyd //:drey-bench first
DEFAULTS=background_thread:false,dirty_decay_ms:10000,muzzy_decay_ms:0
run() {  # $1: label, $2: MALLOC_CONF ("" for dreyd's own)
  local label=$1 conf=$2
  local dir; dir=$(mktemp -d)
  MALLOC_CONF=$conf $BIN/dreyd --listen=127.0.0.1:0 --ops-listen= --ephemeral=true --drain-grace=0 \
    --max-inflight=2048 --max-queued=2048 --slowdown-at=2048 --principal-max-inflight=2048 \
    --principal-max-queued=2048 2>$dir/log &
  local pid=$!
  for i in $(seq 100); do grep -q '"serving"' $dir/log && break; sleep 0.1; done
  local port; port=$(grep -o '"port":[0-9]*' $dir/log | head -1 | cut -d: -f2)
  local out; out=$($BIN/drey-bench --target=127.0.0.1:$port --connections=16 --streams=64 --mix=set:1 \
      --keys=10000 --value-bytes=4096 --duration=5s --warmup=1s --json | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
print("%d calls/s, p99 %.1f ms, %d errors" % (r["ok_throughput"], r["latency"]["p99_us"] / 1000, r["errors"]))')
  local rss; rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
  kill -TERM $pid; wait $pid || true
  rm -rf $dir
  echo "$label: $out, VmRSS at the end $((rss / 1024)) MiB"
}
for r in 1 2 3; do
  run "jemalloc defaults" "$DEFAULTS"
  run "dreyd's malloc_conf" ""
done
