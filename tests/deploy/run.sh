#!/usr/bin/env bash
# Runs a manifest test from its real location so Node finds
# tests/deploy/node_modules (installed by `bazel/drey.sh deps`).
#   run.sh <test.mjs> [<dreyd> <drey>]   (the binaries for the flags check)
set -euo pipefail
src=$(readlink -f "$1")
dir=$(dirname "$src")
if [ ! -d "$dir/node_modules" ]; then
  echo "missing $dir/node_modules: run bazel/drey.sh deps (npm ci in tests/deploy)" >&2
  exit 1
fi
# The manifests as Bazel staged them, so a test sees exactly its inputs.
export DREY_K8S_DIR="$PWD/deploy/k8s"
if [ $# -ge 3 ]; then
  DREY_DREYD=$(readlink -f "$2")
  DREY_CLI=$(readlink -f "$3")
  export DREY_DREYD DREY_CLI
fi
exec node --test "$src"
