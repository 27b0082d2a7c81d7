#!/usr/bin/env bash
# Durable Set throughput with and without a journal disk quota, alternating rounds on one machine.
set -euo pipefail
BIN=$(cd "$(dirname "$0")/../.." && pwd)/bazel-bin   # build //:dreyd //:drey-bench first
run() {  # $1: label, rest: extra dreyd flags
  local label=$1; shift
  local dir; dir=$(mktemp -d)
  $BIN/dreyd --listen=127.0.0.1:0 --ops-listen= --data-dir=$dir/data --drain-grace=0 \
    --max-inflight=2048 --max-queued=2048 --slowdown-at=2048 --principal-max-inflight=2048 \
    --principal-max-queued=2048 --snapshot-every-bytes=0 "$@" 2>$dir/log &
  local pid=$!
  for i in $(seq 100); do grep -q '"serving"' $dir/log && break; sleep 0.1; done
  local port; port=$(grep -o '"port":[0-9]*' $dir/log | head -1 | cut -d: -f2)
  local tput; tput=$($BIN/drey-bench --target=127.0.0.1:$port --connections=16 --streams=64 --mix=set:1 \
      --keys=100000 --value-bytes=256 --duration=5s --warmup=1s --json | /usr/bin/python3 -c 'import json,sys; print(round(json.load(sys.stdin)["throughput"]))')
  kill -TERM $pid; wait $pid || true
  rm -rf $dir
  echo "$label $tput"
}
for r in 1 2 3; do
  run "no-cap" --journal-max-bytes=0
  run "cap-64GiB" --journal-max-bytes=64GiB
  run "cap-derived"   # the default: derived from the file system, re-derived every second
done
