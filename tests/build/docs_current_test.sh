#!/usr/bin/env bash
# The generated tables of docs/ come from the code: the option table in
# docs/operations.md (dreyd --help-markdown) and the error catalogue in
# docs/api.md (dreyd --help-errors) must match it exactly. bazel/docs.sh
# rewrites them.
set -euo pipefail
dreyd="$1"
operations="$2"
api="$3"
status=0
check() {
  local name=$1 flag=$2 file=$3
  local want got
  want=$("$dreyd" "$flag")
  if [ "$(grep -c "<!-- $name:begin" "$file")" != 1 ] || [ "$(grep -c "<!-- $name:end -->" "$file")" != 1 ]; then
    echo "$file must hold exactly one <!-- $name:begin --> ... <!-- $name:end --> pair" >&2
    status=1
    return
  fi
  got=$(sed -n "/<!-- $name:begin/,/<!-- $name:end -->/p" "$file" | sed '1d;$d')
  if [ "$want" != "$got" ]; then
    echo "the $name table of $file differs from \`dreyd $flag\` (run bazel/docs.sh):" >&2
    diff <(echo "$got") <(echo "$want") >&2 || true
    status=1
  fi
}
check options --help-markdown "$operations"
check errors --help-errors "$api"
[ $status -eq 0 ] && echo "docs tables are current"
exit $status
