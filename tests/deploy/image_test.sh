#!/usr/bin/env bash
# Runs tests/deploy/test_image.py under Bazel: $1 dreyd, $2 drey, $3 the test.
# Debian's own python3, and the sbin directories mmdebstrap and podman
# expect (chroot, runc) on PATH.
set -euo pipefail
export DREYD="$PWD/$1" DREY="$PWD/$2"
export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 -u "$3"
