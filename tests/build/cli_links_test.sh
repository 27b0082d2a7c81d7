#!/usr/bin/env bash
# The `drey` CLI is a client: its build graph must not reach the server's
# modules (the HTTP ops listener, admin, storage, the journal, the request
# chain). It once did, for one JSON printer; that printer is the pbjson
# module now. $1 is `deps(//:drey)` written by a genquery at build time, so a
# BUILD edit that pulls any of them back in fails here.
set -euo pipefail
deps=$1
grep -qx '//:drey' "$deps" || { echo "cli_links_test: $deps is not deps(//:drey)" >&2; exit 1; }
grep -qx '//:pbjson' "$deps" || { echo "cli_links_test: the CLI no longer uses //:pbjson" >&2; exit 1; }
bad=$(grep -xE '//:(ops|admin|storage|journal|snapshot|commit|pipeline|server|cache|store|auth|metrics)' "$deps" || true)
if [ -n "$bad" ]; then
  echo "cli_links_test: //:drey depends on server-side modules:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "cli_links_test: ok"
