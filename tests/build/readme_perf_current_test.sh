#!/usr/bin/env bash
# The README's performance table is what tests/bench/readme_table.py makes
# of the latest rendered benchmark results (tests/bench/results/*/results.json).
set -euo pipefail
script="$1"
readme="$2"
shift 2
exec /usr/bin/python3 -B "$script" --check --readme "$readme" --results "$@"
