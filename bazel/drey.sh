#!/usr/bin/env bash
# The README's two commands, and what they share.
#
#   bazel/drey.sh serve [dreyd flags]   install what building and serving need, build dreyd
#                                       and drey, run dreyd (no test tools, no npm)
#   bazel/drey.sh test                  install what is missing, run every test,
#                                       the fuzz targets for a few seconds each,
#                                       then every test again under ASan+UBSan
#   bazel/drey.sh deps                  only install what is missing (tests' too)
#
# Safe to run twice: each step checks before it acts. Needs root (or sudo)
# only when Debian packages are missing.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

# Debian 12 packages the build and the tests use. Node.js comes from Debian
# when the machine has none.
#
# Go (tests/interop/go): one consistent APIv1 set. golang-etcd-server-dev
# pulls golang-goprotobuf-dev, which pins github.com/golang/protobuf 1.3 and
# its generator (protoc-gen-go-1-3) and conflicts with the APIv2
# `protoc-gen-go` package; grpc-go and genproto accept the 1.3 set, so the
# Go suite uses it and the two install together.
# The container image (deploy/image/build.sh, tests/deploy/test_image.py):
# mmdebstrap, and podman with runc named, as crun refuses the hybrid cgroup
# layout some machines have.
# What building and serving need: the compilers (g++ for dreyd's one C++ file,
# src/dreyd/absl.cc), Bazel and the libraries
# dreyd and drey link (libedit: drey's interactive mode).
serve_packages=(
  bazel-bootstrap gcc g++ libc6-dev pkg-config
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev grpc-proto
  libssl-dev libjemalloc-dev libjwt-dev libjansson-dev libmicrohttpd-dev libedit-dev
)
# What only the tests, benchmarks and fuzzing need on top.
test_packages=(
  libcriterion-dev python3 python3-grpcio python3-protobuf
  curl procps util-linux prometheus
  # etcd for the cluster's control plane (the tests start their own), and the
  # protos bazel/gen.sh compiles drey's etcd client from. golang-etcd-server-dev
  # pulls protoc-gen-go-1-3, which conflicts with the protoc-gen-go package.
  etcd-server etcd-client
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev
  golang-go golang-google-grpc-dev golang-google-genproto-dev golang-github-golang-protobuf-1-3-dev protoc-gen-go-1-3
  mmdebstrap podman runc
  faketime openssl
  # Pipelined Redis beside pipelined drey (tests/bench/pipeline.py).
  redis-server redis-tools
  clang-14 libfuzzer-14-dev libclang-rt-14-dev llvm-14
)

say() { printf 'drey.sh: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    say "need root to run: $*"; exit 1
  fi
}

# install_packages NAME...: the Debian packages named that are missing.
install_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# Node modules for the interop tests, from the committed lockfile. Reinstalled
# only when the lockfile changed since the last install.
install_node_modules() {
  local dir stamp
  for dir in tests/interop/node tests/deploy; do
    [ -f "$dir/package-lock.json" ] || continue
    stamp="$dir/node_modules/.drey-lock-sha"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$(sha256sum < "$dir/package-lock.json")" ]; then
      say "npm ci in $dir"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
      sha256sum < "$dir/package-lock.json" > "$stamp"
    fi
  done
}

deps() {
  local node=()
  command -v node >/dev/null || node=(nodejs npm)
  install_packages "${serve_packages[@]}" "${test_packages[@]}" "${node[@]}"
  install_node_modules
}

case "${1:-}" in
  deps)
    deps
    ;;
  serve)
    shift
    install_packages "${serve_packages[@]}"
    bazel build //:dreyd //:drey
    exec "$top/bazel-bin/dreyd" "$@"
    ;;
  test)
    shift
    deps
    # Three at a time: the cluster suites mostly wait (leases, polls with
    # deadlines), and two left the cores half idle. Not under ASan, whose
    # timing-bound suites (a calm connection beside a flood, a frozen etcd)
    # starved at four; three plain tests cost the cores less than two
    # under ASan do.
    bazel test --jobs=3 --local_test_jobs=3 //... "$@"
    say "fuzz targets (tests/fuzz/fuzz.sh check)"
    tests/fuzz/fuzz.sh check
    say "again under ASan+UBSan"
    bazel test --config=asan //... "$@"
    ;;
  *)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
