#!/usr/bin/env bash
# Runs docs_links_test.py ($1) on the pages that follow; Debian's python3.
set -euo pipefail
script=$1
shift
exec /usr/bin/python3 "$script" "$@"
