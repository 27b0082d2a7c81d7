// Error details as a Go client reads them: grpc-go hands over the
// google.rpc.Status from grpc-status-details-bin, and every Any in it
// decodes into a google.rpc type (ErrorInfo, BadRequest, QuotaFailure,
// RetryInfo) generated from proto/google/rpc/error_details.proto.
package interop

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"github.com/golang/protobuf/ptypes"
	"google.golang.org/grpc/codes"
)

func TestBadRequestDetails(t *testing.T) {
	t.Parallel()
	c := startServer(t, "--max-key-bytes=16", "--max-value-bytes=64", "--max-cache-name-bytes=8").cache()
	invalid := codes.InvalidArgument
	for _, k := range []string{"", strings.Repeat("k", 17), "tab\there", "a\x00b"} {
		_, err := c.Get(ctx(t), &cachev1.GetRequest{Key: k})
		assertStatus(t, err, invalid, "INVALID_KEY", map[string]string{}, []violation{{"key", "INVALID_KEY"}})
	}
	// Several violations are all listed; the reason is the first one.
	_, err := c.Get(ctx(t), &cachev1.GetRequest{Cache: "no way", Key: ""})
	assertStatus(t, err, invalid, "INVALID_CACHE_NAME", map[string]string{},
		[]violation{{"cache", "INVALID_CACHE_NAME"}, {"key", "INVALID_KEY"}})
	_, err = c.GetMany(ctx(t), &cachev1.GetManyRequest{Keys: []string{"ok", "", "x\ny"}})
	assertStatus(t, err, invalid, "INVALID_KEY", map[string]string{},
		[]violation{{"keys[1]", "INVALID_KEY"}, {"keys[2]", "INVALID_KEY"}})
	_, err = c.Set(ctx(t), &cachev1.SetRequest{Key: "big", Value: str(strings.Repeat("s", 65))})
	assertStatus(t, err, invalid, "PAYLOAD_TOO_LARGE", map[string]string{"limitBytes": "64"},
		[]violation{{"value", "PAYLOAD_TOO_LARGE"}})
	_, err = c.Set(ctx(t), &cachev1.SetRequest{Key: "novalue"})
	d := assertStatus(t, err, invalid, "INVALID_VALUE", map[string]string{}, []violation{{"value", "INVALID_VALUE"}})
	if strings.Join(d.types, ",") != "google.rpc.ErrorInfo,google.rpc.BadRequest" {
		t.Fatalf("detail types %v", d.types)
	}
	// Messages are fixed sentences: nothing the client sent is echoed.
	_, err = c.Get(ctx(t), &cachev1.GetRequest{Key: "MARKER4f2a\n"})
	if d := statusOf(t, err, invalid); strings.Contains(d.st.Message()+d.st.Proto().String(), "MARKER4f2a") {
		t.Fatalf("the status echoes the request: %v", d.st.Proto())
	}
}

var principal = regexp.MustCompile(`^principal:conn:[0-9]+$`)

// quotaDetails checks what every RESOURCE_EXHAUSTED carries: ErrorInfo,
// one QuotaFailure violation with a subject and a description, and a
// positive RetryInfo delay, which it returns.
func quotaDetails(t *testing.T, err error, reason string, subject *regexp.Regexp) (*details, time.Duration) {
	t.Helper()
	d := assertStatus(t, err, codes.ResourceExhausted, reason, nil, nil)
	types := append([]string(nil), d.types...)
	sort.Strings(types)
	if strings.Join(types, ",") != "google.rpc.ErrorInfo,google.rpc.QuotaFailure,google.rpc.RetryInfo" {
		t.Fatalf("detail types %v", d.types)
	}
	if len(d.quota.Violations) != 1 || !subject.MatchString(d.quota.Violations[0].Subject) ||
		d.quota.Violations[0].Description == "" {
		t.Fatalf("QuotaFailure %v, want one violation with subject %v and a description", d.quota, subject)
	}
	delay, derr := ptypes.Duration(d.retry.GetRetryDelay())
	if derr != nil || delay <= 0 {
		t.Fatalf("RetryInfo %v: delay %v (%v)", d.retry, delay, derr)
	}
	return d, delay
}

func TestQuotaFailureAndRetryInfo(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--node-id=node-go", "--principal-rate=2", "--principal-burst=2")
	a, b := srv.cache(), srv.cache() // a connection each: two principals
	refused := func(c cachev1.CacheClient) error {
		for i := 0; i < 20; i++ {
			if _, err := c.Set(ctx(t), &cachev1.SetRequest{Key: key("rl"), Value: i64(1)}); err != nil {
				return err
			}
		}
		t.Fatal("20 calls and no refusal")
		return nil
	}
	d, delay := quotaDetails(t, refused(a), "PRINCIPAL_RATE_LIMIT", principal)
	if d.errorInfo.Metadata["limitRequestsPerSecond"] != "2" {
		t.Fatalf("ErrorInfo metadata %v", d.errorInfo.Metadata)
	}
	if delay > 500*time.Millisecond {
		t.Fatalf("retry_delay %v is not the time to the next token (a token takes 500 ms)", delay)
	}
	db, _ := quotaDetails(t, refused(b), "PRINCIPAL_RATE_LIMIT", principal)
	if db.quota.Violations[0].Subject == d.quota.Violations[0].Subject {
		t.Fatalf("two connections share the principal %s", d.quota.Violations[0].Subject)
	}
	// After the advertised delay there is a token again.
	_, wait := quotaDetails(t, refused(a), "PRINCIPAL_RATE_LIMIT", principal)
	// The hint itself is under test: wait as long as it says (plus the
	// millisecond a Duration rounded to ms may lack), then a call is served.
	time.Sleep(wait + time.Millisecond)
	if _, err := a.Get(ctx(t), &cachev1.GetRequest{Key: "x"}); err != nil {
		t.Fatalf("refused again after the RetryInfo delay %v: %v", wait, err)
	}

	mem := startServer(t, "--node-id=node-go", "--memory-limit=65536").cache()
	var err error
	for i := 0; i < 20 && err == nil; i++ {
		_, err = mem.Set(ctx(t), &cachev1.SetRequest{Key: key("mem"),
			Value: &cachev1.Value{Kind: &cachev1.Value_BytesValue{BytesValue: make([]byte, 8192)}}})
	}
	dm, _ := quotaDetails(t, err, "MEMORY_PRESSURE", regexp.MustCompile(`^node:node-go$`))
	if dm.errorInfo.Metadata["limitBytes"] != "65536" {
		t.Fatalf("ErrorInfo metadata %v", dm.errorInfo.Metadata)
	}
}
