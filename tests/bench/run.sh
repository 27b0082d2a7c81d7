#!/usr/bin/env bash
# The drey benchmark in one command: drey against etcd and Redis, and against the gRPC
# transport's own ceiling (Health/Check), then drey clusters beside Redis Cluster, replication,
# forwarding, eviction, watch latency and join/drain (tests/bench/bench_cluster.py), in one run on
# this machine.
#
#   tests/bench/run.sh            full run: 3 concurrency levels x 3 rounds, 1,000,000 entries
#                                 for memory and recovery, 2 cluster rounds
#   tests/bench/run.sh --quick    one short round of each, 50,000 entries (about 3 minutes)
#   tests/bench/run.sh --out DIR  results elsewhere (default tests/bench/results/<date>[-quick])
#
# Installs the Debian packages it needs when missing (etcd, Redis, h2load, gnuplot), builds dreyd,
# drey, drey-bench and watch_latency, starts every server on free loopback ports, stops all of them
# at the end (also on failure or Ctrl-C) and writes report.md, results.json, throughput.{png,svg}
# and p99.{png,svg}.
# It prints numbers and never fails on them.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
quick=()
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick) ;;
    --out) out="$2"; shift ;;
    --out=*) out="${1#--out=}" ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (--quick, --out DIR)" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- packages: install only what is missing ------------------------------------------------
need=(etcd-server etcd-client redis-server redis-tools nghttp2-client gnuplot-nox protobuf-compiler openssl)
missing=()
for p in "${need[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "run.sh: missing packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  apt-get update -qq
  # RUNLEVEL=1 keeps invoke-rc.d from starting the packages' services: the run starts its own.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- binaries ----------------------------------------------------------------------------------
cd "$top"
log "building dreyd and drey-bench"
bazel build //:dreyd //:drey //:drey-bench //tests/bench:watch_latency 2>&1 | tail -1 >&2
# bazel-bin follows whichever configuration built last (other engineers share this Bazel), so the
# binaries are copied from the default configuration's output and checked for sanitizers.
bin=$(bazel info bazel-bin 2>/dev/null)
work=$(mktemp -d "${TMPDIR:-/var/tmp}/drey-bench-bin.XXXXXX")
child=""
cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
cp "$bin/dreyd" "$bin/drey" "$bin/drey-bench" "$bin/tests/bench/watch_latency" "$work/"
for b in dreyd drey drey-bench watch_latency; do
  if ldd "$work/$b" | grep -q 'libasan\|libubsan'; then
    echo "run.sh: $bin/$b is a sanitizer build" >&2
    exit 1
  fi
done

suffix=""
[ ${#quick[@]} -gt 0 ] && suffix="-quick"
out=${out:-$top/tests/bench/results/$(date -u +%Y-%m-%d)$suffix}
mkdir -p "$out"

# --- the run -------------------------------------------------------------------------------------
/usr/bin/python3 -B "$top/tests/bench/bench.py" "${quick[@]}" --out "$out" --dreyd "$work/dreyd" \
  --drey-bench "$work/drey-bench" --watch-latency "$work/watch_latency" --repo "$top" --workdir "${TMPDIR:-/var/tmp}" \
  --command "tests/bench/run.sh${quick[*]:+ ${quick[*]}}" &
child=$!
status=0
wait "$child" || status=$?
child=""
if [ -f "$out/results.json" ]; then
  /usr/bin/python3 -B "$top/tests/bench/report.py" "$out" >&2
  log "report: $out/report.md"
fi
exit $status
