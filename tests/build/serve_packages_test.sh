#!/usr/bin/env bash
# `bazel/drey.sh serve` installs only what building and serving need
# (issue: it used to install Go, clang, podman, Redis, Node...). Checked
# against this machine's real package database: every shared library dreyd
# and drey load, and every system header drey's sources include, belongs to
# a package that the serve list pulls in (the list and its dependencies);
# and no package the list pulls in is one only the tests need.
set -euo pipefail
drey_sh=$1 dreyd=$2 drey=$3
shift 3 # the rest: drey's C sources and headers

serve=$(sed -n '/^serve_packages=(/,/^)/p' "$drey_sh" | sed '1s/.*(//; $d; s/#.*//' | tr -s ' \n' ' ')
[ -n "${serve// /}" ] || { echo "no serve_packages=( ... ) list in $drey_sh" >&2; exit 1; }
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances $serve 2>/dev/null | grep -v '^ ' | sed 's/:.*//' | sort -u)
status=0

# What each file was installed by, in one dpkg call (one per file took a
# minute). Debian 12 merged /usr: a library found under /lib is registered
# under /usr/lib, or the reverse, so both names are asked.
files=()
for bin in "$dreyd" "$drey"; do
  while read -r lib; do
    files+=("$(basename "$bin") loads|$(readlink -f "$lib")")
  done < <(ldd "$bin" | awk '$3 ~ /^\// { print $3 }')
done
# The system headers the sources include, resolved as gcc resolves them.
dirs=($(gcc -xc -E -v /dev/null 2>&1 | sed -n '/<...> search starts here/,/End of search list/p' | grep '^ /'))
while read -r h; do
  for d in "${dirs[@]}"; do
    if [ -f "$d/$h" ]; then
      files+=("#include <$h>|$(readlink -f "$d/$h")")
      break
    fi
  done
done < <(grep -ho '^#include <[^>]*>' "$@" | sed 's/#include <\(.*\)>/\1/' | sort -u)

names=()
for f in "${files[@]}"; do
  path=${f#*|}
  case $path in /usr/*) names+=("$path" "${path#/usr}") ;; *) names+=("$path" "/usr$path") ;; esac
done
declare -A owner=()
while IFS= read -r line; do
  pkgs=${line%%: /*}
  path=/${line#*: /}
  owner[$path]=${pkgs%%[:,]*}
done < <(dpkg -S "${names[@]}" 2>/dev/null)

libs=0 headers=0
for f in "${files[@]}"; do
  what=${f%%|*} path=${f#*|}
  case $path in /usr/*) alt=${path#/usr} ;; *) alt=/usr$path ;; esac
  pkg=${owner[$path]:-${owner[$alt]:-}}
  case $what in \#*) headers=$((headers + 1)) ;; *) libs=$((libs + 1)) ;; esac
  if [ -z "$pkg" ]; then
    echo "$what: $path belongs to no installed package" >&2
    status=1
  elif ! grep -qx "$pkg" <<< "$closure"; then
    echo "$what: $path comes from $pkg, which bazel/drey.sh serve does not install" >&2
    status=1
  fi
done

for test_only in golang-go etcd-server podman redis-server nodejs clang-14 libcriterion-dev prometheus; do
  if grep -qx "$test_only" <<< "$closure"; then
    echo "bazel/drey.sh serve installs $test_only, which only the tests need" >&2
    status=1
  fi
done
[ "$libs" -gt 10 ] && [ "$headers" -gt 20 ] || { echo "found only $libs libraries and $headers headers" >&2; exit 1; }
[ $status -eq 0 ] && echo "serve's $(wc -w <<< "$serve") packages ($(wc -l <<< "$closure") with dependencies) cover $libs libraries and $headers headers"
exit $status
