#!/usr/bin/env bash
# See cluster_rooms_test.py.
set -euo pipefail
exec /usr/bin/python3 tests/build/cluster_rooms_test.py src/cluster
