#!/usr/bin/env bash
# The README's option table and error catalogue are generated from the code
# (dreyd --help-markdown, dreyd --help-errors); they must match it exactly.
set -euo pipefail
dreyd="$1"
readme="$2"
status=0
check() {
  local name=$1 flag=$2
  local want got
  want=$("$dreyd" "$flag")
  got=$(sed -n "/<!-- $name:begin/,/<!-- $name:end -->/p" "$readme" | sed '1d;$d')
  if [ "$want" != "$got" ]; then
    echo "README's $name table differs from \`dreyd $flag\`:" >&2
    diff <(echo "$got") <(echo "$want") >&2 || true
    status=1
  fi
}
check options --help-markdown
check errors --help-errors
[ $status -eq 0 ] && echo "README tables are current"
exit $status
