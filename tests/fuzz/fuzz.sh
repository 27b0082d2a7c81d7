#!/usr/bin/env bash
# The fuzz targets: libFuzzer (clang 14) with ASan and UBSan, built here
# from the module sources, outside Bazel, whose auto-configured toolchain is
# gcc (which has no libFuzzer).
#
#   tests/fuzz/fuzz.sh check [target...]   build, replay every committed input
#                                          (regressions/ and corpus/), then fuzz
#                                          each target DREY_FUZZ_SECONDS (5) s;
#                                          fails on any crash, leak, timeout or
#                                          sanitizer report (bazel/drey.sh test)
#   tests/fuzz/fuzz.sh run SECONDS [target...]  the longer run, same rules
#   tests/fuzz/fuzz.sh coverage [target...]     line coverage of the code each
#                                          target aims at, over the committed
#                                          corpus and what runs found since
#   tests/fuzz/fuzz.sh build               only build
#
# Work goes to DREY_FUZZ_DIR (default .fuzz/ in the checkout, ignored by git):
# the binaries, the corpus runs grow (corpus/<target>, kept between runs and
# never committed), and crash inputs (crashes/). A crash input becomes a
# regression by copying it to tests/fuzz/regressions/<target>/ with the fix.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
here=$top/tests/fuzz
work=${DREY_FUZZ_DIR:-$top/.fuzz}
cd "$top"

targets_all=(request journal recover snapshot token keys ops config status authz)

# What each target is for: the sources its coverage is reported over.
declare -A aims=(
  [request]="src/server/wire.c src/pipeline/validate.c src/descriptors/descriptors.c"
  [journal]="src/journal/frame.c"
  [recover]="src/journal/scan.c src/journal/frame.c"
  [snapshot]="src/snapshot/snapshot.c"
  [token]="src/auth/verify.c src/auth/auth.c src/auth/b64.c src/auth/cache.c"
  [keys]="src/auth/keys.c src/auth/b64.c"
  [ops]="src/ops/ops.c src/ops/json.c"
  [config]="src/config/config.c"
  [status]="src/client/status.c"
  [authz]="src/authz/policy.c src/authz/grants.c"
)
# Longest input tried (bytes).
declare -A max_len=(
  [request]=4096 [journal]=4096 [recover]=16384 [snapshot]=8192 [token]=4096 [keys]=8192 [ops]=2048 [config]=1024
  [status]=2048 [authz]=8192
)

say() { printf 'fuzz.sh: %s\n' "$*" >&2; }

cc=${CC_FUZZ:-clang-14}
cxx=${CXX_FUZZ:-clang++-14}
cflags=(-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-missing-braces -g -O1 -fno-omit-frame-pointer
        -Iinclude -Igen -I. -I"$work/gen_build_info")
libs=(-lgrpc -lgpr -labsl_base -labsl_synchronization -lprotobuf-c -ljwt -ljansson -lssl -lcrypto -lmicrohttpd -lpthread -lm)

# Every module's sources (not the programs' mains), compiled once per build
# into an archive; a target links only the objects it reaches.
sources() {
  find src gen -name '*.c' -o -name '*.cc' | grep -v -e '^src/dreyd/' -e '^src/cli/' -e '^src/bench/' | sort
}

# build VARIANT FLAGS...: fuzz (ASan+UBSan) or cov (source-based coverage).
# The header Bazel stamps (//:build_info_h), written the same way here.
build_info() {
  local h=$work/gen_build_info/drey_build_info.h rev
  rev=$(git rev-parse HEAD 2>/dev/null) || rev=unknown
  mkdir -p "${h%/*}"
  printf '#define DREY_BUILD_VERSION "%s"\n#define DREY_BUILD_REVISION "%s"\n#define DREY_BUILD_MODE "fuzz"\n' \
    "$(tr -d ' \n' < VERSION)" "$rev" > "$h.new"
  if cmp -s "$h.new" "$h"; then rm "$h.new"; else mv "$h.new" "$h"; fi
}

build() {
  build_info
  local variant=$1
  shift
  local out=$work/$variant obj=$work/$variant/obj
  mkdir -p "$obj"
  local flags=("${cflags[@]}" "$@")
  # Recompile a source when it or any header changed since the archive.
  local stamp=$out/libdrey.a
  if [ ! -f "$stamp" ] || [ -n "$(find src gen include "$work/gen_build_info" -newer "$stamp" -print -quit)" ] ||
     [ "$(cat "$out/flags" 2>/dev/null)" != "${flags[*]}" ]; then
    rm -f "$obj"/*.o
    # C++ (a module's abseil calls): the same flags but the C standard
    sources | xargs -P "${DREY_FUZZ_JOBS:-2}" -I{} sh -c \
      'o="$1/$(printf %s "$2" | tr / _).o"
       case $2 in *.cc) exec "$5" -c "$2" -o "$o" $(printf %s "$4" | sed "s/-std=c11/-std=c++17/") ;; esac
       exec "$3" -c "$2" -o "$o" $4' _ "$obj" {} "$cc" "${flags[*]}" "$cxx"
    rm -f "$stamp"
    ar rcs "$stamp" "$obj"/*.o
    printf '%s' "${flags[*]}" > "$out/flags"
  fi
  local t
  for t in "${targets_all[@]}"; do
    if [ ! -x "$out/$t" ] || [ "$here/${t}_fuzz.c" -nt "$out/$t" ] || [ "$stamp" -nt "$out/$t" ] ||
       [ "$here/fuzz_util.h" -nt "$out/$t" ]; then
      "$cc" "${flags[@]}" -fsanitize=fuzzer "$here/${t}_fuzz.c" "$stamp" "${libs[@]}" -o "$out/$t"
    fi
  done
}

build_fuzz() {
  say "building (clang, libFuzzer, ASan+UBSan) in $work/fuzz"
  build fuzz -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# Inputs committed for a target: its seeds and its regressions.
committed() {
  local t=$1 d
  for d in "$here/corpus/$t" "$here/regressions/$t"; do
    [ -d "$d" ] && printf '%s\n' "$d"
  done
  return 0
}

# fuzz_one TARGET SECONDS: replays the regressions one by one, then fuzzes
# (libFuzzer first runs every committed input and what earlier runs found).
# Prints one summary line; returns non-zero on any finding.
fuzz_one() {
  local t=$1 secs=$2 bin=$work/fuzz/$1 log=$work/logs/$1.log
  mkdir -p "$work/corpus/$t" "$work/crashes" "$work/logs"
  if [ -d "$here/regressions/$t" ] && [ -n "$(ls -A "$here/regressions/$t")" ]; then
    if ! "$bin" -runs=1 -timeout=10 -rss_limit_mb=2048 "$here/regressions/$t"/* > "$log.replay" 2>&1; then
      tail -40 "$log.replay" >&2
      say "$t: a committed regression input fails again (log: $log.replay)"
      return 1
    fi
  fi
  local dirs
  mapfile -t dirs < <(committed "$t")
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="${max_len[$t]}" \
       -print_final_stats=1 -artifact_prefix="$work/crashes/$t-" "$work/corpus/$t" "${dirs[@]}" > "$log" 2>&1; then
    grep -A40 -m1 -E '^==[0-9]+==|ERROR: libFuzzer|runtime error|SUMMARY' "$log" >&2 || tail -40 "$log" >&2
    say "$t: FINDING (log: $log; input: $(ls -t "$work/crashes/$t-"* 2>/dev/null | head -1))"
    return 1
  fi
  local execs rate cov ft units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  units=$(ls "$work/corpus/$t" | wc -l)
  printf '%-9s %6ss %10s execs %8s/s  edges %5s  features %6s  corpus %5s\n' "$t" "$secs" "$execs" "$rate" \
    "${cov:-?}" "${ft:-?}" "$units"
}

run_all() {
  local secs=$1
  shift
  local ts=("$@") t failed=()
  [ "${#ts[@]}" -gt 0 ] || ts=("${targets_all[@]}")
  for t in "${ts[@]}"; do
    [ -n "${aims[$t]:-}" ] || { say "no target $t (have: ${targets_all[*]})"; exit 2; }
  done
  build_fuzz
  for t in "${ts[@]}"; do
    fuzz_one "$t" "$secs" || failed+=("$t")
  done
  if [ "${#failed[@]}" -gt 0 ]; then
    say "findings in: ${failed[*]}"
    exit 1
  fi
  say "no findings (${#ts[@]} targets, ${secs}s each)"
}

coverage() {
  local ts=("$@") t
  [ "${#ts[@]}" -gt 0 ] || ts=("${targets_all[@]}")
  say "building with source-based coverage in $work/cov"
  build cov -fsanitize=fuzzer-no-link -fprofile-instr-generate -fcoverage-mapping
  mkdir -p "$work/cov/profiles"
  for t in "${ts[@]}"; do
    local dirs files
    mapfile -t dirs < <(committed "$t")
    mkdir -p "$work/corpus/$t"
    rm -f "$work/cov/profiles/$t".*
    LLVM_PROFILE_FILE="$work/cov/profiles/$t.%p.profraw" "$work/cov/$t" -runs=0 "$work/corpus/$t" "${dirs[@]}" \
      > "$work/logs/$t.cov.log" 2>&1 || { tail -20 "$work/logs/$t.cov.log" >&2; exit 1; }
    llvm-profdata-14 merge -sparse "$work/cov/profiles/$t".*.profraw -o "$work/cov/profiles/$t.profdata"
    read -ra files <<< "${aims[$t]}"
    printf '%s (inputs: %s committed, %s found by runs)\n' "$t" "$(find "${dirs[@]}" -type f | wc -l)" \
      "$(find "$work/corpus/$t" -type f | wc -l)"
    # columns: file, regions (missed, cover), functions (missed, executed),
    # lines (missed, cover), branches (missed, cover)
    llvm-cov-14 report "$work/cov/$t" -instr-profile="$work/cov/profiles/$t.profdata" "${files[@]}" |
      awk '$2 ~ /^[0-9]+$/ {printf "  %-24s lines %5s/%-5s %8s   branches %5s/%-5s %8s   regions %7s\n",
                            $1, $8 - $9, $8, $10, $11 - $12, $11, $13, $4}' | sed "s|$top/src/||"
  done
}

case "${1:-}" in
  build) build_fuzz ;;
  check) shift; run_all "${DREY_FUZZ_SECONDS:-5}" "$@" ;;
  run)
    shift
    [ "$#" -ge 1 ] || { say "usage: fuzz.sh run SECONDS [target...]"; exit 2; }
    secs=$1
    shift
    run_all "$secs" "$@"
    ;;
  coverage) shift; coverage "$@" ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
