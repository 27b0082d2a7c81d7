#!/usr/bin/env bash
# What the change feed costs the write path when nobody watches: drey-bench
# Set against two dreyd binaries (before and after the feed), alternating
# rounds, a fresh dreyd per round; dreyd's CPU per call from /proc.
#   watch_idle_ab.sh <dreyd-before> <dreyd-after> <drey-bench> [rounds] [ephemeral|durable]
set -euo pipefail
before=$1 after=$2 bench=$3 rounds=${4:-3} mode=${5:-ephemeral}
tmp=$(mktemp -d)
pid=
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
flags=(); [[ $mode == ephemeral ]] && flags=(--ephemeral)
hz=$(getconf CLK_TCK)
for r in $(seq 1 "$rounds"); do
  for which in before after; do
    bin=$before; [[ $which == after ]] && bin=$after
    rm -rf "$tmp/data"
    "$bin" --listen=127.0.0.1:0 --ops-listen= --data-dir="$tmp/data" "${flags[@]}" 2>"$tmp/log" &
    pid=$!
    port=
    for _ in $(seq 1 300); do
      if grep -q '"msg":"serving"' "$tmp/log"; then port=$(grep -o '"port":[0-9]*' "$tmp/log" | head -1 | cut -d: -f2); break; fi
      sleep 0.05
    done
    [[ -n "$port" ]] || { cat "$tmp/log"; exit 1; }
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$("$bench" --target="127.0.0.1:$port" --connections=4 --streams=16 --mix=set:1 --duration=4s --warmup=1s)
    t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    calls=$(echo "$out" | awk '/^calls/ {print $2}')
    tput=$(echo "$out" | awk '/^throughput/ {print $2}')
    awk -v r="$r" -v w="$which" -v t="$((t1 - t0))" -v hz="$hz" -v c="$calls" -v tp="$tput" -v m="$mode" \
      'BEGIN { printf "%s round %d %-6s %10.1f calls/s  %.1f µs dreyd CPU per call\n", m, r, w, tp, t / hz * 1e6 / c }'
    kill "$pid"; wait "$pid" || true; pid=
  done
done
