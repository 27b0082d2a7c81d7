"""Request bodies and tokens for the benchmark, made with the system's own tools.

- gRPC frames (1 flag byte, 4-byte big-endian length, message): the format drey-bench's
  --raw-payloads reads and h2load's -d sends.
- etcd PutRequest/RangeRequest bodies, encoded by `protoc --encode` from the subset of etcd's
  rpc.proto in etcd_rpc.proto (one protoc call encodes a wrapper with every request; the wrapper is
  then split into its elements).
- drey request bodies for h2load, encoded by `protoc --encode` from proto/.
- RS256 JWTs signed by `openssl dgst`, for drey's --jwt-keys-dir.
"""
import base64
import json
import os
import random
import struct
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def frame(message: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(message)) + message


def _varint(data: bytes, i: int):
    value, shift = 0, 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def split_repeated(wrapper: bytes, field: int = 1):
    """The elements of `repeated Message field = 1` in an encoded wrapper message."""
    out, i = [], 0
    while i < len(wrapper):
        tag, i = _varint(wrapper, i)
        if tag & 7 != 2:
            raise ValueError("unexpected wire type %d" % (tag & 7))
        length, i = _varint(wrapper, i)
        if tag >> 3 == field:
            out.append(wrapper[i:i + length])
        i += length
    return out


def protoc_encode(proto_paths, proto_file, message_type, text: str) -> bytes:
    args = ["protoc"] + ["--proto_path=" + p for p in proto_paths]
    args += ["--encode=" + message_type, proto_file]
    return subprocess.run(args, input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def value_text(value_bytes: int, seed: int = 1) -> str:
    """A printable value (lowercase letters), the same every run."""
    rnd = random.Random(seed)
    return "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(value_bytes))


def key_of(index: int, key_bytes: int = 8) -> str:
    """drey-bench's key for an index: "k" and the zero-padded index."""
    return "k" + str(index).zfill(key_bytes - 1)


def write_etcd_payloads(path_put: str, path_range: str, keys: int, key_bytes: int, value_bytes: int):
    value = value_text(value_bytes)
    puts = "".join('requests { key: "%s" value: "%s" }\n' % (key_of(i, key_bytes), value) for i in range(keys))
    ranges = "".join('requests { key: "%s" serializable: true }\n' % key_of(i, key_bytes) for i in range(keys))
    for path, msg, text in ((path_put, "etcdserverpb.PutRequests", puts),
                            (path_range, "etcdserverpb.RangeRequests", ranges)):
        wrapper = protoc_encode([HERE], "etcd_rpc.proto", msg, text)
        with open(path, "wb") as f:
            for m in split_repeated(wrapper):
                f.write(frame(m))


def write_drey_frame(path: str, repo: str, message_type: str, text: str):
    """One framed drey request (for h2load -d and drey-bench raw mode)."""
    body = protoc_encode([os.path.join(repo, "proto"), "/usr/include"], _proto_file_of(message_type),
                         message_type, text)
    with open(path, "wb") as f:
        f.write(frame(body))


def _proto_file_of(message_type: str) -> str:
    if message_type.startswith("drey.cache.v1."):
        return "drey/cache/v1/cache.proto"
    if message_type.startswith("drey.admin.v1."):
        return "drey/admin/v1/admin.proto"
    raise ValueError(message_type)


# --- JWT ------------------------------------------------------------------------------------

def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_rsa_key(workdir: str, keys_dir: str, kid: str) -> str:
    """An RSA key pair: the private key stays in workdir, the public key goes to keys_dir as
    <kid>.RS256.pem (what dreyd's --jwt-keys-dir reads). Returns the private key's path."""
    private = os.path.join(workdir, kid + ".key.pem")
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                    "-out", private], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["openssl", "pkey", "-in", private, "-pubout", "-out",
                    os.path.join(keys_dir, kid + ".RS256.pem")], check=True)
    return private


def mint_rs256(private_key: str, kid: str, sub: str, ttl_s: int = 3600) -> str:
    now = int(time.time())
    header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": kid}, separators=(",", ":")).encode())
    claims = _b64url(json.dumps({"sub": sub, "iat": now, "exp": now + ttl_s}, separators=(",", ":")).encode())
    signing_input = (header + "." + claims).encode()
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", private_key], input=signing_input,
                         stdout=subprocess.PIPE, check=True).stdout
    return header + "." + claims + "." + _b64url(sig)
