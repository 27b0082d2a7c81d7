#!/usr/bin/env bash
# Bazel's workspace status command (.bazelrc): the git revision the binaries
# are built from, for `--version`, the first log line, readiness details and
# drey_build_info. Works offline and in a fresh clone; "unknown" outside git
# (a source tarball). STABLE_ keys rebuild what uses them when they change.
rev=$(git rev-parse HEAD 2>/dev/null) || rev=unknown
if [ "$rev" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  rev="$rev-dirty"
fi
echo "STABLE_DREY_REVISION $rev"
