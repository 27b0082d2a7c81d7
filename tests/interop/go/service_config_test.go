// The clients' gRPC service configs (deploy/client/, docs/clients.md) with
// grpc-go: a partition's primary SIGKILLed under a client connected to it,
// and the retry pushback. grpc-go before 1.40 retries only with
// GRPC_GO_RETRY=on (run.sh sets it).
//
// The cluster is tests/integration/python/drey_failover.py run as a
// program (etcd, three dreyd with replication factor 2), driven over its
// standard input, with a 2 s lease. The test revokes the dead node's lease
// itself once it has seen the failover's refusals, so that the promotion
// comes at once: grpc-go 1.33 draws each backoff uniformly from [0, b] (A6
// as first written; the C core, grpc-js and newer grpc-go use b +- 20%), so
// whether four retries outlast a lease-long wait for the promotion is
// chance. The promoted backup then holds the calls that reach it until the
// lease it granted the dead primary has run out (docs/cluster.md), so an
// attempt made after the promotion succeeds. The Python and Node tests
// wait for the lease to expire instead.
package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
)

const (
	defaultConfig   = "service-config.json"
	requestIDConfig = "service-config-request-id.json"
)

// sourceRoot is the repository (or its runfiles tree under Bazel), which
// run.sh names.
func sourceRoot(t *testing.T) string {
	t.Helper()
	root := os.Getenv("DREY_SOURCE_ROOT")
	if root == "" {
		t.Fatal("DREY_SOURCE_ROOT is not set (run the tests through run.sh)")
	}
	return root
}

func serviceConfig(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(sourceRoot(t), "deploy", "client", name))
	if err != nil {
		t.Fatalf("the service config: %v", err)
	}
	return string(data)
}

type failoverNode struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

type fixture struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	Keys  []string     `json:"keys"`
	Vic   failoverNode `json:"victim"`
	Other failoverNode `json:"other"`
}

type fixtureAnswer struct {
	OK    bool   `json:"ok"`
	Error string `json:"error"`
	Value int64  `json:"value"`
}

// startFailover runs the fixture and reads the scenario it describes.
func startFailover(t *testing.T, leaseTTL string) *fixture {
	t.Helper()
	script := filepath.Join(sourceRoot(t), "tests", "integration", "python", "drey_failover.py")
	f := &fixture{t: t, cmd: exec.Command("/usr/bin/python3", "-u", script, "--lease-ttl="+leaseTTL)}
	f.cmd.Stderr = os.Stderr
	var err error
	if f.in, err = f.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", script, err)
	}
	t.Cleanup(func() {
		f.in.Close() // the end of its input stops everything
		done := make(chan error, 1)
		go func() { done <- f.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(stopTimeout):
			f.cmd.Process.Kill()
			<-done
			t.Errorf("the failover fixture did not stop within %v", stopTimeout)
		}
	})
	f.out = bufio.NewScanner(stdout)
	f.out.Buffer(make([]byte, 1<<16), 1<<20)
	if !f.out.Scan() {
		t.Fatalf("the failover fixture ended before describing its cluster: %v", f.out.Err())
	}
	if err := json.Unmarshal(f.out.Bytes(), f); err != nil {
		t.Fatalf("the fixture said %q: %v", f.out.Text(), err)
	}
	return f
}

// do sends one command and returns its answer; a refused command fails the test.
func (f *fixture) do(cmd map[string]string) fixtureAnswer {
	f.t.Helper()
	line, _ := json.Marshal(cmd)
	if _, err := fmt.Fprintf(f.in, "%s\n", line); err != nil {
		f.t.Fatalf("writing to the fixture: %v", err)
	}
	if !f.out.Scan() {
		f.t.Fatalf("the fixture ended after %s: %v", line, f.out.Err())
	}
	var a fixtureAnswer
	if err := json.Unmarshal(f.out.Bytes(), &a); err != nil || !a.OK {
		f.t.Fatalf("%s: the fixture answered %q (%v)", line, f.out.Text(), err)
	}
	return a
}

// refusals is how many calls of method the other node answered UNAVAILABLE.
func (f *fixture) refusals(method string) int64 {
	f.t.Helper()
	return f.do(map[string]string{"cmd": "requests", "method": method, "code": "UNAVAILABLE"}).Value
}

// dialAll connects to the addresses in order, as pick_first does (the
// default policy): the first that answers, and the next when it goes away;
// with the service config named, or none.
func dialAll(t *testing.T, config string, addrs ...string) cachev1.CacheClient {
	t.Helper()
	r := manual.NewBuilderWithScheme(fmt.Sprintf("drey%d", time.Now().UnixNano()))
	var list []resolver.Address
	for _, a := range addrs {
		list = append(list, resolver.Address{Addr: a})
	}
	r.InitialState(resolver.State{Addresses: list})
	opts := []grpc.DialOption{grpc.WithInsecure(), grpc.WithResolvers(r)}
	if config != "" {
		opts = append(opts, grpc.WithDefaultServiceConfig(config))
	}
	conn, err := grpc.Dial(r.Scheme()+":///drey", opts...)
	if err != nil {
		t.Fatalf("dial %v: %v", addrs, err)
	}
	t.Cleanup(func() { conn.Close() })
	return cachev1.NewCacheClient(conn)
}

func TestServiceConfigFailover(t *testing.T) {
	t.Parallel()
	f := startFailover(t, "2s")
	k := f.Keys
	seed := dialAll(t, "", f.Other.Address)
	for _, key := range k[:2] {
		if _, err := seed.Set(ctx(t), &cachev1.SetRequest{Key: key, Value: str("before " + key)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := seed.Set(ctx(t), &cachev1.SetRequest{Key: k[2], Value: i64(10)}); err != nil {
		t.Fatal(err)
	}
	reads := dialAll(t, serviceConfig(t, defaultConfig), f.Vic.Address, f.Other.Address)
	writes := dialAll(t, serviceConfig(t, requestIDConfig), f.Vic.Address, f.Other.Address)
	plain := dialAll(t, "", f.Vic.Address, f.Other.Address)
	for _, c := range []cachev1.CacheClient{reads, writes, plain} {
		if _, err := c.Get(ctx(t), &cachev1.GetRequest{Key: k[0]}); err != nil {
			t.Fatal(err)
		}
	}
	methods := []string{"GetExpiration", "GetMany", "Increment"}
	before := map[string]int64{}
	for _, m := range methods {
		before[m] = f.refusals(m)
	}

	f.do(map[string]string{"cmd": "kill"})
	killed := time.Now()
	// Made during the failover; nothing here retries them.
	type result struct {
		what string
		err  error
		ok   bool
	}
	results := make(chan result, 3)
	go func() {
		r, err := reads.GetExpiration(ctx(t), &cachev1.GetExpirationRequest{Key: k[0]})
		results <- result{"GetExpiration", err, err == nil && r.Found}
	}()
	go func() {
		r, err := reads.GetMany(ctx(t), &cachev1.GetManyRequest{Keys: k[:2]})
		ok := err == nil && len(r.Results) == 2
		for i := 0; ok && i < 2; i++ {
			ok = r.Results[i].Found && r.Results[i].Value.GetStringValue() == "before "+k[i]
		}
		results <- result{"GetMany", err, ok}
	}()
	rid := key("rid")
	go func() {
		r, err := writes.Increment(ctx(t), &cachev1.IncrementRequest{Key: k[2], Delta: 1, RequestId: rid})
		results <- result{"Increment", err, err == nil && r.Value == 11}
	}()
	// At the same moment, without the config, and a write without a
	// request_id under the default config: refused, not retried.
	_, err := plain.Get(ctx(t), &cachev1.GetRequest{Key: k[0]})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Get without the config during the failover: %v, want UNAVAILABLE", err)
	}
	_, err = reads.Set(ctx(t), &cachev1.SetRequest{Key: k[3], Value: str("lost")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Set without request_id during the failover: %v, want UNAVAILABLE", err)
	}
	// Refused at the node the clients fell back to before the failover
	// ends (a call that succeeded at once would count nothing here).
	for _, m := range methods {
		m := m
		pollUntil(t, m+" refused at "+f.Other.ID, callTimeout, func() (bool, string) {
			n := f.refusals(m)
			return n > before[m], fmt.Sprint(n)
		})
	}
	f.do(map[string]string{"cmd": "revoke"})
	for range methods {
		r := <-results
		if r.err != nil || !r.ok {
			t.Errorf("%s during the failover: ok=%v, %v", r.what, r.ok, r.err)
		}
	}
	t.Logf("the calls made at the SIGKILL succeeded %.2fs after it", time.Since(killed).Seconds())
	// Once: the counter moved by one, and the request_id answers as it did.
	got, err := plain.Get(ctx(t), &cachev1.GetRequest{Key: k[2]})
	if err != nil || got.Value.GetInt64Value() != 11 {
		t.Fatalf("the counter after the failover: %v, %v", got, err)
	}
	again, err := writes.Increment(ctx(t), &cachev1.IncrementRequest{Key: k[2], Delta: 1, RequestId: rid})
	if err != nil || again.Value != 11 {
		t.Fatalf("the Increment again with its request_id: %v, %v", again, err)
	}
}

func TestServiceConfigPushback(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--ephemeral", "--node-rate=1", "--node-burst=1")
	retrying := dialAll(t, serviceConfig(t, defaultConfig), s.Addr)
	plain := s.cache()
	get := &cachev1.GetRequest{Key: key("k")}
	// Until a call is admitted: the next token comes a second later, so a
	// call made now is refused with a RetryInfo of nearly 1 s.
	pollUntil(t, "a call admitted", callTimeout, func() (bool, string) {
		_, err := plain.Get(ctx(t), get)
		return err == nil, fmt.Sprint(err)
	})
	// The call has 700 ms: drey says grpc-retry-pushback-ms: -1 and grpc-go
	// gives up at once with the refusal (its backoff could have waited out
	// the deadline).
	short, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	_, err := retrying.Get(short, get)
	d := statusOf(t, err, codes.ResourceExhausted)
	if d.errorInfo == nil || d.errorInfo.Reason != "NODE_RATE_LIMIT" {
		t.Fatalf("not the rate limit's refusal: %v", d.st.Proto())
	}
	// With time left it is retried until the bucket has a token again: the
	// node refused it first.
	refused := requestsTotal(t, s, "Get", "RESOURCE_EXHAUSTED")
	if _, err := retrying.Get(ctx(t), get); err != nil {
		t.Fatalf("Get with the config and time to retry: %v", err)
	}
	if n := requestsTotal(t, s, "Get", "RESOURCE_EXHAUSTED"); n <= refused {
		t.Fatalf("the call was not refused first (%d refusals, %d before): nothing was retried", n, refused)
	}
}

// requestsTotal is the node's drey_requests_total for a Cache method and code.
func requestsTotal(t *testing.T, s *server, method, code string) int64 {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", s.OpsPort))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %v %v", resp.Status, err)
	}
	prefix := fmt.Sprintf("drey_requests_total{method=\"/drey.cache.v1.Cache/%s\",code=\"%s\"} ", method, code)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			n, err := strconv.ParseInt(strings.TrimPrefix(line, prefix), 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return n
		}
	}
	return 0
}
