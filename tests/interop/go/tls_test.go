// TLS with a bearer token, everything made with Go's own crypto: a CA and
// a server certificate for 127.0.0.1, an ES256 key whose public half goes
// into --jwt-keys-dir as <kid>.ES256.pem, and JWTs signed with it, sent
// through grpc-go's per-RPC credentials (which insist on TLS).
package interop

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

type pki struct {
	dir               string
	caKey             *ecdsa.PrivateKey
	ca                *x509.Certificate
	certPath, keyPath string
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0600); err != nil {
		t.Fatal(err)
	}
}

// newPKI makes a CA and a server certificate for 127.0.0.1 and localhost
// signed by it, written where --tls-cert and --tls-key will read them.
func newPKI(t *testing.T) *pki {
	p := &pki{dir: t.TempDir(), caKey: newKey(t)}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "drey-go-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, p.caKey.Public(), p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	srvKey := newKey(t)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(0x1001), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(48 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if der, err = x509.CreateCertificate(rand.Reader, srvTmpl, p.ca, srvKey.Public(), p.caKey); err != nil {
		t.Fatal(err)
	}
	p.certPath, p.keyPath = filepath.Join(p.dir, "server.pem"), filepath.Join(p.dir, "server.key")
	writePEM(t, p.certPath, "CERTIFICATE", der)
	keyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.keyPath, "PRIVATE KEY", keyDER)
	return p
}

func (p *pki) clientTLS(trust *x509.Certificate) grpc.DialOption {
	roots := x509.NewCertPool()
	roots.AddCert(trust)
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}))
}

// jwtKey signs ES256 tokens; its public key is installed as kid.ES256.pem.
type jwtKey struct {
	kid  string
	priv *ecdsa.PrivateKey
}

func installJWTKey(t *testing.T, dir, kid string) *jwtKey {
	k := &jwtKey{kid, newKey(t)}
	der, err := x509.MarshalPKIXPublicKey(k.priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, kid+".ES256.pem"), "PUBLIC KEY", der)
	return k
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// mint makes a compact JWS: ES256 signatures are r||s, 32 bytes each
// (RFC 7518 section 3.4), not Go's ASN.1 encoding.
func (k *jwtKey) mint(t *testing.T, claims map[string]interface{}) string {
	h, _ := json.Marshal(map[string]string{"alg": "ES256", "typ": "JWT", "kid": k.kid})
	c, _ := json.Marshal(claims)
	input := b64(h) + "." + b64(c)
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, k.priv, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + b64(sig)
}

// bearer is grpc-go per-RPC credentials carrying a token; RequireTransportSecurity
// keeps grpc-go from ever sending it over plaintext.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

func TestTLSWithToken(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	keys := t.TempDir()
	k := installJWTKey(t, keys, "k-go")
	srv := startServerOver(t, p.clientTLS(p.ca), "--ephemeral", "--tls-cert="+p.certPath, "--tls-key="+p.keyPath,
		"--jwt-keys-dir="+keys, "--jwt-issuer=drey-go-test", "--jwt-audience=drey")
	now := time.Now().Unix()
	good := k.mint(t, map[string]interface{}{"sub": "gopher", "iss": "drey-go-test", "aud": "drey", "iat": now, "exp": now + 600})

	// TLS and a valid token: served.
	c := cachev1.NewCacheClient(srv.dialWith(p.clientTLS(p.ca), grpc.WithPerRPCCredentials(bearer(good))))
	set, err := c.Set(ctx(t), &cachev1.SetRequest{Key: "tls", Value: str("over TLS")})
	if err != nil {
		t.Fatalf("Set over TLS with a valid token: %v", err)
	}
	if g, err := c.Get(ctx(t), &cachev1.GetRequest{Key: "tls"}); err != nil || g.Version != set.Version || g.Value.GetStringValue() != "over TLS" {
		t.Fatalf("Get over TLS with a valid token: %v %v", g, err)
	}

	// TLS without a token: UNAUTHENTICATED TOKEN_MISSING, while health
	// (which needs no token) answers on the same connection.
	conn := srv.dial()
	_, err = cachev1.NewCacheClient(conn).Get(ctx(t), &cachev1.GetRequest{Key: "tls"})
	assertStatus(t, err, codes.Unauthenticated, "TOKEN_MISSING", nil, nil)
	if r, err := healthpb.NewHealthClient(conn).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over TLS without a token: %v %v", r, err)
	}

	// Tokens the node must refuse, each with its reason.
	other := &jwtKey{"k-go", newKey(t)} // same kid, a key the node does not have
	for reason, tok := range map[string]string{
		"TOKEN_EXPIRED":        k.mint(t, map[string]interface{}{"sub": "gopher", "iss": "drey-go-test", "aud": "drey", "iat": now - 7200, "exp": now - 3600}),
		"TOKEN_WRONG_AUDIENCE": k.mint(t, map[string]interface{}{"sub": "gopher", "iss": "drey-go-test", "aud": "else", "exp": now + 600}),
		"TOKEN_BAD_SIGNATURE":  other.mint(t, map[string]interface{}{"sub": "gopher", "iss": "drey-go-test", "aud": "drey", "exp": now + 600}),
		"TOKEN_UNKNOWN_KEY":    (&jwtKey{"k-none", k.priv}).mint(t, map[string]interface{}{"sub": "gopher", "exp": now + 600}),
	} {
		bad := cachev1.NewCacheClient(srv.dialWith(p.clientTLS(p.ca), grpc.WithPerRPCCredentials(bearer(tok))))
		_, err := bad.Get(ctx(t), &cachev1.GetRequest{Key: "tls"})
		assertStatus(t, err, codes.Unauthenticated, reason, nil, nil)
	}

	// Plaintext to a TLS node, and TLS to a node whose CA is not trusted:
	// UNAVAILABLE, the call never reaches the service.
	stranger := newPKI(t)
	for name, opt := range map[string]grpc.DialOption{"plaintext": grpc.WithInsecure(), "untrusted CA": p.clientTLS(stranger.ca)} {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cachev1.NewCacheClient(srv.dialWith(opt)).Get(c, &cachev1.GetRequest{Key: "tls"})
		cancel()
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable {
			t.Fatalf("%s: %v, want UNAVAILABLE", name, err)
		}
	}
}
