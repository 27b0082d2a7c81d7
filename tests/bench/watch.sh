#!/usr/bin/env bash
# Change feeds: the delay from a Set's acknowledgement to its Watch event at
# 0 (Set alone), 1 and 100 watchers, on a durable (fsync always) and an
# ephemeral dreyd, and Set throughput and dreyd CPU per Set beside 0, 1 and
# 100 whole-cache watchers. Builds with -c opt, starts its own dreyd on a
# free loopback port per shape and stops it.
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
cpu_ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }  # dreyd's utime + stime

for mode in durable ephemeral; do
  flags=(); [[ $mode == ephemeral ]] && flags=(--ephemeral)
  for n in 0 1 100; do
    start "${flags[@]}"
    echo "== $mode dreyd, $n watchers"
    "$bin/tests/bench/watch_latency" --target="127.0.0.1:$port" --watchers="$n" --writes="$writes"
    stop
  done
done
# Write throughput beside 0, 1 and 100 whole-cache watchers (every write
# is an event for each): what watching costs the write path.
bazel build -c opt //:drey-bench >/dev/null 2>&1
for mode in durable ephemeral; do
  flags=(); [[ $mode == ephemeral ]] && flags=(--ephemeral)
  for n in 0 1 100; do
    start "${flags[@]}"
    hold_pid=
    if [[ $n -gt 0 ]]; then
      mkfifo "$tmp/in-$n-$mode"
      "$bin/tests/bench/watch_latency" --target="127.0.0.1:$port" --watchers="$n" --hold <"$tmp/in-$n-$mode" >"$tmp/hold" &
      hold_pid=$!
      exec 7>"$tmp/in-$n-$mode"
      for _ in $(seq 1 600); do grep -q ready "$tmp/hold" && break; sleep 0.05; done
    fi
    echo "== $mode dreyd, drey-bench Set 4x16 beside $n whole-cache watchers"
    t0=$(cpu_ticks)
    out=$("$bin/drey-bench" --target="127.0.0.1:$port" --connections=4 --streams=16 --mix=set:1 --duration=4s \
      --warmup=1s)
    t1=$(cpu_ticks)
    echo "$out" | grep -E "throughput|^calls"
    calls=$(echo "$out" | awk '/^calls/ {print $2}')
    hz=$(getconf CLK_TCK)
    awk -v t="$((t1 - t0))" -v hz="$hz" -v c="$calls" 'BEGIN { printf "dreyd CPU    %.1f µs per Set (warmup included in the CPU, not in the calls)\n", t / hz * 1e6 / c }'
    if [[ -n "$hold_pid" ]]; then exec 7>&-; wait "$hold_pid" || true; cat "$tmp/hold" | tail -1; fi
    stop
  done
done
