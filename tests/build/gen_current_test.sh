#!/usr/bin/env bash
# gen/ must be exactly what bazel/gen.sh produces from proto/: regenerate into
# a scratch directory and compare. Run bazel/gen.sh when this fails.
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}/gen"
bazel/gen.sh "$out"
if ! diff -r gen "$out" > "$out.diff"; then
  head -50 "$out.diff"
  echo "gen/ is stale: run bazel/gen.sh and commit the result" >&2
  exit 1
fi
echo "gen/ is current"
