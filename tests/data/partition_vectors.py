#!/usr/bin/env python3
"""Writes tests/data/partition_vectors.json: drey's partition rule computed by
an implementation independent of the C one (a bitwise CRC-32C straight from
the polynomial), so the C unit test, and later the Python and Node routing,
check against numbers no drey code produced.

  partition = crc32c(u32le(len(cache)) || cache || 0x1F || routing_key) mod N

cache is normalised first: "default" and "" name the same cache (as in the
store), and both hash as "". routing_key follows Redis Cluster's hash tags: take the first '{'; if a '}'
follows it and the bytes between are not empty, they are the routing key;
otherwise the whole key is. Lengths and bytes are UTF-8.

usage: tests/data/partition_vectors.py > tests/data/partition_vectors.json
"""
import json
import struct
import sys


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def routing_key(key: bytes) -> bytes:
    start = key.find(b"{")
    if start < 0:
        return key
    end = key.find(b"}", start + 1)
    if end < 0 or end == start + 1:
        return key
    return key[start + 1:end]


def partition(cache: str, key: str, n: int) -> int:
    c, k = cache.encode(), key.encode()
    if c == b"default":
        c = b""
    return crc32c(struct.pack("<I", len(c)) + c + b"\x1f" + routing_key(k)) % n


CASES = [
    # (cache, key, N, what it shows)
    ("users", "alice", 256, "plain key"),
    ("users", "bob", 256, "plain key"),
    ("users", "alice", 4096, "the same key with 4096 partitions"),
    ("users", "alice", 16, "the same key with 16 partitions"),
    ("users", "alice", 1, "one partition"),
    ("users", "alice", 1000, "N need not be a power of two"),
    ("sessions", "alice", 256, "another cache, same key"),
    ("users", "{alice}.profile", 256, "hash tag: routes by alice"),
    ("users", "{alice}.cart", 256, "same tag, same partition"),
    ("users", "x{alice}y", 256, "tag in the middle"),
    ("users", "a{b}c{d}", 256, "only the first tag counts"),
    ("users", "{}alice", 256, "empty braces: the whole key"),
    ("users", "{}{alice}", 256, "empty first braces: the whole key, as in Redis"),
    ("users", "{alice", 256, "no closing brace: the whole key"),
    ("users", "alice}", 256, "no opening brace: the whole key"),
    ("users", "}{alice}", 256, "a '}' before the first '{' is ordinary"),
    ("users", "{{alice}}", 256, "the tag is '{alice'"),
    ("", "alice", 256, "empty cache name"),
    ("default", "alice", 256, "\"default\" is the empty name"),
    ("Default", "alice", 256, "names are case-sensitive: not the default cache"),
    ("", "", 256, "empty cache name and key"),
    ("users", "", 256, "empty key"),
    ("café", "crème", 256, "UTF-8 cache and key (lengths in bytes)"),
    ("users", "ключ", 256, "Cyrillic key"),
    ("carts", "{用户42}:购物车", 256, "UTF-8 hash tag"),
    ("carts", "用户42", 256, "the tag alone routes the same"),
    ("emoji", "🔑{🗝️}", 4096, "4-byte UTF-8 and a tag with a variation selector"),
    ("a", "b", 256, "cache/key boundary: differs from the next"),
    ("ab", "", 256, "cache/key boundary: the length prefix separates them"),
]


def main() -> None:
    vectors = []
    for cache, key, n, note in CASES:
        vectors.append({
            "cache": cache,
            "key": key,
            "partitions": n,
            "routing_key": routing_key(key.encode()).decode(),
            "partition": partition(cache, key, n),
            "note": note,
        })
    doc = {
        "rule": "partition = crc32c(u32le(len(cache)) || cache || 0x1F || routing_key) mod partitions; cache \"default\" hashes as \"\"; routing_key = the bytes between the first '{' and the first '}' after it when not empty, else the whole key",
        "crc32c_check": {"input": "123456789", "crc32c": "0x%08x" % crc32c(b"123456789")},
        "vectors": vectors,
    }
    json.dump(doc, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
