#!/usr/bin/env bash
# Runs the Go interop suite under Bazel (or by hand):
#   run.sh <dreyd> <tests/interop/go/harness_test.go>  [go test flags]
# Stubs are generated from proto/ at run time, as the Python and Node suites
# load proto/ at run time: nothing generated is committed, so nothing can go
# stale. Everything builds offline in GOPATH mode from Debian's Go packages:
#   /usr/share/gocode  grpc-go 1.33, github.com/golang/protobuf 1.3, genproto
#   protoc-gen-go      the v1.3 generator (protoc-gen-go-1-3): its APIv1 code
#                      is what grpc-go and genproto in /usr/share/gocode are
#                      built against (golang-etcd-server-dev pins that set)
# google/rpc/error_details.proto is generated into the private GOPATH at
# genproto's import path: the GOPATH is searched in order, so it shadows
# Debian's genproto copy (2020), which lacks FieldViolation.reason.
set -euo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 <dreyd> <tests/interop/go/harness_test.go> [go test flags]" >&2
    exit 2
fi
DREY_BIN="$(readlink -f "$1")"
export DREY_BIN
if [[ ! -x "$DREY_BIN" ]]; then
    echo "run.sh: dreyd not found or not executable: $1" >&2
    exit 1
fi
here="$(cd "$(dirname "$2")" && pwd)"
shift 2
proto_dir="$(cd "$here/../../../proto" && pwd)"
for tool in go protoc protoc-gen-go; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool not found (bazel/drey.sh deps installs it)" >&2; exit 1; }
done

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/drey-go.XXXXXX")"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
gopath="$work/gopath"
pkg="$gopath/src/drey.dev/interop"
mkdir -p "$pkg"
cp "$here"/*_test.go "$pkg/"

# Imports of the well-known types map to the APIv1 packages that
# github.com/golang/protobuf 1.3 provides (protoc 3.21's own go_package
# options name the APIv2 ones).
wkt="Mgoogle/protobuf/duration.proto=github.com/golang/protobuf/ptypes/duration"
wkt+=",Mgoogle/protobuf/timestamp.proto=github.com/golang/protobuf/ptypes/timestamp"
wkt+=",Mgoogle/protobuf/struct.proto=github.com/golang/protobuf/ptypes/struct"
# One protoc run per Go package: the v1.3 generator wants that. The APIv2
# generator (Debian package protoc-gen-go) refuses plugins=grpc.
for f in drey/cache/v1/cache.proto drey/admin/v1/admin.proto google/rpc/error_details.proto; do
    if ! protoc -I"$proto_dir" -I/usr/include --go_out="plugins=grpc,$wkt:$gopath/src" "$proto_dir/$f"; then
        echo "run.sh: protoc-gen-go ($(command -v protoc-gen-go)) could not generate $f: this suite needs the" \
             "v1.3 generator of protoc-gen-go-1-3, which the APIv1 grpc-go and genproto in /usr/share/gocode match" >&2
        exit 1
    fi
done

# The service-config test reads deploy/client/ and runs the cluster fixture
# tests/integration/python/drey_failover.py from here; grpc-go before 1.40
# retries only when this says so.
DREY_SOURCE_ROOT="$(cd "$here/../../.." && pwd)"
export DREY_SOURCE_ROOT GRPC_GO_RETRY=on

export GO111MODULE=off GOFLAGS= GOPROXY=off
export GOPATH="$gopath:/usr/share/gocode"
export GOCACHE="$work/gocache" GOTMPDIR="$work"
cd "$pkg"
go vet .
go test -count=1 -timeout=280s "$@" .
