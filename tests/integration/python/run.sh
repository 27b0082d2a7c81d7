#!/usr/bin/env bash
# Runs one Python integration test under Bazel: $1 is dreyd, $2 the test.
# Debian's /usr/bin/python3 is the one that sees python3-grpcio.
set -euo pipefail
export DREY_BIN="$PWD/$1"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -u "$2"
