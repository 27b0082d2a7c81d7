#!/usr/bin/python3
"""Turns a benchmark's results.json into report.md, throughput.{png,svg} and p99.{png,svg}.

    /usr/bin/python3 tests/bench/report.py tests/bench/results/<date>

bench.py calls it at the end of a run; run it again to re-render without re-measuring. Rounds of
the same scenario are combined by taking the best one (see aggregate()); every ratio is computed from
figures of the same run.
"""
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import bench_cluster  # noqa: E402

ORDER = ["health", "get", "get_jwt", "set_eph", "set_dur", "set_dur_default_admission", "etcd_put", "etcd_range",
         "redis_set_always", "redis_set_no", "redis_get"]
PLOTTED = [s for s in ORDER if s != "set_dur_default_admission"]
METRICS = ["throughput", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms",
           "server_cpu_us_per_call", "client_cpu_us_per_call", "server_cpu_cores", "client_cpu_cores",
           "other_cpu_cores", "steal_cores", "forwarded_share"]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs):
    """One row per (scenario, connections, streams): the best round (the highest throughput), with its
    own latencies and CPU figures. On a shared machine other work only ever slows a run down, so the
    best of several rounds is the closest to what the machine can do; the worst round and the other
    processes' CPU use are kept to show how much the others took."""
    groups = {}
    for r in runs:
        groups.setdefault((r["scenario"], r["connections"], r["streams"]), []).append(r)
    rows = {}
    for key, rs in groups.items():
        best = max(rs, key=lambda r: r["throughput"])
        row = {k: best[k] for k in ("scenario", "series", "system", "tool", "connections", "streams", "concurrency")}
        for m in METRICS:
            row[m] = best.get(m)
        if best.get("journal"):
            row["journal"] = dict(best["journal"])
        row["rounds"] = len(rs)
        row["best_round"] = best["round"]
        row["throughput_min"] = min(r["throughput"] for r in rs)
        row["throughput_median"] = median([r["throughput"] for r in rs])
        row["ok"] = sum(r["ok"] for r in rs)
        row["errors"] = sum(r["errors"] for r in rs)
        reasons = {}
        for r in rs:
            for e in r.get("errors_by_status", []):
                k = "%s %s" % (e["code"], e["reason"]) if e["reason"] else e["code"]
                reasons[k] = reasons.get(k, 0) + e["count"]
        row["error_reasons"] = reasons
        rows[key] = row
    return rows


def best_h2load(res):
    """The best round of each h2load scenario, keyed by (scenario, connections, streams)."""
    out = {}
    for h in res.get("h2load", []):
        k = (h["scenario"], h["connections"], h["streams"])
        if k not in out or h["throughput"] > out[k]["throughput"]:
            out[k] = h
    return out


def row_of(rows, scenario, conns=None, streams=None, concurrency=None):
    for (s, c, st), row in rows.items():
        if s != scenario:
            continue
        if conns is not None and (c, st) != (conns, streams):
            continue
        if concurrency is not None and c * st != concurrency:
            continue
        return row
    return None


def cpu_cost(x):
    """CPU per call of the server and the load tool together, or None."""
    if not x or x.get("server_cpu_us_per_call") is None or x.get("client_cpu_us_per_call") is None:
        return None
    return x["server_cpu_us_per_call"] + x["client_cpu_us_per_call"]


def ratio(name, num, den, target=None, higher_is_better=True, note="", cost=None):
    """num ÷ den against a target. For a throughput ratio, cost=(num's row, den's row) adds the same
    ratio computed from CPU per call (den's cost ÷ num's cost): what the throughputs would be on a
    saturated machine with nothing else running, which other work on a shared box does not disturb."""
    out = {"name": name, "value": None, "target": target, "higher_is_better": higher_is_better, "met": None,
           "note": note, "by_cpu": None}
    if cost is not None:
        a, b = cpu_cost(cost[0]), cpu_cost(cost[1])
        if a and b:
            out["by_cpu"] = b / a
    if num is None or den is None or den == 0:
        out["note"] = note or "not measured"
        return out
    out.update(value=num / den, numerator=num, denominator=den)
    if target is not None:
        out["met"] = out["value"] >= target if higher_is_better else out["value"] <= target
    return out


def compute_ratios(res, rows):
    top = max((tuple(l) for l in res["settings"]["levels"]), key=lambda l: l[0] * l[1])
    tc, ts = top
    lvl = "%d×%d" % (tc, ts)
    row = lambda s, c=tc, st=ts: row_of(rows, s, c, st)  # noqa: E731
    g = lambda s, c=tc, st=ts, m="throughput": (row(s, c, st) or {}).get(m)  # noqa: E731

    def tput(name, a, b, target=None, note="", level=(tc, ts), level_b=None):
        """Throughput of scenario a ÷ scenario b (rows of the table)."""
        ra, rb = row(a, *level), row(b, *(level_b or level))
        return ratio(name, ra and ra["throughput"], rb and rb["throughput"], target, note=note, cost=(ra, rb))

    out = []
    out.append(tput("drey Get ÷ Health/Check (ceiling), %s" % lvl, "get", "health", 0.9,
                    note="also the admission target: Get through the full chain ≥ 0.9× Health/Check"))
    out.append(tput("drey Get ÷ Health/Check (ceiling), 1×1", "get", "health", 0.9, level=(1, 1)))
    h2 = best_h2load(res)
    hg, hh = h2.get(("get", tc, ts)), h2.get(("health", tc, ts))
    out.append(ratio("drey Get ÷ Health/Check measured with h2load, %s" % lvl, hg and hg["throughput"],
                     hh and hh["throughput"], 0.9, note="the same ratio with a client that costs less CPU",
                     cost=(hg, hh)))
    out.append(tput("drey durable Set ÷ etcd Put, %s" % lvl, "set_dur", "etcd_put", 1.3))
    redis_c = max(res["settings"]["redis_clients"])
    redis_always = row_of(rows, "redis_set_always", concurrency=redis_c)
    near = min((tuple(l) for l in res["settings"]["levels"]), key=lambda l: abs(l[0] * l[1] - redis_c))
    rn = row("set_dur", *near)
    out.append(ratio("drey durable Set (%d×%d) ÷ Redis SET appendfsync always (%d clients)" % (near[0], near[1], redis_c),
                     rn and rn["throughput"], redis_always and redis_always["throughput"], 1.0,
                     note="nearest concurrency to redis-benchmark's 50 clients", cost=(rn, redis_always)))
    best = max((r for r in rows.values() if r["scenario"] == "set_dur"), key=lambda r: r["throughput"], default=None)
    if best:
        out.append(ratio("drey durable Set, best level (%d×%d) ÷ Redis SET appendfsync always (%d clients)"
                         % (best["connections"], best["streams"], redis_c), best["throughput"],
                         redis_always and redis_always["throughput"], 1.0, cost=(best, redis_always)))
    hd = h2.get(("set_dur", tc, ts))
    if hd:
        out.append(ratio("drey durable Set driven by h2load (%s) ÷ Redis SET appendfsync always (%d clients)"
                         % (lvl, redis_c), hd["throughput"], redis_always and redis_always["throughput"], 1.0,
                         note="both with a light single-threaded client (h2load: one key)", cost=(hd, redis_always)))
    out.append(tput("drey Get ÷ etcd Range serializable, %s" % lvl, "get", "etcd_range"))
    out.append(ratio("drey durable Set p50 ÷ etcd Put p50, 1×1", g("set_dur", 1, 1, "p50_ms"),
                     g("etcd_put", 1, 1, "p50_ms"), 1.0, higher_is_better=False))
    mem = res.get("memory", {})
    out.append(ratio("drey memory per entry ÷ Redis used_memory per key (%s entries)" % format(mem.get("entries", 0), ","),
                     mem.get("drey_jemalloc_bytes_per_entry"), mem.get("redis_used_memory_per_key"), 1.0,
                     higher_is_better=False, note="drey: jemalloc-allocated bytes; Redis: used_memory (also jemalloc)"))
    for c, st in res["settings"]["levels"]:
        if c * st >= 64:
            out.append(tput("drey durable Set ÷ ephemeral Set, %d×%d" % (c, st), "set_dur", "set_eph", 0.5,
                            note="group commit at work (durability issue)", level=(c, st)))
    fd = res.get("fdatasync", {}).get("p50_ms")
    d1, g1 = g("set_dur", 1, 1, "p50_ms"), g("get", 1, 1, "p50_ms")
    j1 = ((row("set_dur", 1, 1) or {}).get("journal") or {}).get("fsync_mean_ms")
    out.append(ratio("(drey durable Set p50 − Get p50) ÷ fdatasync p50, 1×1", d1 - g1 if d1 and g1 else None, fd,
                     note="durability issue: 'at one stream, latency close to one fdatasync': what durability adds to "
                          "a call, in fdatasyncs (durable Set p50 %s ms, Get p50 %s ms, fdatasync p50 %s ms on the idle "
                          "disk, %s ms mean in the journal during the run)" % (_fmt(d1, 3), _fmt(g1, 3), _fmt(fd, 3),
                                                                              _fmt(j1, 3))))
    for c, st in res["settings"]["levels"]:
        if (c, st) in ((1, 1), (tc, ts)):
            out.append(tput("drey Get with a cached RS256 token ÷ anonymous Get, %d×%d" % (c, st), "get_jwt", "get",
                            0.9, level=(c, st)))
    rec = res.get("recovery", {})
    n = rec.get("entries", 0)
    rp, sp = rec.get("replay", {}).get("ms"), rec.get("snapshot", {}).get("ms")
    note = "" if n == 1000000 else "measured with %s entries; target is for 1,000,000" % format(n, ",")
    out.append(ratio("journal replay of %s Sets, ms ÷ 2,000 ms" % format(n, ","), rp, 2000.0, 1.0,
                     higher_is_better=False, note=note))
    out.append(ratio("restart from a snapshot of %s entries, ms ÷ 1,000 ms" % format(n, ","), sp, 1000.0, 1.0,
                     higher_is_better=False, note=note))
    for h in h2.values():
        dr = row_of(rows, h["scenario"], h["connections"], h["streams"])
        out.append(ratio("h2load ÷ drey-bench, %s %d×%d" % (h["series"], h["connections"], h["streams"]),
                         h["throughput"], dr and dr["throughput"], cost=(h, dr),
                         note="independent client; server counted %s OK calls" % format(h["server_ok_calls"], ",")))
    return out


def _fmt(v, digits=2):
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return format(round(v), ",")
    return ("%." + str(digits) + "f") % v


# --- plots ------------------------------------------------------------------------------------

STYLE = {  # colour, dash type (drey solid, etcd dashed, Redis dotted)
    "health": ("#000000", 1), "get": ("#1f77b4", 1), "get_jwt": ("#17becf", 1), "set_eph": ("#2ca02c", 1),
    "set_dur": ("#d62728", 1), "etcd_put": ("#ff7f0e", 2), "etcd_range": ("#9467bd", 2),
    "redis_set_always": ("#8c564b", 3), "redis_set_no": ("#e377c2", 3), "redis_get": ("#7f7f7f", 3),
}


def plots(outdir, rows):
    data = os.path.join(outdir, ".plot-data")
    os.makedirs(data, exist_ok=True)
    series = []
    for s in PLOTTED:
        pts = sorted((r["concurrency"], r["throughput"], r["p99_ms"]) for r in rows.values() if r["scenario"] == s)
        if not pts:
            continue
        path = os.path.join(data, s + ".dat")
        with open(path, "w") as f:
            for c, t, p in pts:
                f.write("%d %f %f\n" % (c, t, p if p is not None else float("nan")))
        series.append((path, next(r["series"] for r in rows.values() if r["scenario"] == s), STYLE[s]))
    if not series:
        return []
    made = []
    terminals = [("png", "pngcairo size 1000,640 font 'DejaVu Sans,10'"), ("svg", "svg size 1000,640 dynamic")]
    for name, col, ylabel, ylog in (("throughput", 2, "calls per second", True), ("p99", 3, "p99 latency (ms)", True)):
        for ext, term in terminals:
            out = os.path.join(outdir, "%s.%s" % (name, ext))
            script = ["set terminal %s" % term, "set output '%s'" % out,
                      "set title '%s against concurrency (calls in flight)'" % ("Throughput" if name == "throughput" else "p99 latency"),
                      "set xlabel 'concurrency: connections × streams (Redis: clients)'", "set ylabel '%s'" % ylabel,
                      "set logscale x 2", "set grid", "set key outside right top", "set xrange [0.8:1500]",
                      "set xtics (1, 4, 16, 50, 64, 256, 1024)"]
            if ylog:
                script.append("set logscale y 10")
            plot = []
            for i, (path, title, (colour, dash)) in enumerate(series):
                plot.append("'%s' using 1:%d with linespoints lw 2 lc rgb '%s' dt %d pt %d title '%s'"
                            % (path, col, colour, dash, 5 + i % 9, title))
            script.append("plot " + ", \\\n  ".join(plot))
            p = subprocess.run(["gnuplot"], input="\n".join(script).encode(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
            if p.returncode == 0:
                made.append(os.path.basename(out))
            else:
                print("gnuplot (%s): %s" % (out, p.stderr.decode()[-500:]), file=sys.stderr)
    for f in os.listdir(data):
        os.unlink(os.path.join(data, f))
    os.rmdir(data)
    return made


# --- markdown -----------------------------------------------------------------------------------

def results_table(rows, order=ORDER):
    lines = ["| Scenario | conns × streams | calls/s | worst round | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | "
             "server CPU µs/call | client CPU µs/call | other load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for s in order:
        for r in sorted((r for r in rows.values() if r["scenario"] == s), key=lambda r: r["concurrency"]):
            conc = "%d × %d" % (r["connections"], r["streams"]) if r["tool"] != "redis-benchmark" \
                else "%d client%s" % (r["connections"], "" if r["connections"] == 1 else "s")
            if r["errors"]:
                err = "%s: %s" % (format(r["errors"], ","), ", ".join("%s %s" % (k, format(v, ","))
                                                                      for k, v in sorted(r["error_reasons"].items())))
            else:
                err = "0"
            worst = "—"
            if r["rounds"] > 1 and r["throughput"]:
                worst = "−%.0f%%" % (100 * (1 - r["throughput_min"] / r["throughput"]))
            p90 = _fmt(r["p90_ms"], 3) if r["p90_ms"] is not None else ("p95 " + _fmt(r.get("p95_ms"), 3))
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["series"], conc, _fmt(r["throughput"], 0), worst, _fmt(r["p50_ms"], 3), p90, _fmt(r["p99_ms"], 3),
                _fmt(r["p999_ms"], 3), err, _fmt(r["server_cpu_us_per_call"], 1),
                _fmt(r["client_cpu_us_per_call"], 1), _fmt(r.get("other_cpu_cores"), 2)))
    return lines


def ratios_table(ratios):
    lines = ["| Ratio | Value | By CPU per call | Target | |", "|---|---:|---:|---|---|"]
    for r in ratios:
        if r["target"] is None:
            target, verdict = "—", ""
        else:
            target = ("≥ " if r.get("higher_is_better", True) else "≤ ") + _fmt(r["target"], 2)
            verdict = "met" if r["met"] else ("**missed**" if r["met"] is not None else "")
        note = (" — " + r["note"]) if r.get("note") else ""
        lines.append("| %s%s | %s | %s | %s | %s |" % (r["name"], note, _fmt(r["value"], 2), _fmt(r.get("by_cpu"), 2),
                                                  target, verdict))
    return lines


def markdown(res, rows, ratios, images):
    m = res["machine"]
    s = res["settings"]
    L = ["# drey benchmark, %s" % res["date"], ""]
    L.append("Machine: %s × %s, kernel %s, %s GiB RAM, Debian %s; data directories on %s. Load average before "
             "the run: %s." % (m["nproc"], m["cpu"], m["kernel"], m["memory_gib"], m["versions"]["debian"],
                               m["data_filesystem"], " ".join(m["load_average_before"])))
    L.append("")
    L.append("Command: `%s` (%s mode: %d round%s of %.1f s per scenario after %.1f s of warmup, the best round "
             "reported; %s keys of %d bytes, values of %d bytes; whole run %s s)." % (
                 res["command"], s["mode"], s["rounds"], "" if s["rounds"] == 1 else "s", s["duration_ms"] / 1000,
                 s["warmup_ms"] / 1000, format(s["keys"], ","), s["key_bytes"], s["value_bytes"],
                 res.get("elapsed_s", "?")))
    L.append("")
    if s["mode"] == "quick":
        L += ["**A quick run:** one short round of each scenario, so no round makes up for a slow moment of "
              "the machine: its figures are noisy, and only rough ratios can be read from it.", ""]
    v = m["versions"]
    L.append("Versions: %s; %s; %s; libgrpc %s." % (v["etcd"].replace("\n", " "), v["redis"], v["h2load"], v["libgrpc"]))
    L.append("")
    L += ["## Throughput and latency", ""]
    L += results_table(rows)
    L.append("")
    L.append("Each row is the best of its rounds (other work on a shared machine only slows a run down); *worst "
             "round* says how far the slowest round fell behind it. Latency is the client's, from starting a call to "
             "its completion. CPU per call is the server process's and the load tool's CPU time over the run "
             "(warmup included) divided by the calls made: both share the same %s cores, so a heavier client leaves "
             "less for the server. *Other load* is the CPU (in cores) that other processes on the machine used "
             "during that round." % m["nproc"])
    L.append("")
    for img in images:
        if img.endswith(".png"):
            L.append("![%s](%s)" % (img[:-4], img))
    L.append("")
    L += ["## Ratios", "",
          "*Value* divides the measured figures. For throughput ratios, *by CPU per call* divides the CPU that "
          "the server and the load tool spent per call instead (the denominator's cost ÷ the numerator's): on a "
          "saturated machine the two agree, and the CPU figure is not disturbed by other work on a shared box.", ""]
    L += ratios_table(ratios)
    L.append("")
    fd = res.get("fdatasync", {})
    mem = res.get("memory", {})
    rec = res.get("recovery", {})
    L += ["## Disk, memory and recovery", ""]
    if fd:
        L.append("- fdatasync of a 320-byte append to a preallocated file (%d samples): p50 %s ms, p90 %s ms, p99 %s ms."
                 % (fd["iterations"], _fmt(fd["p50_ms"], 3), _fmt(fd["p90_ms"], 3), _fmt(fd["p99_ms"], 3)))
    if mem:
        L.append("- %s entries (%d-byte keys, %d-byte values) loaded into a durable dreyd in %s s: per entry %s B "
                 "allocated (jemalloc), %s B accounted by the store, %s B RSS. Redis, same keys and values: %s B "
                 "used_memory, %s B RSS per key." % (
                     format(mem.get("entries", 0), ","), mem.get("key_bytes", 0), mem.get("value_bytes", 0),
                     _fmt(mem.get("load_s"), 1), _fmt(mem.get("drey_jemalloc_bytes_per_entry"), 1),
                     _fmt(mem.get("drey_used_bytes_per_entry"), 1), _fmt(mem.get("drey_rss_bytes_per_entry"), 1),
                     _fmt(mem.get("redis_used_memory_per_key"), 1), _fmt(mem.get("redis_rss_per_key"), 1)))
    if rec:
        L.append("- Restart after those Sets (journal replay): %s ms for %s records. After Admin/Snapshot (%s ms): "
                 "restart in %s ms, %s records replayed after the snapshot." % (
                     _fmt(rec.get("replay", {}).get("ms"), 0), format(rec.get("replay", {}).get("replayed_records") or 0, ","),
                     _fmt(rec.get("snapshot_call_ms"), 0), _fmt(rec.get("snapshot", {}).get("ms"), 0),
                     format(rec.get("snapshot", {}).get("replayed_records") or 0, ",")))
    L.append("")
    dur = [r for r in sorted(rows.values(), key=lambda r: r["concurrency"]) if r.get("journal")]
    if dur:
        L += ["## Group commit", "", "From dreyd's `drey_journal_batch_records` and `drey_journal_fsync_duration_seconds` "
              "over each durable run (the best round).", "",
              "| Scenario | conns × streams | calls/s | records per batch | batches/s | fdatasync mean ms | time in fdatasync |",
              "|---|---|---:|---:|---:|---:|---:|"]
        for r in dur:
            j = r["journal"]
            L.append("| %s | %d × %d | %s | %s | %s | %s | %s |" % (
                r["series"], r["connections"], r["streams"], _fmt(r["throughput"], 0), _fmt(j["records_per_batch"], 1),
                _fmt(j["batches_per_s"], 0), _fmt(j["fsync_mean_ms"], 3),
                "—" if j["fsync_busy_fraction"] is None else "%.0f%%" % (100 * j["fsync_busy_fraction"])))
        L.append("")
    others = [r.get("other_cpu_cores") for r in res.get("runs", []) if r.get("other_cpu_cores") is not None]
    if others:
        L += ["Other processes on the machine used %s cores on median and %s at most during the runs (steal: %s "
              "cores at most; the run waited %s s in all for quieter moments before measuring); the load tool and "
              "the server had the rest." % (
                  _fmt(statistics.median(others), 2), _fmt(max(others), 2),
                  _fmt(max(r.get("steal_cores") or 0 for r in res["runs"]), 2), _fmt(res.get("quiet_waited_s"), 1)), ""]
    if res.get("h2load"):
        L += ["## h2load cross-check", "",
              "The same dreyd driven by h2load (nghttp2), an independent HTTP/2 client sending one pre-encoded "
              "request body; dreyd's own `drey_requests_total{code=\"OK\"}` counter confirms the calls succeeded at "
              "the gRPC level (h2load only sees HTTP 200). Best round of each, like the table above.", "",
              "| Scenario | conns × streams | h2load calls/s | drey-bench calls/s | h2load mean ms | server-counted OK | server CPU µs/call | h2load CPU µs/call |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
        for h in best_h2load(res).values():
            dr = row_of(rows, h["scenario"], h["connections"], h["streams"])
            L.append("| %s | %d × %d | %s | %s | %s | %s | %s | %s |" % (
                h["series"], h["connections"], h["streams"], _fmt(h["throughput"], 0),
                _fmt(dr and dr["throughput"], 0), _fmt(h.get("mean_ms"), 3), format(h["server_ok_calls"], ","),
                _fmt(h.get("server_cpu_us_per_call"), 1), _fmt(h.get("client_cpu_us_per_call"), 1)))
        L.append("")
    L += ["## Setup", "",
          "- dreyd: `--listen=127.0.0.1:0 --ops-listen=127.0.0.1:0 --data-dir=<tmp>` plus `%s` for the load "
          "scenarios (the *default admission* row runs without them); ephemeral nodes add `--ephemeral`, the token "
          "node `--jwt-keys-dir` with an RS256 public key (one token, and one principal, per connection); the "
          "durable node runs with its defaults (`--fsync=always`, group commit). The memory/recovery node loads "
          "with `--fsync=never` (the journal holds the same records)." % " ".join(res["dreyd_load_flags"]),
          "- etcd: one member, default settings, plaintext on loopback; Put and serializable Range through "
          "drey-bench's raw mode with bodies encoded by `protoc --encode` (tests/bench/etcd_rpc.proto).",
          "- Redis: `redis-benchmark -t set|get -c <clients> -d %d -r %d` against `redis-server --appendonly yes "
          "--appendfsync always` and `--appendonly yes --appendfsync no` (its keys are `key:` + 12 digits, 16 "
          "bytes); GET runs on the appendfsync-no server over a preloaded key space. The memory comparison loads "
          "drey's own 8-byte keys into a Redis without persistence." % (
              s["value_bytes"], s["keys"]),
          "- Reads and etcd Puts run on preloaded key spaces; keys are uniform over the key space. h2load sends one "
          "request body, so its Get and Set use a single key.", ""]
    if res.get("failures"):
        L += ["## Failures", ""] + ["- %s: %s" % (f["what"], f["error"].splitlines()[0] if f["error"] else "")
                                     for f in res["failures"]] + [""]
    return "\n".join(L)

# --- the cluster part (tests/bench/bench_cluster.py) and issue #25's targets ----------------------

NOT_MEASURED = "not measured in this run"


def server_cpu(x):
    return x and x.get("server_cpu_us_per_call")


def forwarded_cost(mixed, direct):
    """Server CPU of one forwarded call (or pipelined operation), from a run through one node whose
    share of forwarded calls the nodes counted and a directly routed run: the mixed run's cost is
    share × forwarded + (1 − share) × direct."""
    share = mixed and mixed.get("forwarded_share")
    if not share or not server_cpu(mixed) or not server_cpu(direct):
        return None
    return (server_cpu(mixed) - server_cpu(direct) * (1 - share)) / share


def issue25_targets(res, rows):
    """Every target of issue #25, as ratio rows: measured, or said not to be."""
    c = res.get("cluster")
    out = []
    if not c:
        return [ratio("the cluster part", None, None, note="the cluster part did not run")]
    levels = [tuple(l) for l in c["levels"]]
    top = max(levels, key=lambda l: l[0] * l[1])
    row = lambda sc, l: row_of(rows, sc, *l)  # noqa: E731
    for l in levels:
        lvl = "%d×%d" % l
        a, b = row("c3_get", l), row("one_get", l)
        out.append(ratio("3-node RF 2 cluster Get (--cluster) ÷ one node's Get, %s, throughput" % lvl,
                         a and a["throughput"], b and b["throughput"], 0.9, cost=(a, b)))
        a, b = row("c3_set", l), row("one_set", l)
        out.append(ratio("3-node RF 2 cluster durable Set ÷ one node's durable Set, %s, throughput" % lvl,
                         a and a["throughput"], b and b["throughput"], 0.6, cost=(a, b),
                         note="the cluster's Set waits for the backup's fsync"))
    for l in levels:
        a, b = row("c3_get", l), row_of(rows, "rc_get", l[0] * l[1], 1)
        out.append(ratio("3-node RF 2 cluster Get (%d×%d) ÷ Redis Cluster 3+3 GET (%d clients), throughput"
                         % (l[0], l[1], l[0] * l[1]), a and a["throughput"], b and b["throughput"], 0.5, cost=(a, b)))
        a, b = row("c3_set", l), row_of(rows, "rc_set", l[0] * l[1], 1)
        out.append(ratio("3-node RF 2 cluster durable Set (%d×%d) ÷ Redis Cluster 3+3 SET appendfsync always "
                         "(%d clients), throughput" % (l[0], l[1], l[0] * l[1]), a and a["throughput"],
                         b and b["throughput"], cost=(a, b),
                         note="no target: Redis replicates asynchronously, drey waits for the backup's fsync"))
    depth = c.get("pipeline_depth")
    for op, name in (("get", "Get"), ("set", "durable Set")):
        fwd, local, one = (row_of(rows, sc + op) for sc in ("c3rf1_pipe_fwd_", "c3rf1_pipe_", "one_pipe_"))
        share = fwd and fwd.get("forwarded_share")
        f = forwarded_cost(fwd, local)
        out.append(ratio("forwarded pipelined %s ÷ a local one, depth %s, server CPU per operation (3 nodes, RF 1)"
                         % (name, depth or "—"), f, server_cpu(local), 1.5, higher_is_better=False,
                         note=NOT_MEASURED if not depth else "derived from the run through n1 (%s of its operations "
                         "forwarded)" % ("—" if not share else "%.0f%%" % (100 * share))))
        out.append(ratio("topology-aware pipelined %s, 3 nodes (RF 1) ÷ one node, by server CPU per operation "
                         "(one node's ÷ the 3 nodes')" % name, server_cpu(one), server_cpu(local), 0.9,
                         note=NOT_MEASURED if not depth else ""))
    a, b = row("c3_set", top), row("c3rf1_set", top)
    out.append(ratio("durable Set RF 2 ÷ RF 1, %d×%d, by server CPU per write (RF 1's ÷ RF 2's, 3 nodes)" % top,
                     server_cpu(b), server_cpu(a), 0.85,
                     note="throughput RF 2 ÷ RF 1: %s" % _fmt(a and b and a["throughput"] / b["throughput"])))
    for l in levels:
        for op, name in (("get", "Get"), ("set", "durable Set")):
            a, b = row("c1_" + op, l), row("one_" + op, l)
            out.append(ratio("one-node cluster ÷ standalone node, %s %d×%d, server CPU per call" % (name, l[0], l[1]),
                             server_cpu(a), server_cpu(b), 1.05, higher_is_better=False))
    pipe = c.get("pipeline") or []
    for op, name, redis in (("get", "Get", "redis"), ("set", "durable Set", "redis appendfsync always")):
        a, b = (pipeline_row(pipe, op, sys_, mode) for sys_, mode in (("drey", "Pipeline depth 16"), (redis, "-P 16")))
        out.append(ratio("pipelined %s, depth 16 ÷ Redis -P 16 (%s), server CPU per operation, one node" % (name, redis),
                         a and a["server_cpu_us_per_op"], b and b["server_cpu_us_per_op"], 1.5,
                         higher_is_better=False, note="" if pipe else NOT_MEASURED))
    for op, name in (("get", "Get"), ("set", "durable Set")):
        fwd, direct = row("c3_fwd_" + op, top), row("c3_" + op, top)
        share = fwd and fwd.get("forwarded_share")
        one = forwarded_cost(fwd, direct)
        out.append(ratio("one forwarded %s ÷ a directly routed one, %d×%d, server CPU per call (3 nodes)"
                         % (name, top[0], top[1]), one, server_cpu(direct),
                         note="derived from the run through n1 (%s of its calls forwarded); no target"
                              % ("—" if not share else "%.0f%%" % (100 * share))))
    return out


def pipeline_row(pipe, op, system, mode):
    return next((r for r in pipe if (r["op"], r["system"], r["mode"]) == (op, system, mode)), None)


def pipeline_markdown(pipe):
    L = ["## Pipelines, one node beside Redis", "",
         "tests/bench/pipeline.py: one durable dreyd under drey-bench, 16 connections, unary with 1, 16 and 64 calls "
         "in flight per connection and through Pipeline at depths 1, 16 and 64; Redis under redis-benchmark -c 16 "
         "-P N (SET with appendfsync always, GET without persistence). Best round of each.", "",
         "| op | system | mode | ops/s | server CPU µs/op | p50 ms | p99 ms |", "|---|---|---|---:|---:|---:|---:|"]
    for r in sorted(pipe, key=lambda r: (r["op"], r["system"] != "drey", r["system"])):
        L.append("| %s | %s | %s | %s | %s | %s | %s |" % (r["op"], r["system"], r["mode"], _fmt(r["throughput"], 0),
                                                           _fmt(r["server_cpu_us_per_op"], 2), _fmt(r.get("p50_ms"), 3),
                                                           _fmt(r.get("p99_ms"), 3)))
    return L + [""]


def cluster_markdown(res, rows):
    c = res.get("cluster")
    if not c:
        return ""
    L = ["", "## Clusters, beside Redis Cluster", "",
         "In rounds like the single node's (every system once per round and level, interleaved): a 3-node drey "
         "cluster with RF 2 under `drey-bench --cluster`, the same cluster entered through n1 by a plain client "
         "(forwarding), a 3-node cluster with RF 1, a standalone dreyd and a one-node cluster (all durable, "
         "fsync always, admission limits opened as in tests/bench/cluster.py), and Redis Cluster with 3 masters "
         "and 3 replicas (`appendfsync always`, `redis-benchmark --cluster`, clients = connections × streams). "
         "Server CPU per call counts every node of a cluster.", ""]
    L += results_table(rows, bench_cluster.ORDER)
    L += ["", "## Targets of issue #25", "",
          "Every target of the issue, measured in this run or said not to be. *By CPU per call* is the "
          "denominator's CPU per call (server and load tool) ÷ the numerator's.", ""]
    L += ratios_table(res.get("targets") or [])
    if res.get("notes"):
        L += ["", "Why each missed target is missed, with the profiles: [%s](%s)." % (res["notes"], res["notes"])]
    L.append("")
    if c.get("pipeline"):
        L += pipeline_markdown(c["pipeline"])
    ev = c.get("eviction")
    if ev:
        L += ["## Eviction hit ratio", "",
              "tests/bench/eviction.py: %s keys, %s reads and writes (zipf 0.99, 90%% cache-aside reads), memory "
              "for about 10%% of the keys." % (format(ev["keys"], ","), format(ev["ops"], ",")), "",
              "| system and policy | workload | hit ratio | keys held |", "|---|---|---:|---:|"]
        for h in ev.get("hit_ratio", []):
            L.append("| %s %s | %s | %s | %s |" % (h.get("system", ""), h.get("policy", ""), h.get("workload", ""),
                                                   _fmt(h.get("hit_ratio"), 3), format(int(h.get("keys_held") or 0), ",")))
        L += ["", "dreyd's CPU per write while every write evicts, by policy: " + ", ".join(
            "%s %s µs" % (r["policy"], _fmt(r.get("cpu_us_per_write"), 1)) for r in ev.get("cpu", [])) + ".", ""]
    w = c.get("watch")
    if w:
        L += ["## Watch latency", "",
              "tests/bench/watch_latency against a durable dreyd: from a Set's acknowledgement to its event at "
              "every watcher.", "", "| watchers | writes | ack → event p50 µs | p99 µs | Set p50 µs |",
              "|---:|---:|---:|---:|---:|"]
        for r in w:
            L.append("| %d | %d | %s | %s | %s |" % (r["watchers"], r["writes"], _fmt(r.get("delay", {}).get("p50_us"), 1),
                                                   _fmt(r.get("delay", {}).get("p99_us"), 1),
                                                   _fmt(r.get("set", {}).get("p50_us"), 1)))
        L.append("")
    jd = c.get("join_drain")
    if jd:
        L += ["## Join and drain against store size", "",
              "tests/bench/join_drain.py: two ephemeral nodes loaded, a third joins, then n1 drains (RF 2, 256 "
              "partitions, 100-byte values).", "",
              "| entries | RF | join settles | entries moved | drain settles | drained node exits |",
              "|---:|---:|---:|---:|---:|---:|"]
        for r in jd:
            L.append("| %s | %d | %.2f s | %s | %.2f s | %.2f s |" % (
                format(r["entries"], ","), r["rf"], r["join_s"], format(int(r["join_moved_entries"]), ","), r["drain_s"],
                r["drain_exit_s"]))
        L.append("")
    return "\n".join(L)



def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    with open(os.path.join(outdir, "results.json")) as f:
        res = json.load(f)
    rows = aggregate(res.get("runs", []))
    ratios = compute_ratios(res, rows)
    images = plots(outdir, rows)
    every = ORDER + bench_cluster.ORDER
    res["summary"] = sorted(rows.values(), key=lambda r: (every.index(r["scenario"]) if r["scenario"] in every
                                                          else len(every), r["concurrency"]))
    res["targets"] = issue25_targets(res, rows)
    # Written by hand after a run: why its missed targets are missed, with profiles.
    if os.path.exists(os.path.join(outdir, "notes.md")):
        res["notes"] = "notes.md"
    res["ratios"] = ratios
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(markdown(res, rows, ratios, images))
        f.write(cluster_markdown(res, rows))
    print("\n".join(ratios_table(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
