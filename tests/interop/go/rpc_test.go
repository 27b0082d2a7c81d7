// RPC semantics through grpc-go stubs: every Value kind round trips,
// compare-and-set, Increment and its overflow, atomic batches, request_id
// retries, and expiry (ttl, Touch, Persist, GetExpiration) observed by
// polling with a deadline. The Node suite pins the same contract.
package interop

import (
	"math"
	"strconv"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"github.com/golang/protobuf/proto"
	"github.com/golang/protobuf/ptypes"
	durpb "github.com/golang/protobuf/ptypes/duration"
	structpb "github.com/golang/protobuf/ptypes/struct"
	"google.golang.org/grpc/codes"
)

func str(s string) *cachev1.Value {
	return &cachev1.Value{Kind: &cachev1.Value_StringValue{StringValue: s}}
}
func i64(n int64) *cachev1.Value {
	return &cachev1.Value{Kind: &cachev1.Value_Int64Value{Int64Value: n}}
}

func TestValuesRoundTrip(t *testing.T) {
	t.Parallel()
	c := startServer(t).cache()
	js := &structpb.Struct{Fields: map[string]*structpb.Value{
		"n": {Kind: &structpb.Value_NumberValue{NumberValue: -1.25}},
		"s": {Kind: &structpb.Value_StringValue{StringValue: "text ✓"}},
		"l": {Kind: &structpb.Value_ListValue{ListValue: &structpb.ListValue{Values: []*structpb.Value{
			{Kind: &structpb.Value_BoolValue{BoolValue: true}}, {Kind: &structpb.Value_NullValue{}}}}}},
	}}
	cases := map[string]*cachev1.Value{
		"bytes":     {Kind: &cachev1.Value_BytesValue{BytesValue: []byte{0, 1, 0x7f, 0x80, 0xff}}},
		"string":    str("héllo wörld ✓ 𝄞 日本"),
		"int64 max": i64(math.MaxInt64),
		"int64 min": i64(math.MinInt64),
		"double":    {Kind: &cachev1.Value_DoubleValue{DoubleValue: -2.5e-300}},
		"bool":      {Kind: &cachev1.Value_BoolValue{BoolValue: false}},
		"json":      {Kind: &cachev1.Value_JsonValue{JsonValue: js}},
		"null":      {Kind: &cachev1.Value_NullValue{}},
	}
	for name, v := range cases {
		k := key("value")
		set, err := c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: v})
		if err != nil {
			t.Fatalf("%s: Set: %v", name, err)
		}
		got, err := c.Get(ctx(t), &cachev1.GetRequest{Key: k})
		if err != nil {
			t.Fatalf("%s: Get: %v", name, err)
		}
		if !got.Found || got.Version != set.Version || got.ExpiresAt != nil {
			t.Fatalf("%s: Get %v after Set %v", name, got, set)
		}
		if !proto.Equal(got.Value, v) {
			t.Fatalf("%s: got %v, sent %v", name, got.Value, v)
		}
	}
	// Caches are namespaces: the same key in another cache is another entry.
	k := key("ns")
	if _, err := c.Set(ctx(t), &cachev1.SetRequest{Cache: "other", Key: k, Value: str("x")}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx(t), &cachev1.GetRequest{Key: k}); err != nil || got.Found {
		t.Fatalf("default cache sees another cache's key: %v %v", got, err)
	}
}

func mismatch(t *testing.T, err error, current uint64) {
	t.Helper()
	assertStatus(t, err, codes.FailedPrecondition, "VERSION_MISMATCH",
		map[string]string{"currentVersion": strconv.FormatUint(current, 10)}, nil)
}

func TestCompareAndSet(t *testing.T) {
	t.Parallel()
	c := startServer(t).cache()
	k := key("cas")
	absentOnly := &cachev1.SetRequest_IfVersion{IfVersion: 0}
	v1, err := c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: str("v1"), Condition: absentOnly})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: str("x"), Condition: absentOnly})
	mismatch(t, err, v1.Version)
	v2, err := c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: str("v2"),
		Condition: &cachev1.SetRequest_IfVersion{IfVersion: v1.Version}})
	if err != nil || v2.Version <= v1.Version {
		t.Fatalf("CAS with the live version: %v %v", v2, err)
	}
	_, err = c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: str("x"),
		Condition: &cachev1.SetRequest_IfVersion{IfVersion: v1.Version}})
	mismatch(t, err, v2.Version)
	got, _ := c.Get(ctx(t), &cachev1.GetRequest{Key: k})
	if got.GetValue().GetStringValue() != "v2" || got.Version != v2.Version {
		t.Fatalf("a failed CAS changed the entry: %v", got)
	}
	// Remove guarded by a version; the absent key's version is 0.
	_, err = c.Remove(ctx(t), &cachev1.RemoveRequest{Key: key("absent"),
		Condition: &cachev1.RemoveRequest_IfVersion{IfVersion: v2.Version}})
	mismatch(t, err, 0)
	rm, err := c.Remove(ctx(t), &cachev1.RemoveRequest{Key: k, ReturnPrevious: true,
		Condition: &cachev1.RemoveRequest_IfVersion{IfVersion: v2.Version}})
	if err != nil || !rm.Removed || rm.Version != v2.Version || rm.Previous.GetStringValue() != "v2" {
		t.Fatalf("conditional Remove: %v %v", rm, err)
	}
	// Add and GetOrAdd insert only when absent.
	add, err := c.Add(ctx(t), &cachev1.AddRequest{Key: k, Value: str("first")})
	if err != nil || !add.Added {
		t.Fatalf("Add of an absent key: %v %v", add, err)
	}
	again, err := c.Add(ctx(t), &cachev1.AddRequest{Key: k, Value: str("second")})
	if err != nil || again.Added || again.Version != add.Version || again.CurrentValue.GetStringValue() != "first" {
		t.Fatalf("Add of a live key: %v %v", again, err)
	}
	goa, err := c.GetOrAdd(ctx(t), &cachev1.GetOrAddRequest{Key: k, Value: str("third")})
	if err != nil || goa.Added || goa.Value.GetStringValue() != "first" {
		t.Fatalf("GetOrAdd of a live key: %v %v", goa, err)
	}
}

func TestIncrement(t *testing.T) {
	t.Parallel()
	c := startServer(t).cache()
	k := key("incr")
	a, err := c.Increment(ctx(t), &cachev1.IncrementRequest{Key: k, Delta: 5, Initial: 10})
	if err != nil || a.Value != 15 || !a.Created {
		t.Fatalf("first Increment: %v %v", a, err)
	}
	b, err := c.Increment(ctx(t), &cachev1.IncrementRequest{Key: k, Delta: -20, Initial: 1000})
	if err != nil || b.Value != -5 || b.Created || b.Version <= a.Version {
		t.Fatalf("second Increment (initial applies only on creation): %v %v", b, err)
	}
	// int64 precision beyond 2^53, then the limit and past it.
	big := key("incr-big")
	if r, err := c.Increment(ctx(t), &cachev1.IncrementRequest{Key: big, Delta: 1, Initial: math.MaxInt64 - 1}); err != nil || r.Value != math.MaxInt64 {
		t.Fatalf("Increment to MaxInt64: %v %v", r, err)
	}
	_, err = c.Increment(ctx(t), &cachev1.IncrementRequest{Key: big, Delta: 1})
	assertStatus(t, err, codes.OutOfRange, "INTEGER_OVERFLOW", map[string]string{}, nil)
	if got, _ := c.Get(ctx(t), &cachev1.GetRequest{Key: big}); got.GetValue().GetInt64Value() != math.MaxInt64 {
		t.Fatalf("an overflowing Increment changed the value: %v", got)
	}
	s := key("incr-str")
	if _, err := c.Set(ctx(t), &cachev1.SetRequest{Key: s, Value: str("12")}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Increment(ctx(t), &cachev1.IncrementRequest{Key: s, Delta: 1})
	assertStatus(t, err, codes.FailedPrecondition, "NOT_AN_INTEGER", map[string]string{}, nil)

	// A retried request_id returns the first outcome instead of applying twice.
	idem, id := key("idem"), key("req")
	first, err := c.Increment(ctx(t), &cachev1.IncrementRequest{Key: idem, Delta: 1, RequestId: id})
	if err != nil {
		t.Fatal(err)
	}
	retry, err := c.Increment(ctx(t), &cachev1.IncrementRequest{Key: idem, Delta: 1, RequestId: id})
	if err != nil || !proto.Equal(first, retry) {
		t.Fatalf("retry %v differs from the first outcome %v (%v)", retry, first, err)
	}
	if got, _ := c.Get(ctx(t), &cachev1.GetRequest{Key: idem}); got.GetValue().GetInt64Value() != 1 {
		t.Fatalf("a retried request_id applied twice: %v", got)
	}
}

func TestBatches(t *testing.T) {
	t.Parallel()
	c := startServer(t, "--max-batch=3").cache()
	a, b, x := key("batch"), key("batch"), key("batch")
	set, err := c.SetMany(ctx(t), &cachev1.SetManyRequest{Entries: []*cachev1.SetManyRequest_Entry{
		{Key: a, Value: i64(1)},
		{Key: b, Value: str("two"), Expiration: &cachev1.SetManyRequest_Entry_Ttl{Ttl: &durpb.Duration{Seconds: 60}}},
	}})
	if err != nil || len(set.Results) != 2 || set.Results[0].ExpiresAt != nil || set.Results[1].ExpiresAt == nil {
		t.Fatalf("SetMany: %v %v", set, err)
	}
	got, err := c.GetMany(ctx(t), &cachev1.GetManyRequest{Keys: []string{b, x, a}})
	if err != nil || len(got.Results) != 3 {
		t.Fatalf("GetMany: %v %v", got, err)
	}
	r := got.Results
	if r[0].Key != b || !r[0].Found || r[0].Value.GetStringValue() != "two" || r[0].Version != set.Results[1].Version ||
		r[1].Key != x || r[1].Found || r[2].Key != a || r[2].Value.GetInt64Value() != 1 {
		t.Fatalf("GetMany results out of order or wrong: %v", r)
	}
	// All or nothing: one failed condition applies none of the entries.
	_, err = c.SetMany(ctx(t), &cachev1.SetManyRequest{Entries: []*cachev1.SetManyRequest_Entry{
		{Key: x, Value: i64(9)},
		{Key: a, Value: i64(9), Condition: &cachev1.SetManyRequest_Entry_IfVersion{IfVersion: set.Results[0].Version + 100}},
	}})
	assertStatus(t, err, codes.FailedPrecondition, "VERSION_MISMATCH", map[string]string{
		"currentVersion": strconv.FormatUint(set.Results[0].Version, 10), "entryIndex": "1"}, nil)
	if g, _ := c.Get(ctx(t), &cachev1.GetRequest{Key: x}); g.Found {
		t.Fatalf("a rejected SetMany stored an entry: %v", g)
	}
	// More than --max-batch: BATCH_TOO_LARGE with the limit, a BadRequest.
	_, err = c.GetMany(ctx(t), &cachev1.GetManyRequest{Keys: []string{"1", "2", "3", "4"}})
	assertStatus(t, err, codes.InvalidArgument, "BATCH_TOO_LARGE", map[string]string{"limitItems": "3"},
		[]violation{{"keys", "BATCH_TOO_LARGE"}})
	_, err = c.SetMany(ctx(t), &cachev1.SetManyRequest{Entries: []*cachev1.SetManyRequest_Entry{
		{Key: x, Value: i64(1)}, {Key: "", Value: i64(1)}, {Key: x, Value: i64(1)},
	}})
	// Every violation is listed; the reason is the first one.
	assertStatus(t, err, codes.InvalidArgument, "INVALID_KEY", nil,
		[]violation{{"entries[1].key", "INVALID_KEY"}, {"entries[2].key", "DUPLICATE_KEY"}})
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	c := startServer(t).cache()
	k := key("ttl")
	t0 := time.Now()
	set, err := c.Set(ctx(t), &cachev1.SetRequest{Key: k, Value: str("x"),
		Expiration: &cachev1.SetRequest_Ttl{Ttl: &durpb.Duration{Seconds: 60}}})
	if err != nil {
		t.Fatal(err)
	}
	at, err := ptypes.Timestamp(set.ExpiresAt)
	// Client and server read the same clock; allow for ms rounding.
	if err != nil || at.Before(t0.Add(60*time.Second-5*time.Millisecond)) || at.After(time.Now().Add(60*time.Second+5*time.Millisecond)) {
		t.Fatalf("expires_at %v not 60 s after the call (%v)", at, err)
	}
	exp, err := c.GetExpiration(ctx(t), &cachev1.GetExpirationRequest{Key: k})
	if err != nil || !exp.Found || !exp.HasExpiration || !proto.Equal(exp.ExpiresAt, set.ExpiresAt) {
		t.Fatalf("GetExpiration: %v %v", exp, err)
	}
	if rem, _ := ptypes.Duration(exp.Remaining); rem <= 0 || rem > 60*time.Second {
		t.Fatalf("remaining %v", rem)
	}
	p, err := c.Persist(ctx(t), &cachev1.PersistRequest{Key: k})
	if err != nil || !p.Found || p.Version != set.Version {
		t.Fatalf("Persist: %v %v", p, err)
	}
	if exp, _ := c.GetExpiration(ctx(t), &cachev1.GetExpirationRequest{Key: k}); !exp.Found || exp.HasExpiration {
		t.Fatalf("GetExpiration after Persist: %v", exp)
	}
	// Touch with a short ttl: the key disappears once it has passed, never before.
	short := 300 * time.Millisecond
	touch, err := c.Touch(ctx(t), &cachev1.TouchRequest{Key: k, Ttl: ptypes.DurationProto(short)})
	if err != nil || !touch.Found || touch.Version != set.Version {
		t.Fatalf("Touch: %v %v", touch, err)
	}
	expiresAt, _ := ptypes.Timestamp(touch.ExpiresAt)
	var goneAt time.Time
	pollUntil(t, "expiry of "+k, 15*time.Second, func() (bool, string) {
		g, err := c.Get(ctx(t), &cachev1.GetRequest{Key: k})
		goneAt = time.Now()
		return err == nil && !g.Found, proto.CompactTextString(g)
	})
	if goneAt.Before(expiresAt) {
		t.Fatalf("expired early: gone at %v, expires_at %v", goneAt, expiresAt)
	}
	// An expired entry is invisible to every operation.
	if r, err := c.Touch(ctx(t), &cachev1.TouchRequest{Key: k, Ttl: &durpb.Duration{Seconds: 60}}); err != nil || r.Found {
		t.Fatalf("Touch of an expired key: %v %v", r, err)
	}
	if r, err := c.Add(ctx(t), &cachev1.AddRequest{Key: k, Value: str("again")}); err != nil || !r.Added {
		t.Fatalf("Add over an expired key: %v %v", r, err)
	}
	_, err = c.Touch(ctx(t), &cachev1.TouchRequest{Key: k})
	assertStatus(t, err, codes.InvalidArgument, "INVALID_EXPIRATION", nil, []violation{{"ttl", "INVALID_EXPIRATION"}})
}
