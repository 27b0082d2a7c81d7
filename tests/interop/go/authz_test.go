// Grants and tenant quotas (--authz-policy) as a Go client meets them:
// HS256 tokens signed here, NOT_PERMITTED with its metadata and nothing of
// the request echoed, batches refused whole, Scan held to its prefix, a
// Watch refused, and a tenant's write past its quota refused
// RESOURCE_EXHAUSTED TENANT_MEMORY_QUOTA with QuotaFailure tenant:<id>.
package interop

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

const authzPolicy = `{
  "roles": {
    "writer": [{"caches": ["users"], "keys": ["user:*"], "verbs": ["read", "write", "delete", "scan"]}],
    "watcher": [{"caches": ["users"], "keys": ["user:*"], "verbs": ["watch"]}]
  },
  "bindings": [{"claim": "groups", "contains": "writers", "roles": ["writer"]}],
  "tenants": {"claim": "tenant", "maxBytes": {"acme": 4000}}
}`

var hsSecret = []byte("a-secret-of-thirty-two-bytes-long!!")


// hsToken signs claims (exp added) with the node's HS256 key k1.
func hsToken(t *testing.T, claims map[string]interface{}) string {
	t.Helper()
	claims["exp"] = time.Now().Add(time.Hour).Unix()
	h, _ := json.Marshal(map[string]string{"alg": "HS256", "kid": "k1", "typ": "JWT"})
	p, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signing := b64(h) + "." + b64(p)
	mac := hmac.New(sha256.New, hsSecret)
	io.WriteString(mac, signing)
	return signing + "." + b64(mac.Sum(nil))
}

func authzServer(t *testing.T) *server {
	t.Helper()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keys, "k1.HS256.key"), hsSecret, 0o600); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(policy, []byte(authzPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServer(t, "--ephemeral", "--jwt-keys-dir="+keys, "--authz-policy="+policy)
}

func TestAuthzRefusals(t *testing.T) {
	t.Parallel()
	s := authzServer(t)
	c := s.cache()
	writer := hsToken(t, map[string]interface{}{"sub": "w1", "groups": []string{"x", "writers"}})
	stranger := hsToken(t, map[string]interface{}{"sub": "s1"})
	w := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+writer)
	if _, err := c.Set(w, &cachev1.SetRequest{Cache: "users", Key: "user:1", Value: str("v")}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Set(w, &cachev1.SetRequest{Cache: "users", Key: "admin:SECRETKEY", Value: str("SECRETVALUE")})
	d := assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED",
		map[string]string{"verb": "write", "cache": "users", "method": "/drey.cache.v1.Cache/Set"}, nil)
	if text := d.st.Message() + d.st.Proto().String(); strings.Contains(text, "SECRET") {
		t.Fatalf("the refusal echoes the request: %s", text)
	}
	s1 := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+stranger)
	_, err = c.Get(s1, &cachev1.GetRequest{Cache: "users", Key: "user:1"})
	assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED",
		map[string]string{"verb": "read", "cache": "users", "method": "/drey.cache.v1.Cache/Get"}, nil)

	// Batches whole: nothing of a refused SetMany is written.
	_, err = c.SetMany(w, &cachev1.SetManyRequest{Cache: "users", Entries: []*cachev1.SetManyRequest_Entry{
		{Key: "user:2", Value: str("v")}, {Key: "other:2", Value: str("v")}}})
	assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED", nil, nil)
	got, err := c.Get(w, &cachev1.GetRequest{Cache: "users", Key: "user:2"})
	if err != nil || got.Found {
		t.Fatalf("the granted part of a refused batch was written: %v %v", got, err)
	}
	_, err = c.RemoveMany(w, &cachev1.RemoveManyRequest{Cache: "users", Keys: []string{"user:1", "other:1"}})
	assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED", nil, nil)

	// Scan: the prefix must be covered; the whole cache is not.
	if _, err := c.Scan(w, &cachev1.ScanRequest{Cache: "users", Prefix: "user:"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Scan(w, &cachev1.ScanRequest{Cache: "users"})
	assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED",
		map[string]string{"verb": "scan", "cache": "users", "method": "/drey.cache.v1.Cache/Scan"}, nil)

	// Watch: the writer has no watch verb.
	stream, err := c.Watch(w, &cachev1.WatchRequest{Cache: "users", Keys: []string{"user:1"}})
	if err == nil {
		_, err = stream.Recv()
	}
	assertStatus(t, err, codes.PermissionDenied, "NOT_PERMITTED",
		map[string]string{"verb": "watch", "cache": "users", "method": "/drey.cache.v1.Cache/Watch"}, nil)
}

func TestTenantQuota(t *testing.T) {
	t.Parallel()
	s := authzServer(t)
	c := s.cache()
	acme := metadata.AppendToOutgoingContext(ctx(t), "authorization",
		"Bearer "+hsToken(t, map[string]interface{}{"sub": "a1", "groups": []string{"writers"}, "tenant": "acme"}))
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Set(acme, &cachev1.SetRequest{Cache: "users", Key: key("user:q"), Value: str(strings.Repeat("x", 500))})
	}
	d, delay := quotaDetails(t, err, "TENANT_MEMORY_QUOTA", regexp.MustCompile(`^tenant:acme$`))
	if d.errorInfo.Metadata["limitBytes"] != "4000" || d.errorInfo.Metadata["usedBytes"] == "" ||
		d.errorInfo.Metadata["requestBytes"] == "" {
		t.Fatalf("ErrorInfo metadata %v", d.errorInfo.Metadata)
	}
	if delay <= 0 {
		t.Fatalf("RetryInfo %v", delay)
	}
}
