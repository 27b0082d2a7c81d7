#!/usr/bin/env bash
# Change feeds: the delay from a Set's acknowledgement to its Watch event at
# 0 (Set alone), 1 and 100 watchers, on a durable (fsync always) and an
# ephemeral dreyd, and what an idle hub costs a store write. Builds with -c
# opt, starts its own dreyd on a free loopback port per shape and stops it.
# Prints numbers; never fails on them.
#
#   tests/bench/watch.sh [writes]     (default 2000)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
writes=${1:-2000}
bazel build -c opt //:dreyd //tests/bench:watch_latency >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
tmp=$(mktemp -d)
pid=
cleanup() { [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

start() {
  "$bin/dreyd" --listen=127.0.0.1:0 --ops-listen= --data-dir="$tmp/data-$RANDOM" "$@" 2>"$tmp/log" &
  pid=$!
  for _ in $(seq 1 300); do
    port=$(grep -o '"msg":"serving"' "$tmp/log" >/dev/null && grep -o '"port":[0-9]*' "$tmp/log" | head -1 | cut -d: -f2 || true)
    [[ -n "$port" ]] && return 0
    sleep 0.05  # polling a log line with a deadline: not a synchronisation of the measurement
  done
  echo "dreyd did not start" >&2; cat "$tmp/log" >&2; exit 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }

for mode in durable ephemeral; do
  flags=(); [[ $mode == ephemeral ]] && flags=(--ephemeral)
  for n in 0 1 100; do
    start "${flags[@]}"
    echo "== $mode dreyd, $n watchers"
    "$bin/tests/bench/watch_latency" --target="127.0.0.1:$port" --watchers="$n" --writes="$writes"
    stop
  done
done
echo "== store"
"$bin/tests/bench/watch_latency" --store --writes=1000000
