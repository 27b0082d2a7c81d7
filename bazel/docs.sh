#!/usr/bin/env bash
# Rewrites the generated tables of docs/ from dreyd itself: the options in
# docs/operations.md (dreyd --help-markdown) and the error catalogue in
# docs/api.md (dreyd --help-errors), each between its begin and end markers.
# //tests/build:docs_current_test fails when they are out of date.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
bazel build //:dreyd >/dev/null 2>&1
dreyd="$top/bazel-bin/dreyd"
for entry in options:--help-markdown:docs/operations.md errors:--help-errors:docs/api.md; do
  IFS=: read -r name flag file <<< "$entry"
  grep -q "<!-- $name:begin" "$file" && grep -q "<!-- $name:end -->" "$file" || {
    echo "docs.sh: $file has no <!-- $name:begin --> ... <!-- $name:end --> markers" >&2
    exit 1
  }
  "$dreyd" "$flag" > "$top/.docs.$name"
  awk -v name="$name" -v table="$top/.docs.$name" '
    $0 ~ "<!-- " name ":begin" { print; while ((getline line < table) > 0) print line; skip = 1; next }
    $0 ~ "<!-- " name ":end" { skip = 0 }
    !skip { print }
  ' "$file" > "$file.new"
  mv "$file.new" "$file"
  rm -f "$top/.docs.$name"
done
