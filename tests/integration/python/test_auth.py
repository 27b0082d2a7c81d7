"""Identity: JWT bearer tokens through the real server.

* Every configured algorithm (RS, ES, HS from a keys directory and from a
  JWKS file) is accepted, and names the caller jwt:{sub} (seen through the
  idempotency scope, which is the subject).
* The negative matrix: missing, malformed, bad signature, wrong key,
  alg none, HS/RS confusion, expired, not yet valid, wrong iss or aud,
  unknown kid, oversized, unusable claims: each is UNAUTHENTICATED with its
  own TOKEN_* reason, a fixed message that never echoes the token, and
  nothing else in the details.
* A refusal at the principal stage leaves no trace: the key unchanged, no
  version consumed, the request_id free for another request, memory and
  journal figures unchanged.
* Keys are reloaded on SIGHUP and when the files change; a rotated-away key
  stops working at once (even for a cached token); a reload that does not
  load keeps the old keys.
* Start-up: listening beyond loopback without keys is refused (exit 2, a
  clear message) unless --insecure-allow-anonymous-remote; unloadable keys
  stop the start.
"""

import os
import signal
import time
import uuid

import grpc

from drey_harness import (CACHE_SERVICE, HEALTH_SERVICE, REFLECTION_V1, DreyServer, DreyTestCase, RpcFailure,
                          ServiceClient, main, make_value, value_of)
from drey_tokens import (KeyDir, RawSigner, b64url, b64url_json, bearer, details, http_get, mint, new_ec,
                         new_hmac, new_rsa, ops_port, poll, write_atomic, write_jwks)

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
ISS = "https://issuer.drey.test"
AUD = "drey-tests"
MAX_TOKEN = 1024
RPC_TIMEOUT = 30


def now():
    return int(time.time())


class TokenTestCase(DreyTestCase):
    """Helpers for calls with tokens."""

    def call_as(self, token, method, client=None, raw_header=None, **fields):
        client = client or self.cache
        fn, req_cls, _ = client.methods[method]
        md = None
        if raw_header is not None:
            md = (("authorization", raw_header),)
        elif token is not None:
            md = bearer(token)
        return fn(req_cls(**fields), metadata=md, timeout=RPC_TIMEOUT)

    def refused(self, token, reason, method="Get", raw_header=None, client=None, **fields):
        """The call is UNAUTHENTICATED with reason, ErrorInfo only, and
        nothing of the token in the answer."""
        if not fields:
            fields = {"key": "probe"}
        try:
            self.call_as(token, method, client=client, raw_header=raw_header, **fields)
        except grpc.RpcError as e:
            f = RpcFailure(e)
        else:
            self.fail("expected UNAUTHENTICATED %s, the call succeeded" % reason)
        secret = None
        text = raw_header if raw_header is not None else token
        if text and len(text) >= 24:
            secret = text[-24:]  # the signature end, or the end of whatever was sent
        self.assertRpcFailure(f, UNAUTH, reason, secret=secret)
        self.assertEqual(sorted(f.details), ["ErrorInfo"], "details of a token refusal: %r" % f)
        self.assertEqual(f.metadata, {}, "ErrorInfo metadata of a token refusal")
        return f


class TokenMatrixTest(TokenTestCase):
    """One node with keys from a directory (RS256, RS512, ES256, ES512,
    HS256) and a JWKS file (RS384, ES384, HS512), issuer and audience
    checked, a 5 s clock skew and 1 KiB tokens at most."""

    SKEW = 5

    @classmethod
    def setUpClass(cls):
        kd = cls.kd = KeyDir()
        cls.rs = kd.rsa("k-rs")
        cls.rs512 = kd.rsa("k-rs512", "RS512")
        cls.es = kd.ec("k-es")
        cls.es512 = kd.ec("k-es512", "ES512")
        cls.hs = kd.hmac("k-hs")
        cls.j_rs = new_rsa(os.path.join(kd.private, "j-rs"), "j-rs", "RS384")
        cls.j_es = new_ec(os.path.join(kd.private, "j-es"), "j-es", "ES384")
        cls.j_hs = new_hmac("j-hs", "HS512")
        cls.jwks = os.path.join(kd.base, "jwks.json")
        write_jwks(cls.jwks, [cls.j_rs.jwk(), cls.j_es.jwk(), cls.j_hs.jwk()])
        # Keys the node does not have: same kids, other material.
        cls.other_rs = new_rsa(os.path.join(kd.private, "other-rs"), "k-rs")
        cls.other_es = new_ec(os.path.join(kd.private, "other-es"), "k-es")
        cls.other_hs = new_hmac("k-hs")
        cls.SERVER_FLAGS = (
            "--jwt-keys-dir=" + kd.path, "--jwt-jwks-file=" + cls.jwks, "--jwt-issuer=" + ISS,
            "--jwt-audience=" + AUD, "--jwt-clock-skew=%ds" % cls.SKEW, "--jwt-max-token-bytes=%d" % MAX_TOKEN,
            "--ops-listen=127.0.0.1:0", "--jwt-reload-interval=1h", "--log-level=debug")
        super().setUpClass()

    def token(self, key=None, **kw):
        kw.setdefault("iss", ISS)
        kw.setdefault("aud", AUD)
        return mint(key or self.rs, **kw)

    # --- what works ---

    def test_every_configured_key_is_accepted(self):
        for key in (self.rs, self.rs512, self.es, self.es512, self.hs, self.j_rs, self.j_es, self.j_hs):
            with self.subTest(kid=key.kid, alg=key.alg):
                tok = self.token(key, sub="user-" + key.kid)
                k = self.key(key.kid)
                r = self.call_as(tok, "Set", key=k, value=make_value(key.alg))
                self.assertGreater(r.version, 0)
                g = self.call_as(tok, "Get", key=k)
                self.assertEqual(value_of(g.value), key.alg)
                # the same token again: the verified-token cache answers
                self.assertTrue(self.call_as(tok, "Get", key=k).found)

    def test_header_forms_and_claim_variants_that_are_fine(self):
        tok = self.token()
        for header in ("Bearer " + tok, "bearer " + tok, "BEARER " + tok, "Bearer    " + tok):
            with self.subTest(header=header[:10]):
                self.assertFalse(self.call_as(None, "Get", raw_header=header, key="x").found)
        t = now()
        fine = {
            "aud as an array naming us": self.token(aud=["someone-else", AUD]),
            "expired within the skew": self.token(now=t - 3600, ttl=3600 - 1),
            "nbf within the skew": self.token(nbf=t + 2),
            "iat within the skew": self.token(now=t + 2),
            "fractional NumericDates": self.token(payload={"sub": "f", "iss": ISS, "aud": AUD, "exp": t + 60.5,
                                                           "iat": t - 0.5, "nbf": t - 1.25}),
            "no sub (a connection principal)": self.token(sub=None),
            "no typ": self.token(header={"typ": None}),
        }
        for name, tok in fine.items():
            with self.subTest(name):
                self.assertFalse(self.call_as(tok, "Get", key="x").found)

    def test_a_token_at_the_size_limit_is_accepted(self):
        # Signed HS256 tokens grown one byte at a time until exactly the
        # limit (the payload or a header field grows, so every length is hit).
        tok = None
        for pad in range(MAX_TOKEN):
            for hpad in range(3):
                t = mint(self.hs, header={"x": "h" * hpad}, iss=ISS, aud=AUD, pad="p" * pad)
                if len(t) == MAX_TOKEN:
                    tok = t
                    break
            if tok is not None:
                break
        self.assertIsNotNone(tok, "could not build a token of exactly %d bytes" % MAX_TOKEN)
        self.assertFalse(self.call_as(tok, "Get", key="x").found)
        bigger = mint(self.hs, iss=ISS, aud=AUD, pad="p" * MAX_TOKEN)
        self.refused(bigger, "TOKEN_TOO_LARGE")

    # --- the negative matrix ---

    def matrix(self):
        t = now()
        good = self.token(sub="victim")
        h, p, s = good.split(".")
        forged_payload = b64url_json({"sub": "mallory", "iss": ISS, "aud": AUD, "exp": t + 3600, "iat": t})
        sig_chars = list(s)
        sig_chars[10] = "A" if sig_chars[10] != "A" else "B"  # a middle character: no padding bits
        cases = [
            # (name, token or None, raw header or None, reason)
            ("missing", None, None, "TOKEN_MISSING"),
            ("empty bearer", None, "Bearer ", "TOKEN_MALFORMED"),
            ("not bearer", None, "Basic dXNlcjpwYXNzd29yZA==", "TOKEN_MALFORMED"),
            ("bearer without a space", None, "Bearer" + good, "TOKEN_MALFORMED"),
            ("one segment", None, "Bearer " + h, "TOKEN_MALFORMED"),
            ("two segments", None, "Bearer %s.%s" % (h, p), "TOKEN_MALFORMED"),
            ("four segments", None, "Bearer %s.%s.%s.%s" % (h, p, s, s), "TOKEN_MALFORMED"),
            ("an empty segment", None, "Bearer %s..%s" % (h, s), "TOKEN_MALFORMED"),
            ("not base64url", None, "Bearer %s.%s+/.%s" % (h, p, s), "TOKEN_MALFORMED"),
            ("header not JSON", "%s.%s.%s" % (b64url("{not json"), p, s), None, "TOKEN_MALFORMED"),
            ("header a JSON array", "%s.%s.%s" % (b64url("[1,2]"), p, s), None, "TOKEN_MALFORMED"),
            ("payload not JSON, signed", self.token(self.hs, payload=b64url("hello")), None, "TOKEN_MALFORMED"),
            ("typ not JWT", self.token(header={"typ": "at+jwt-ish"}), None, "TOKEN_MALFORMED"),
            ("crit header", self.token(header={"crit": ["exp"]}), None, "TOKEN_MALFORMED"),
            ("kid not a string", self.token(kid=7), None, "TOKEN_MALFORMED"),
            # signatures
            ("bad signature (altered)", "%s.%s.%s" % (h, p, "".join(sig_chars)), None, "TOKEN_BAD_SIGNATURE"),
            ("payload swapped under a valid signature", "%s.%s.%s" % (h, forged_payload, s), None,
             "TOKEN_BAD_SIGNATURE"),
            ("signature of another token", "%s.%s.%s" % (h, p, self.token(sub="x").split(".")[2]), None,
             "TOKEN_BAD_SIGNATURE"),
            ("wrong RSA key under the kid", self.token(self.rs, sign_with=self.other_rs), None,
             "TOKEN_BAD_SIGNATURE"),
            ("wrong EC key under the kid", self.token(self.es, sign_with=self.other_es), None,
             "TOKEN_BAD_SIGNATURE"),
            ("wrong HMAC secret under the kid", self.token(self.hs, sign_with=self.other_hs), None,
             "TOKEN_BAD_SIGNATURE"),
            ("JWKS key signed by another", self.token(self.j_rs, sign_with=new_rsa(
                os.path.join(self.kd.private, "stray"), "j-rs", "RS384")), None, "TOKEN_BAD_SIGNATURE"),
            # algorithms
            ("alg none", self.token(alg="none", signature=b"x"), None, "TOKEN_ALGORITHM"),
            ("alg None", self.token(alg="None", signature=b"x"), None, "TOKEN_ALGORITHM"),
            ("alg NONE without kid", self.token(alg="NONE", kid=None, signature=b"x"), None, "TOKEN_ALGORITHM"),
            ("alg missing", self.token(alg=None), None, "TOKEN_ALGORITHM"),
            ("alg not a string", self.token(alg=256, signature=b"x"), None, "TOKEN_ALGORITHM"),
            # RFC 7519 6.1's unsecured JWT has an empty signature: the
            # shape check comes first (see src/auth/verify.c).
            ("alg none, empty signature", None, "Bearer %s.%s." % (b64url_json({"alg": "none"}), p),
             "TOKEN_MALFORMED"),
            ("HS256 signed with the RSA key's PEM (HS/RS confusion)",
             self.token(self.rs, alg="HS256", sign_with=RawSigner(self.rs.public_pem)), None, "TOKEN_ALGORITHM"),
            ("HS256 signed with the EC key's PEM",
             self.token(self.es, alg="HS256", sign_with=RawSigner(self.es.public_pem)), None, "TOKEN_ALGORITHM"),
            ("RS256 under the HMAC key's kid", self.token(self.hs, alg="RS256", sign_with=self.rs), None,
             "TOKEN_ALGORITHM"),
            ("ES256 header on the RSA kid", self.token(self.rs, alg="ES256", sign_with=self.es), None,
             "TOKEN_ALGORITHM"),
            ("RS512 header on the RS256 kid", self.token(self.rs, alg="RS512", sign_with=self.rs512), None,
             "TOKEN_ALGORITHM"),
            ("alg in lower case", self.token(self.rs, alg="rs256"), None, "TOKEN_ALGORITHM"),
            ("HS512 on the JWKS oct key as HS256", self.token(self.j_hs, alg="HS256",
                                                              sign_with=RawSigner(self.j_hs.secret)), None,
             "TOKEN_ALGORITHM"),
            # keys
            ("unknown kid", self.token(kid="no-such-key"), None, "TOKEN_UNKNOWN_KEY"),
            ("no kid with several keys", self.token(kid=None), None, "TOKEN_UNKNOWN_KEY"),
            # times
            ("expired", self.token(now=t - 7200), None, "TOKEN_EXPIRED"),
            ("expired just beyond the skew", self.token(now=t - 3600, ttl=3600 - self.SKEW - 3), None,
             "TOKEN_EXPIRED"),
            ("nbf in the future", self.token(nbf=t + 3600), None, "TOKEN_NOT_YET_VALID"),
            ("iat in the future", self.token(now=t + 3600), None, "TOKEN_NOT_YET_VALID"),
            ("nbf just beyond the skew", self.token(nbf=t + self.SKEW + 5), None, "TOKEN_NOT_YET_VALID"),
            # issuer and audience
            ("wrong iss", self.token(iss="https://evil.test"), None, "TOKEN_WRONG_ISSUER"),
            ("no iss", self.token(payload={"sub": "a", "aud": AUD, "exp": t + 60}), None, "TOKEN_WRONG_ISSUER"),
            ("iss differing in case", self.token(iss=ISS.upper()), None, "TOKEN_WRONG_ISSUER"),
            ("wrong aud", self.token(aud="other-service"), None, "TOKEN_WRONG_AUDIENCE"),
            ("aud array without us", self.token(aud=["a", "b"]), None, "TOKEN_WRONG_AUDIENCE"),
            ("no aud", self.token(payload={"sub": "a", "iss": ISS, "exp": t + 60}), None, "TOKEN_WRONG_AUDIENCE"),
            # claims
            ("no exp", self.token(payload={"sub": "a", "iss": ISS, "aud": AUD}), None, "TOKEN_INVALID"),
            ("exp a string", self.token(payload={"sub": "a", "iss": ISS, "aud": AUD, "exp": str(t + 60)}), None,
             "TOKEN_INVALID"),
            ("nbf a string", self.token(nbf="yesterday"), None, "TOKEN_INVALID"),
            ("sub a number", self.token(sub=12345), None, "TOKEN_INVALID"),
            # size: decided on the length alone, before anything is parsed
            ("oversized, validly signed", mint(self.hs, iss=ISS, aud=AUD, pad="p" * 2 * MAX_TOKEN), None,
             "TOKEN_TOO_LARGE"),
            ("oversized junk", None, "Bearer " + "x" * (MAX_TOKEN + 1), "TOKEN_TOO_LARGE"),
            ("oversized, alg none", None, "Bearer %s.%s." % (b64url_json({"alg": "none"}), "q" * MAX_TOKEN),
             "TOKEN_TOO_LARGE"),
        ]
        return cases

    def test_negative_matrix_on_reads_writes_and_admin(self):
        k = self.key("untouched")
        for name, tok, raw, reason in self.matrix():
            with self.subTest(name):
                self.refused(tok, reason, raw_header=raw, method="Get", key=k)
                self.refused(tok, reason, raw_header=raw, method="Set", key=k, value=make_value(name))
                self.refused(tok, reason, raw_header=raw, method="Increment", key=k, delta=1)
        # nothing was written by any of them
        good = self.token()
        self.assertFalse(self.call_as(good, "Get", key=k).found)
        # admin calls need a token too
        admin = self.server.channel().unary_unary("/drey.admin.v1.Admin/GetReadinessDetails",
                                                  request_serializer=lambda b: b,
                                                  response_deserializer=lambda b: b)
        for name, tok, raw, reason in (("missing", None, None, "TOKEN_MISSING"),
                                       ("expired", self.token(now=now() - 7200), None, "TOKEN_EXPIRED")):
            with self.subTest(admin=name):
                with self.assertRpcError(UNAUTH, reason):
                    admin(b"", metadata=bearer(tok) if tok else None, timeout=RPC_TIMEOUT)
        self.assertTrue(admin(b"", metadata=bearer(good), timeout=RPC_TIMEOUT) is not None)

    def test_refusals_are_counted_and_logged_without_the_token(self):
        tok = self.token(now=now() - 7200)
        self.refused(tok, "TOKEN_EXPIRED")
        self.refused(None, "TOKEN_MISSING")
        # the node logs refusals at debug level (this one runs at debug),
        # with the reason and never the token
        rec = self.server.wait_log(lambda r: r.get("msg") == "token refused" and r.get("reason") == "TOKEN_EXPIRED",
                                   30, what="the debug line of the refusal")
        self.assertRegex(rec.get("principal", ""), r"^conn:\d+$")
        text = self.server.log_text()
        for part in tok.split("."):
            self.assertNotIn(part, text, "a piece of a token reached the log")
        status, _, body = http_get("127.0.0.1", ops_port(self.server), "/metrics")
        self.assertEqual(status, 200)
        text = body.decode()
        for reason in ("TOKEN_EXPIRED", "TOKEN_MISSING"):
            lines = [ln for ln in text.split("\n") if ln.startswith("drey_rejections_total{")
                     and 'stage="principal"' in ln and 'reason="%s"' % reason in ln]
            self.assertEqual(len(lines), 1, "no principal-stage counter for %s in:\n%s" % (reason, text[:3000]))
            self.assertGreaterEqual(float(lines[0].rsplit(" ", 1)[1]), 1)

    def test_probes_need_no_token(self):
        h = self.health.Check(self.pb.health.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT)
        self.assertEqual(h.status, self.pb.health.HealthCheckResponse.SERVING)
        refl = ServiceClient(self.channel, self.pb.reflection_v1, REFLECTION_V1)
        q = self.pb.reflection_v1.ServerReflectionRequest(list_services="")
        names = [s.name for r in refl.ServerReflectionInfo(iter([q]), timeout=RPC_TIMEOUT)
                 for s in r.list_services_response.service]
        self.assertIn(CACHE_SERVICE, names)
        self.assertIn(HEALTH_SERVICE, names)

    def test_the_subject_is_the_principal(self):
        """Request ids are scoped by the token subject: the same id is free
        for another subject and taken for the same one (on any key)."""
        alice_sub = "alice-" + uuid.uuid4().hex[:6]
        alice = self.token(self.es, sub=alice_sub)
        alice_hs = self.token(self.hs, sub=alice_sub)
        bob = self.token(self.rs, sub="bob-" + uuid.uuid4().hex[:6])
        rid = "rid-" + uuid.uuid4().hex
        k1, k2 = self.key("a"), self.key("b")
        first = self.call_as(alice, "Set", key=k1, value=make_value("alice"), request_id=rid)
        # alice again, through another key and algorithm: the same principal
        again = self.call_as(alice_hs, "Set", key=k1, value=make_value("alice"), request_id=rid)
        self.assertEqual(again.version, first.version, "a retry of the same subject was applied again")
        with self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED"):
            self.call_as(alice_hs, "Set", key=k2, value=make_value("other"), request_id=rid)
        # bob has his own scope
        r = self.call_as(bob, "Set", key=k2, value=make_value("bob"), request_id=rid)
        self.assertGreater(r.version, first.version)

    # --- no trace ---

    def test_a_refused_token_leaves_no_trace(self):
        sub = "nt-" + uuid.uuid4().hex[:8]
        good = self.token(self.hs, sub=sub)
        t = now()
        bad = {
            "TOKEN_MISSING": None,
            "TOKEN_EXPIRED": self.token(self.hs, sub=sub, now=t - 7200),
            "TOKEN_BAD_SIGNATURE": self.token(self.hs, sub=sub, sign_with=self.other_hs),
            "TOKEN_UNKNOWN_KEY": self.token(self.hs, sub=sub, kid="gone"),
            "TOKEN_WRONG_AUDIENCE": self.token(self.hs, sub=sub, aud="elsewhere"),
        }
        for reason, tok in bad.items():
            with self.subTest(reason):
                k = self.key("nt")
                v0 = self.call_as(good, "Set", key=k, value=make_value("before")).version
                before = details(self.server)
                rid = "rid-" + uuid.uuid4().hex
                self.refused(tok, reason, method="Set", key=k, value=make_value("refused"), request_id=rid)
                self.refused(tok, reason, method="Remove", key=k, request_id=rid + "-rm")
                after = details(self.server)
                self.assertEqual(after["memory"]["usedBytes"], before["memory"]["usedBytes"],
                                 "memory accounting moved")
                self.assertEqual(after["journal"]["lastLsn"], before["journal"]["lastLsn"], "a journal record")
                g = self.call_as(good, "Get", key=k)
                self.assertEqual((value_of(g.value), g.version), ("before", v0), "the key changed")
                # the refused request_id is free, for a different request
                r = self.call_as(good, "Set", key=self.key("other"), value=make_value("different"),
                                 request_id=rid)
                self.assertEqual(r.version, v0 + 1, "the refused write consumed a version")
                r2 = self.call_as(good, "Remove", key=k, request_id=rid + "-rm")
                self.assertTrue(r2.removed)


class NoKeysTest(TokenTestCase):
    """A node without keys names callers by connection and refuses tokens it
    cannot check."""

    def test_a_token_on_a_node_without_keys_is_refused(self):
        key = new_hmac("k1")
        self.refused(mint(key), "TOKEN_UNKNOWN_KEY")
        self.refused(None, "TOKEN_UNKNOWN_KEY", raw_header="Bearer a.b.c")
        self.assertFalse(self.call_as(None, "Get", key="x").found)


class CachedTokenExpiryTest(TokenTestCase):
    """A verified token is remembered only until it expires."""

    @classmethod
    def setUpClass(cls):
        cls.kd = KeyDir()
        cls.hs = cls.kd.hmac("only")
        cls.SERVER_FLAGS = ("--jwt-keys-dir=" + cls.kd.path, "--jwt-clock-skew=0")
        super().setUpClass()

    def test_a_cached_token_expires(self):
        tok = mint(self.hs, payload={"sub": "short", "exp": time.time() + 3})
        self.assertFalse(self.call_as(tok, "Get", key="x").found)  # verified and cached

        def probe():
            try:
                self.call_as(tok, "Get", key="x")
                return "ok"
            except grpc.RpcError as e:
                return RpcFailure(e).reason
        self.assertEqual(poll(probe, lambda r: r != "ok", timeout=30, interval=0.05, what="expiry"),
                         "TOKEN_EXPIRED")

    def test_the_only_key_needs_no_kid(self):
        self.assertFalse(self.call_as(mint(self.hs, kid=None), "Get", key="x").found)


class ReloadTest(TokenTestCase):
    """Key rotation: SIGHUP and the file watcher, each on a private node."""

    SERVER_FLAGS = None

    def node(self, kd, *flags, jwks=None, interval="1h"):
        args = ["--jwt-keys-dir=" + kd.path, "--jwt-reload-interval=" + interval] + list(flags)
        if jwks:
            args.append("--jwt-jwks-file=" + jwks)
        srv = self.start_server(*args)
        self.cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        return srv

    def works(self, tok):
        try:
            self.call_as(tok, "Get", key="x")
            return "ok"
        except grpc.RpcError as e:
            return RpcFailure(e).reason

    def reloads(self, srv, msg):
        return [r for r in srv.log_records() if r.get("msg") == msg]

    def wait_reloads(self, srv, msg, n, trigger=None):
        recs = poll(lambda: self.reloads(srv, msg), lambda rs: len(rs) >= n, timeout=30, interval=0.01,
                    what="%d %r log lines" % (n, msg))
        if trigger is not None:
            self.assertEqual(recs[n - 1].get("trigger"), trigger, recs[n - 1])
        return recs

    def test_sighup_loads_new_keys_and_drops_rotated_away_ones(self):
        kd = KeyDir()
        k1 = kd.rsa("k1")
        srv = self.node(kd)
        t1 = mint(k1)
        self.assertEqual(self.works(t1), "ok")
        self.assertEqual(self.works(t1), "ok")  # now cached
        k2 = kd.ec("k2")
        t2 = mint(k2)
        self.assertEqual(self.works(t2), "TOKEN_UNKNOWN_KEY", "a new key file was used before any reload")
        srv.signal(signal.SIGHUP)
        self.wait_reloads(srv, "auth keys reloaded", 1, trigger="reload")
        self.assertEqual(self.works(t2), "ok")
        self.assertEqual(self.works(t1), "ok")
        kd.remove(k1)
        srv.signal(signal.SIGHUP)
        rec = self.wait_reloads(srv, "auth keys reloaded", 2, trigger="reload")[1]
        self.assertEqual(rec.get("keys"), 1)
        self.assertEqual(self.works(t1), "TOKEN_UNKNOWN_KEY", "a rotated-away key still works (cached token)")
        self.assertEqual(self.works(t2), "ok")
        # a key replaced under the same kid: tokens of the old material stop
        k2b = kd.ec("k2")
        srv.signal(signal.SIGHUP)
        self.wait_reloads(srv, "auth keys reloaded", 3, trigger="reload")
        self.assertEqual(self.works(t2), "TOKEN_BAD_SIGNATURE")
        self.assertEqual(self.works(mint(k2b)), "ok")

    def test_file_changes_are_picked_up_without_a_signal(self):
        kd = KeyDir()
        k1 = kd.hmac("k1")
        self.node(kd, interval="100ms")
        t1 = mint(k1)
        self.assertEqual(self.works(t1), "ok")
        k2 = kd.rsa("k2")
        t2 = mint(k2)
        poll(lambda: self.works(t2), lambda r: r == "ok", timeout=30, interval=0.02, what="the new key")
        kd.remove(k1)
        self.assertEqual(poll(lambda: self.works(t1), lambda r: r != "ok", timeout=30, interval=0.02,
                              what="the removed key refused"), "TOKEN_UNKNOWN_KEY")
        self.assertEqual(self.works(t2), "ok")

    def test_a_broken_reload_keeps_the_old_keys(self):
        kd = KeyDir()
        d1 = kd.hmac("d1")
        j1 = new_rsa(os.path.join(kd.private, "j1"), "j1")
        jwks = os.path.join(kd.base, "jwks.json")
        write_jwks(jwks, [j1.jwk()])
        srv = self.node(kd, jwks=jwks)
        td, tj = mint(d1), mint(j1)
        self.assertEqual((self.works(td), self.works(tj)), ("ok", "ok"))
        d2 = kd.hmac("d2")  # a good new key arrives together with a broken JWKS
        write_atomic(jwks, b'{"keys": [ {"kid": "j1", "alg": ')
        srv.signal(signal.SIGHUP)
        rec = self.wait_reloads(srv, "auth reload failed; keeping the old keys", 1, trigger="reload")[0]
        self.assertIn("jwks", rec.get("reason", ""))
        self.assertEqual((self.works(td), self.works(tj)), ("ok", "ok"), "the old keys are gone")
        self.assertEqual(self.works(mint(d2)), "TOKEN_UNKNOWN_KEY", "half of a failed reload was applied")
        # two keys with one kid: refused as a whole too
        write_jwks(jwks, [j1.jwk(), new_hmac("d1").jwk()])
        srv.signal(signal.SIGHUP)
        self.wait_reloads(srv, "auth reload failed; keeping the old keys", 2)
        self.assertEqual((self.works(td), self.works(tj)), ("ok", "ok"))
        # fixed: everything loads
        write_jwks(jwks, [j1.jwk()])
        srv.signal(signal.SIGHUP)
        self.wait_reloads(srv, "auth keys reloaded", 1, trigger="reload")
        self.assertEqual((self.works(td), self.works(tj), self.works(mint(d2))), ("ok", "ok", "ok"))

    def test_a_keys_dir_left_without_usable_keys_keeps_the_old_keys(self):
        kd = KeyDir()
        k1 = kd.rsa("k1")
        srv = self.node(kd, interval="100ms")
        t1 = mint(k1)
        self.assertEqual(self.works(t1), "ok")
        # Unusable files next to the good key: skipped (with a warning), the
        # good key still loads.
        write_atomic(os.path.join(kd.path, "k2.RS256.pem"), b"-----BEGIN PUBLIC KEY-----\nnot a key\n")
        write_atomic(os.path.join(kd.path, "k3.HS256.key"), b"too short")  # under 32 bytes
        poll(lambda: self.reloads(srv, "auth keys reloaded"),
             lambda rs: rs and rs[-1].get("keys") == 1 and srv.find_log(
                 lambda r: r.get("level") == "warn" and "k3.HS256.key" in str(r)) is not None,
             timeout=30, interval=0.01, what="a reload that skipped the broken files")
        self.assertEqual(self.works(t1), "ok")
        # Now the good key goes: nothing usable is left, the reload fails.
        kd.remove(k1)
        self.wait_reloads(srv, "auth reload failed; keeping the old keys", 1, trigger="watch")
        self.assertEqual(self.works(t1), "ok", "an empty key set replaced the old one")
        # A broken state is reported once, not at every look of the watcher
        # (every 100 ms): let a few looks pass.
        end = time.monotonic() + 0.6
        while time.monotonic() < end:
            self.assertEqual(self.works(t1), "ok")
        self.assertEqual(len(self.reloads(srv, "auth reload failed; keeping the old keys")), 1)
        k4 = kd.ec("k4")
        poll(lambda: self.works(mint(k4)), lambda r: r == "ok", timeout=30, interval=0.02, what="the good key")
        self.assertEqual(self.works(t1), "TOKEN_UNKNOWN_KEY")


class StartupTest(DreyTestCase):
    """What the node refuses to start with."""

    SERVER_FLAGS = None

    def spawn_and_wait(self, *flags, listen="127.0.0.1:0"):
        srv = DreyServer(*flags, listen=listen).spawn()
        self.addCleanup(srv.kill)
        rc = srv.wait(timeout=30)
        return srv, rc

    def test_non_loopback_without_keys_is_refused(self):
        # 127.0.0.1.invalid: a name, not an address (found by tests/fuzz, config)
        for listen in ("0.0.0.0:0", "[::]:0", "127.0.0.1.invalid:0"):
            with self.subTest(listen=listen):
                srv, rc = self.spawn_and_wait(listen=listen)
                self.assertEqual(rc, 2, srv.log_text())
                text = srv.log_text()
                self.assertIn("refusing to listen on %s without JWT keys" % listen, text)
                self.assertIn("--insecure-allow-anonymous-remote", text)
                self.assertIn("--jwt-keys-dir", text)
                self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "listening"))

    def test_the_explicit_opt_out_starts_and_warns(self):
        srv = self.start_server("--insecure-allow-anonymous-remote", listen="0.0.0.0:0")
        warn = srv.find_log(lambda r: r.get("msg", "").startswith("INSECURE"))
        self.assertIsNotNone(warn, srv.log_text())
        self.assertEqual(warn["level"], "warn")
        ch = srv.channel()
        cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.assertFalse(cache.Get(self.pb.cache.GetRequest(key="x"), timeout=RPC_TIMEOUT).found)

    def test_non_loopback_with_keys_starts_and_needs_tokens(self):
        kd = KeyDir()
        k = kd.hmac("k")
        srv = self.start_server("--jwt-keys-dir=" + kd.path, listen="0.0.0.0:0")
        self.assertIsNone(srv.find_log(lambda r: r.get("msg", "").startswith("INSECURE")))
        cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        with self.assertRpcError(UNAUTH, "TOKEN_MISSING"):
            cache.Get(self.pb.cache.GetRequest(key="x"), timeout=RPC_TIMEOUT)
        self.assertFalse(cache.Get(self.pb.cache.GetRequest(key="x"), metadata=bearer(mint(k)),
                                   timeout=RPC_TIMEOUT).found)

    def test_loopback_names_are_fine_without_keys(self):
        for listen in ("localhost:0", "127.0.0.2:0"):
            with self.subTest(listen=listen):
                srv = DreyServer(listen=listen).spawn()
                self.addCleanup(srv.kill)
                rec = srv.wait_log(lambda r: r.get("msg") in ("listening", "cannot start"), 30,
                                   what="listening")
                self.assertEqual(rec["msg"], "listening", srv.log_text())
                srv.stop()

    def test_unloadable_keys_stop_the_start(self):
        kd = KeyDir()
        write_atomic(os.path.join(kd.path, "k.HS256.key"), b"short")
        jwks = os.path.join(kd.base, "jwks.json")
        write_atomic(jwks, b"[]")
        cases = {
            "a keys dir without usable keys": ("--jwt-keys-dir=" + kd.path,),
            "a JWKS that is not one": ("--jwt-jwks-file=" + jwks,),
            "a missing JWKS": ("--jwt-jwks-file=" + os.path.join(kd.base, "absent.json"),),
        }
        for name, flags in cases.items():
            with self.subTest(name):
                srv, rc = self.spawn_and_wait(*flags)
                self.assertEqual(rc, 2, srv.log_text())
                srv.check_log_format()
                err = srv.find_log(lambda r: r.get("msg") == "cannot load the JWT keys")
                self.assertIsNotNone(err, srv.log_text())
                self.assertEqual(err["level"], "error")
                self.assertTrue(err.get("error"))


if __name__ == "__main__":
    main()
