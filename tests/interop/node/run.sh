#!/usr/bin/env bash
# Runs one Node.js interop test under Bazel (or by hand):
#   run.sh <dreyd> <tests/interop/node/x.test.js>
#   DREY_BIN=<dreyd> run.sh <tests/interop/node/x.test.js>
# The test runs from its real path so that Node finds the node_modules that
# `npm ci` installed next to it (the Bazel sandbox only links declared
# inputs, and node_modules is kept out of Bazel by .bazelignore).
set -euo pipefail
if [[ $# -eq 2 ]]; then
    bin="$1"
    test_arg="$2"
elif [[ $# -eq 1 && -n "${DREY_BIN:-}" ]]; then
    bin="$DREY_BIN"
    test_arg="$1"
else
    echo "usage: $0 <dreyd> <test.js>  (or DREY_BIN=<dreyd> $0 <test.js>)" >&2
    exit 2
fi
DREY_BIN="$(readlink -f "$bin")"
export DREY_BIN
if [[ ! -x "$DREY_BIN" ]]; then
    echo "run.sh: dreyd not found or not executable: $bin" >&2
    exit 1
fi
test_js="$(readlink -f "$test_arg")"
here="$(dirname "$test_js")"
if [[ ! -d "$here/node_modules/@grpc/grpc-js" || ! -d "$here/node_modules/@grpc/proto-loader" ]]; then
    echo "run.sh: $here/node_modules is missing or incomplete: run npm ci in tests/interop/node" >&2
    exit 1
fi
# <repo>/tests/interop/node/x.test.js -> <repo>/proto
DREY_PROTO_DIR="$(cd "$here/../../../proto" && pwd -P)"
export DREY_PROTO_DIR
if [[ ! -f "$DREY_PROTO_DIR/drey/cache/v1/cache.proto" ]]; then
    echo "run.sh: $DREY_PROTO_DIR/drey/cache/v1/cache.proto not found" >&2
    exit 1
fi
exec node --test "$test_js"
