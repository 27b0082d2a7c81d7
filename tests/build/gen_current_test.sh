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
# drey is an etcd client, not an etcd server: reflection must not describe
# etcd's services (gen/etcd is compiled, never served).
for pkg in etcdserverpb mvccpb authpb gogoproto google.api; do
  if grep -q "$pkg" gen/drey_descriptor_set.binpb; then
    echo "gen/drey_descriptor_set.binpb describes $pkg: keep etcd's protos out of the served set" >&2
    exit 1
  fi
done
echo "the descriptor set holds none of etcd's protos"
