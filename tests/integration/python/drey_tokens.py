"""drey_tokens — JWT keys and tokens for the admission tests, plus the few
helpers the admission test files share (the ops listener, fresh connections).

No PyJWT: keys are made with the `openssl` CLI, HS* tokens are signed with
hmac/hashlib and RS*/ES* tokens with `openssl dgst -sign` (ECDSA signatures
come out DER-encoded and are converted to the raw r||s that JWS wants).

    keys = KeyDir(tmpdir)                   # a --jwt-keys-dir
    rs = keys.rsa("k-rs")                   # writes k-rs.RS256.pem
    hs = keys.hmac("k-hs")                  # writes k-hs.HS256.key
    tok = mint(rs, sub="alice", iss=ISS, aud=AUD)
    stub(req, metadata=bearer(tok), timeout=30)

Everything a token is made of can be overridden (header fields, claims, the
signing key, the signature itself), so the negative tests can build exactly
the broken token they need.
"""

import atexit
import base64
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import grpc

# --- encoding --------------------------------------------------------------------


def b64url(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64url_json(obj):
    return b64url(json.dumps(obj, separators=(",", ":")).encode())


def bearer(token):
    """gRPC call metadata carrying the token."""
    return (("authorization", "Bearer " + token),)


def openssl(*args, input=None):
    r = subprocess.run(["openssl"] + list(args), input=input, capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("openssl %s failed: %s" % (" ".join(args), r.stderr.decode(errors="replace")))
    return r.stdout


# --- keys ------------------------------------------------------------------------

HASHES = {"256": "sha256", "384": "sha384", "512": "sha512"}
CURVES = {"ES256": ("P-256", 32), "ES384": ("P-384", 48), "ES512": ("P-521", 66)}


def _der_len(buf, i):
    n = buf[i]
    i += 1
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(buf[i:i + k], "big")
        i += k
    return n, i


def ecdsa_der_to_raw(der, size):
    """ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER } -> r || s, each
    left-padded to the curve's coordinate size (RFC 7518 section 3.4)."""
    if der[0] != 0x30:
        raise ValueError("not a DER sequence")
    _, i = _der_len(der, 1)
    out = b""
    for _ in range(2):
        if der[i] != 0x02:
            raise ValueError("not a DER integer")
        n, i = _der_len(der, i + 1)
        v = der[i:i + n].lstrip(b"\x00")
        i += n
        out += v.rjust(size, b"\x00")
    return out


class Key:
    """A signing key: kid, alg, and how to sign. `public_pem` (RS/ES) or
    `secret` (HS) is what the node verifies with."""

    def __init__(self, kid, alg, private_path=None, public_pem=None, secret=None):
        self.kid = kid
        self.alg = alg
        self.private_path = private_path
        self.public_pem = public_pem
        self.secret = secret

    @property
    def family(self):
        return self.alg[:2]

    def sign(self, data):
        digest = HASHES[self.alg[2:]]
        if self.family == "HS":
            return hmac.new(self.secret, data, getattr(hashlib, digest)).digest()
        sig = openssl("dgst", "-" + digest, "-sign", self.private_path, input=data)
        if self.family == "ES":
            sig = ecdsa_der_to_raw(sig, CURVES[self.alg][1])
        return sig

    # JWKS form of the public part.
    def jwk(self, kid=None, alg=None, **extra):
        kid = self.kid if kid is None else kid
        alg = self.alg if alg is None else alg
        if self.family == "HS":
            j = {"kty": "oct", "k": b64url(self.secret)}
        elif self.family == "RS":
            text = openssl("pkey", "-pubin", "-noout", "-text", input=self.public_pem).decode()
            mod = openssl("rsa", "-pubin", "-noout", "-modulus", input=self.public_pem).decode()
            n = bytes.fromhex(mod.strip().split("=", 1)[1])
            e = int(re.search(r"Exponent:\s*(\d+)", text).group(1))
            j = {"kty": "RSA", "n": b64url(n), "e": b64url(e.to_bytes((e.bit_length() + 7) // 8, "big"))}
        else:
            text = openssl("pkey", "-pubin", "-noout", "-text", input=self.public_pem).decode()
            m = re.search(r"pub:\s*((?:[0-9a-f]{2}:?\s*)+)", text)
            point = bytes.fromhex(re.sub(r"[^0-9a-f]", "", m.group(1)))
            crv, size = CURVES[self.alg]
            assert point[0] == 4 and len(point) == 1 + 2 * size, "not an uncompressed point"
            j = {"kty": "EC", "crv": crv, "x": b64url(point[1:1 + size]), "y": b64url(point[1 + size:])}
        j.update({"kid": kid, "alg": alg, "use": "sig"})
        j.update(extra)
        return j


def new_rsa(path_prefix, kid, alg="RS256", bits=2048):
    priv = path_prefix + ".key.pem"
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:%d" % bits, "-out", priv)
    pub = openssl("pkey", "-in", priv, "-pubout")
    return Key(kid, alg, private_path=priv, public_pem=pub)


def new_ec(path_prefix, kid, alg="ES256"):
    priv = path_prefix + ".key.pem"
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:%s" % CURVES[alg][0], "-out", priv)
    pub = openssl("pkey", "-in", priv, "-pubout")
    return Key(kid, alg, private_path=priv, public_pem=pub)


def new_hmac(kid, alg="HS256", size=None):
    return Key(kid, alg, secret=os.urandom(size or int(alg[2:]) // 8))


class KeyDir:
    """A --jwt-keys-dir (<kid>.<ALG>.pem / <kid>.<ALG>.key), with the private
    halves kept in a sibling directory the node never reads."""

    def __init__(self, base=None):
        if base is None:
            base = tempfile.mkdtemp(prefix="drey-keys-")
            if not os.environ.get("DREY_TEST_KEEP_TMP"):
                atexit.register(shutil.rmtree, base, True)
        self.base = base
        self.path = os.path.join(self.base, "keys")
        self.private = os.path.join(self.base, "private")
        os.makedirs(self.path, exist_ok=True)
        os.makedirs(self.private, exist_ok=True)

    def file_of(self, key):
        return os.path.join(self.path, "%s.%s.%s" % (key.kid, key.alg, "key" if key.family == "HS" else "pem"))

    def install(self, key):
        """Writes the key's public file atomically (rename)."""
        data = key.secret if key.family == "HS" else key.public_pem
        write_atomic(self.file_of(key), data)
        return key

    def remove(self, key):
        os.unlink(self.file_of(key))

    def rsa(self, kid, alg="RS256", install=True):
        k = new_rsa(os.path.join(self.private, kid), kid, alg)
        return self.install(k) if install else k

    def ec(self, kid, alg="ES256", install=True):
        k = new_ec(os.path.join(self.private, kid), kid, alg)
        return self.install(k) if install else k

    def hmac(self, kid, alg="HS256", install=True):
        k = new_hmac(kid, alg)
        return self.install(k) if install else k


def write_atomic(path, data):
    if isinstance(data, str):
        data = data.encode()
    tmp = "%s.tmp-%d" % (path, os.getpid())
    # a leading dot keeps a half-written file out of the keys dir's view
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(tmp))
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_jwks(path, jwks):
    write_atomic(path, json.dumps({"keys": jwks}))


# --- tokens ----------------------------------------------------------------------

_UNSET = object()


def claims(sub="alice", iss=None, aud=None, ttl=3600, now=None, **extra):
    """Claims with exp = now + ttl and iat = now (None values are left out)."""
    now = int(time.time()) if now is None else now
    c = {"sub": sub, "iat": now, "exp": now + ttl}
    if iss is not None:
        c["iss"] = iss
    if aud is not None:
        c["aud"] = aud
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def mint(key, payload=None, header=None, alg=_UNSET, kid=_UNSET, sign_with=None, signature=None, **claim_kw):
    """A compact JWS: header {alg, kid, typ} (alg/kid from `key` unless given;
    None leaves a field out), payload `payload` or claims(**claim_kw), signed
    by `sign_with` (default: key) unless `signature` (bytes) is given."""
    h = {"alg": key.alg if alg is _UNSET else alg, "typ": "JWT", "kid": key.kid if kid is _UNSET else kid}
    if header:
        h.update(header)
    h = {k: v for k, v in h.items() if v is not None}
    p = claims(**claim_kw) if payload is None else payload
    signing_input = (b64url_json(h) + "." + (p if isinstance(p, str) else b64url_json(p))).encode()
    if signature is None:
        signature = (sign_with or key).sign(signing_input)
    return signing_input.decode() + "." + b64url(signature)


def hs_with_secret(secret, alg, data):
    return hmac.new(secret, data, getattr(hashlib, HASHES[alg[2:]])).digest()


class RawSigner:
    """Signs like an HS key with arbitrary secret bytes (e.g. an RSA public
    key's PEM text, for the HS/RS confusion attack)."""

    def __init__(self, secret, alg="HS256"):
        self.secret = secret
        self.alg = alg

    def sign(self, data):
        return hs_with_secret(self.secret, self.alg, data)


# --- shared admission helpers ------------------------------------------------------

def ops_port(server):
    """The ops listener's port, from the server's "listening" log line."""
    rec = server.find_log(lambda r: r.get("msg") == "listening")
    assert rec is not None and int(rec.get("ops_port", 0)) > 0, "no ops_port in the log: %r" % rec
    return int(rec["ops_port"])


def http_get(host, port, path, headers=None, timeout=30):
    """(status, headers, body bytes) of GET http://host:port/path."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def details(server, port=None):
    """/health/ready/details of the server, as a dict (from loopback)."""
    status, _, body = http_get("127.0.0.1", port or ops_port(server), "/health/ready/details")
    assert status == 200, "details: HTTP %d %r" % (status, body[:200])
    return json.loads(body)


def poll(probe, done, timeout=30.0, what="condition", interval=0.005):
    """Calls probe() until done(value) holds (or the deadline); returns the
    last value. The pause only paces the polling."""
    deadline = time.monotonic() + timeout
    while True:
        v = probe()
        if done(v):
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("%s not reached within %.0fs; last: %r" % (what, timeout, v))
        time.sleep(interval)


def fresh_channel(target, credentials=None, options=()):
    """A channel with its own HTTP/2 connection: grpcio otherwise shares one
    connection between channels to the same target with the same options,
    and drey names token-less callers by connection."""
    opts = [("grpc.use_local_subchannel_pool", 1)] + list(options)
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options=opts)
    return grpc.insecure_channel(target, options=opts)


UNIT_SUFFIXES = ("Bytes", "PerSecond", "Calls", "Ms", "Records", "Caches")


def metadata_keys_have_units(md):
    """Every ErrorInfo metadata key of a quota error names its unit."""
    return [k for k in md if not k.endswith(UNIT_SUFFIXES)]


def duration_ms(d):
    return d.seconds * 1000 + d.nanos / 1e6
