#!/usr/bin/env bash
# Durable Set latency while compaction deletes journal segments: two dreyd
# binaries in alternating rounds on one machine, with small segments and
# frequent snapshots so that compactions (and their unlinks) keep happening.
#
#   tests/bench/compaction_ab.sh BEFORE_DREYD AFTER_DREYD [rounds]
#
# SEGMENT_BYTES and SNAPSHOT_EVERY_BYTES override the journal's sizes.
#
# drey-bench comes from bazel-bin (build //:drey-bench first). Prints one line
# per run: label, throughput, p50/p99/p99.9/max in ms, segments removed.
set -euo pipefail
BENCH=$(cd "$(dirname "$0")/../.." && pwd)/bazel-bin/drey-bench
BEFORE=$1 AFTER=$2 ROUNDS=${3:-3}
FLAGS=(--segment-bytes="${SEGMENT_BYTES:-8MiB}" --snapshot-every-bytes="${SNAPSHOT_EVERY_BYTES:-16MiB}"
  --snapshot-every=0 --retain-snapshots=1)
LOAD=(--connections=4 --streams=16 --mix=set:1 --keys=20000 --value-bytes=4096 --duration=20s --warmup=2s)
run() {  # $1: label, $2: dreyd
  local label=$1 bin=$2 dir
  dir=$(mktemp -d)
  "$bin" --listen=127.0.0.1:0 --ops-listen=127.0.0.1:0 --data-dir="$dir/data" --drain-grace=0 \
    --max-inflight=2048 --max-queued=2048 --slowdown-at=2048 --principal-max-inflight=2048 \
    --principal-max-queued=2048 "${FLAGS[@]}" 2>"$dir/log" &
  local pid=$!
  for _ in $(seq 100); do grep -q '"serving"' "$dir/log" && break; sleep 0.1; done
  local port ops
  port=$(grep -o '"port":[0-9]*' "$dir/log" | head -1 | cut -d: -f2)
  ops=$(grep -o '"ops_port":[0-9]*' "$dir/log" | head -1 | cut -d: -f2)
  "$BENCH" --target=127.0.0.1:$port "${LOAD[@]}" --json --label="$label" >"$dir/bench.json"
  local removed
  removed=$(curl -s "http://127.0.0.1:$ops/metrics" | awk '/^drey_compaction_segments_removed_total/{print $2}')
  kill -TERM $pid; wait $pid || true
  /usr/bin/python3 - "$dir/bench.json" "$removed" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
lat = {k: v / 1000 for k, v in r["latency"].items() if k.endswith("_us")}
print("%-7s %8.0f/s  p50 %6.2f  p99 %6.2f  p99.9 %6.2f  max %7.2f ms  errors %d  segments removed %s"
      % (r["label"], r["throughput"], lat["p50_us"], lat["p99_us"], lat["p999_us"], lat["max_us"], r["errors"],
         sys.argv[2]))
PY
  rm -rf "$dir"
}
for _ in $(seq "$ROUNDS"); do
  run before "$BEFORE"
  run after "$AFTER"
done
