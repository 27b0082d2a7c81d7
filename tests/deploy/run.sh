#!/usr/bin/env bash
# Runs the manifest tests from their real location so Node finds
# tests/deploy/node_modules (installed by `bazel/drey.sh deps`).
set -euo pipefail
src=$(readlink -f "$1")
dir=$(dirname "$src")
if [ ! -d "$dir/node_modules" ]; then
  echo "missing $dir/node_modules: run bazel/drey.sh deps (npm ci in tests/deploy)" >&2
  exit 1
fi
# The manifests as Bazel staged them, so a test sees exactly its inputs.
export DREY_K8S_DIR="$PWD/deploy/k8s"
exec node --test "$src"
