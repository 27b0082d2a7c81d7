"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/).

usage: /usr/bin/python3 tests/fuzz/seeds.py DATA_DIR

DATA_DIR is a stopped node's data directory holding a snapshot, CURRENT and
a journal segment (any node that took `drey snapshot` will do); requests
are built from proto/ with protoc's Python output. Seeds are small valid
inputs in each target's input format (see each *_fuzz.c): libFuzzer
mutates from there.
"""

import glob
import importlib
import os
import struct
import subprocess
import sys
import tempfile

top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
corpus = os.path.join(top, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def stubs():
    out = tempfile.mkdtemp(prefix="drey-fuzz-seeds-")
    subprocess.run(["protoc", "-I" + os.path.join(top, "proto"), "-I/usr/include", "--python_out=" + out,
                    "drey/cache/v1/cache.proto", "drey/admin/v1/admin.proto", "drey/cluster/v1/cluster.proto",
                    "google/rpc/status.proto"],
                   check=True)
    subprocess.run(["protoc", "-I/usr/share/grpc-proto/grpc", "--python_out=" + out, "health/v1/health.proto",
                    "reflection/v1/reflection.proto"], check=True)
    sys.path.insert(0, out)
    return (importlib.import_module("drey.cache.v1.cache_pb2"), importlib.import_module("drey.admin.v1.admin_pb2"),
            importlib.import_module("drey.cluster.v1.cluster_pb2"), importlib.import_module("health.v1.health_pb2"),
            importlib.import_module("reflection.v1.reflection_pb2"))


def requests():
    cache, admin, cluster, health, refl = stubs()
    # the order of request_fuzz.c's services
    methods = [m for m in cache.DESCRIPTOR.services_by_name["Cache"].methods]
    methods += [m for m in admin.DESCRIPTOR.services_by_name["Admin"].methods]
    methods += [m for m in cluster.DESCRIPTOR.services_by_name["Cluster"].methods]
    methods += [m for m in health.DESCRIPTOR.services_by_name["Health"].methods]
    methods += [m for m in refl.DESCRIPTOR.services_by_name["ServerReflection"].methods]
    index = {m.full_name: i for i, m in enumerate(methods)}

    def value(i):
        v = cache.Value()
        kind = i % 4
        if kind == 0:
            v.string_value = "hello"
        elif kind == 1:
            v.bytes_value = b"\x00\x01"
        elif kind == 2:
            v.int64_value = -5
        else:
            v.json_value.update({"a": [1, "x", {"b": None}], "t": True})
        return v

    msgs = {
        "Get": cache.GetRequest(cache="c", key="k"),
        "GetMany": cache.GetManyRequest(cache="c", keys=["a", "b", "c"]),
        "SetMany": cache.SetManyRequest(cache="c", request_id="r1", entries=[
            cache.SetManyRequest.Entry(key="a", value=value(0)), cache.SetManyRequest.Entry(key="b", value=value(3))]),
        "Remove": cache.RemoveRequest(key="k"),
        "Persist": cache.PersistRequest(key="k"),
        "GetExpiration": cache.GetExpirationRequest(key="k"),
        "Pipeline": cache.PipelineRequest(operations=[
            cache.PipelineOperation(id=1, set=cache.SetRequest(cache="c", key="k", value=value(0))),
            cache.PipelineOperation(id=2, get=cache.GetRequest(cache="c", key="k")),
            cache.PipelineOperation(id=3)]),
    }
    n = 0
    for m in methods:
        if m.containing_service.full_name.startswith("drey.cache") and m.name not in msgs:
            cls = getattr(cache, m.input_type.name)
            msg = cls()
            for f, v in (("cache", "c"), ("key", "key1"), ("request_id", "rid-1")):
                if f in cls.DESCRIPTOR.fields_by_name:
                    setattr(msg, f, v)
            if "value" in cls.DESCRIPTOR.fields_by_name:
                msg.value.CopyFrom(value(n))
            if "ttl" in cls.DESCRIPTOR.fields_by_name:
                msg.ttl.seconds = 60
            if "delta" in cls.DESCRIPTOR.fields_by_name:
                msg.delta = 7
            msgs[m.name] = msg
        n += 1
    for m in methods:
        if m.containing_service.full_name.startswith("drey.cache"):
            data = msgs[m.name].SerializeToString()
        elif m.name == "Check" or m.name == "Watch":
            data = health.HealthCheckRequest(service="drey.cache.v1.Cache").SerializeToString()
        elif m.name == "ServerReflectionInfo":
            data = refl.ServerReflectionRequest(file_containing_symbol="drey.cache.v1.Cache").SerializeToString()
        else:
            data = b""
        put("request", m.full_name.lower().replace(".", "_").replace("/", "_"), bytes([index[m.full_name]]) + data)


def trimmed(seg):
    end = len(seg)
    while end > 64 and seg[end - 1] == 0:
        end -= 1
    return seg[:(end + 7) & ~7]


def journal(data_dir):
    seg = open(sorted(glob.glob(os.path.join(data_dir, "journal", "*.seg")))[0], "rb").read()
    seg = trimmed(seg)
    # journal: the header and the frames as they are (flags 0), and the
    # second frame with its CRC left to the target (flags 1)
    put("journal", "segment", b"\x00" + seg)
    length = struct.unpack_from("<I", seg, 64)[0]
    second = 64 + ((40 + length + 7) & ~7)
    put("journal", "frame", b"\x01" + seg[second:])
    # recover: frames without the header, LSNs as offsets from the
    # expected one (0) and batch LSNs as distances back from them
    body = bytearray(seg[64:])
    off = 0
    while off + 40 <= len(body):
        length, _, lsn, batch = struct.unpack_from("<IIQQ", body, off)
        if length == 0 and lsn == 0:
            break
        struct.pack_into("<QQ", body, off + 8, 0, lsn - batch)
        off += (40 + length + 7) & ~7
    put("recover", "one-segment", b"\x00" + bytes(body))
    put("recover", "after-snapshot", b"\x20" + bytes(body))
    put("recover", "torn", b"\x00" + bytes(body[:off - 5]))


def snapshot(data_dir):
    snap = open(sorted(glob.glob(os.path.join(data_dir, "snapshots", "*.snap")))[0], "rb").read()
    put("snapshot", "snapshot", b"\x00" + snap)
    put("snapshot", "snapshot-fixed", b"\x07" + snap)
    put("snapshot", "manifest", b"\x80" + open(os.path.join(data_dir, "CURRENT"), "rb").read())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    requests()
    journal(sys.argv[1])
    snapshot(sys.argv[1])
