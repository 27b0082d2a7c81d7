#!/bin/bash
# A/B: durable Set answered from the journal writer (inline) vs from the CQ threads (answer-on-cq).
D=/work/main/bazel-bin/dreyd; B=/work/main/bazel-bin/drey-bench
run() { # $1 mode $2 conns $3 streams
  rm -rf /tmp/ab/data; port=$((20000 + RANDOM % 20000))
  flags=""; [ "$1" = cq ] && flags="--answer-on-cq=true"
  $D --listen=127.0.0.1:$port --data-dir=/tmp/ab/data --ops-listen= --drain-grace=0s $flags > /tmp/ab/d.log 2>&1 & pid=$!
  for i in $(seq 100); do grep -q '"serving"' /tmp/ab/d.log && break; sleep 0.05; done
  t0=$(awk '{print $14+$15}' /proc/$pid/stat)
  out=$($B --target=127.0.0.1:$port --connections=$2 --streams=$3 --duration=4s --warmup=1s --mix=set:1 --value-bytes=100 --json 2>/dev/null)
  t1=$(awk '{print $14+$15}' /proc/$pid/stat)
  kill $pid; wait $pid 2>/dev/null
  python3 - "$out" "$t0" "$t1" "$1" "$2x$3" <<'PY'
import json,sys
d=json.loads(sys.argv[1]); ticks=int(sys.argv[3])-int(sys.argv[2])
calls=d["ok_throughput"]*(d["elapsed_s"]+d["warmup_s"])
rate=d["ok_throughput"]
print("%s %s calls/s=%.0f server_cpu_us_per_call=%.1f" % (sys.argv[4], sys.argv[5], rate, ticks*1e4/max(calls,1)))
PY
}
for round in 1 2 3; do for shape in "4 16" "16 64"; do for mode in inline cq; do run $mode $shape; done; done; done
