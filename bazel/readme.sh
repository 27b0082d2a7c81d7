#!/usr/bin/env bash
# Rewrites the README's generated tables (options, errors) from dreyd itself.
# //tests/build:readme_current_test fails when they are out of date.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bazel build //:dreyd >/dev/null 2>&1
dreyd="$top/bazel-bin/dreyd"
for pair in options:--help-markdown errors:--help-errors; do
  name=${pair%%:*} flag=${pair#*:}
  "$dreyd" "$flag" > "$top/.readme.$name"
  awk -v name="$name" -v file="$top/.readme.$name" '
    $0 ~ "<!-- " name ":begin" { print; while ((getline line < file) > 0) print line; skip = 1; next }
    $0 ~ "<!-- " name ":end" { skip = 0 }
    !skip { print }
  ' README.md > README.md.new
  mv README.md.new README.md
  rm -f "$top/.readme.$name"
done
