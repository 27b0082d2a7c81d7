// Package interop drives the real dreyd from Go with the stack a Go team
// would use: grpc-go, stubs generated from proto/ by protoc-gen-go (run.sh
// does it before `go test`), grpc-go's health and reflection clients, and
// google.rpc error details from genproto, all Debian packages.
//
// This file is the harness: start dreyd on kernel-chosen ports and wait
// for it to serve, stop it and insist on exit 0, decode status details.
// Environment (set by run.sh): DREY_BIN, the absolute path of dreyd.
package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"github.com/golang/protobuf/proto"
	"github.com/golang/protobuf/ptypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// Generous: dreyd under ASan on a busy 2-core machine starts slowly.
const (
	startTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second
	callTimeout  = 15 * time.Second
	pollPace     = 10 * time.Millisecond
)

const cacheService = "drey.cache.v1.Cache"

type server struct {
	t       *testing.T
	args    []string
	dir     string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has been waited for
	waitErr error
	Port    int
	OpsPort int
	Addr    string
	// transport is how dial connects: plaintext unless the test says so.
	transport grpc.DialOption
}

type logLine map[string]interface{}

func (s *server) logLines() []logLine {
	data, err := os.ReadFile(s.logPath)
	if err != nil {
		s.t.Fatalf("reading the dreyd log: %v", err)
	}
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		// Not every stderr line need be JSON (e.g. sanitizer reports).
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

func (s *server) log() string {
	data, _ := os.ReadFile(s.logPath)
	return string(data)
}

func (s *server) findLog(msg string) logLine {
	for _, l := range s.logLines() {
		if l["msg"] == msg {
			return l
		}
	}
	return nil
}

func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// startServer starts dreyd on 127.0.0.1 with kernel-chosen gRPC and ops
// ports, a data directory of its own and --drain-grace=0s unless args set
// them, waits for the "listening" log line that names the ports, then for
// Health/Check("") to say SERVING (a durable node listens, and answers
// NOT_SERVING, while it recovers). The server is stopped when the test ends.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	return startServerOver(t, grpc.WithInsecure(), args...)
}

// startServerOver is startServer for a node that wants another transport
// (TLS): readiness is checked, and dial connects, through `transport`.
func startServerOver(t *testing.T, transport grpc.DialOption, args ...string) *server {
	t.Helper()
	bin := os.Getenv("DREY_BIN")
	if bin == "" {
		t.Fatal("DREY_BIN is not set (run the tests through run.sh)")
	}
	dir := t.TempDir()
	all := []string{"--listen=127.0.0.1:0", "--ops-listen=127.0.0.1:0"}
	if !hasFlag(args, "--drain-grace") {
		all = append(all, "--drain-grace=0s")
	}
	if !hasFlag(args, "--data-dir") && !hasFlag(args, "--ephemeral") {
		all = append(all, "--data-dir="+filepath.Join(dir, "data"))
	}
	all = append(all, args...)
	s := &server{t: t, args: all, dir: dir, logPath: filepath.Join(dir, "stderr.log"), done: make(chan struct{}),
		transport: transport}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, all...)
	s.cmd.Stderr = logFile
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("starting %s: %v", bin, err)
	}
	logFile.Close()
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.stop() })

	deadline := time.Now().Add(startTimeout)
	for s.Port == 0 {
		if l := s.findLog("listening"); l != nil {
			port, ok := l["port"].(float64)
			ops, ok2 := l["ops_port"].(float64)
			if !ok || !ok2 || port <= 0 || port >= 65536 || ops <= 0 || ops >= 65536 {
				t.Fatalf(`"listening" log line without valid ports: %v`, l)
			}
			s.Port, s.OpsPort = int(port), int(ops)
			break
		}
		if s.exited() {
			t.Fatalf("dreyd %s exited before listening (%v)\n%s", strings.Join(all, " "), s.waitErr, s.log())
		}
		if time.Now().After(deadline) {
			t.Fatalf("dreyd did not log \"listening\" within %v\n%s", startTimeout, s.log())
		}
		time.Sleep(pollPace)
	}
	s.Addr = fmt.Sprintf("127.0.0.1:%d", s.Port)
	conn := s.dial()
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	last := ""
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return s
		}
		last = fmt.Sprint(r.GetStatus(), err)
		if s.exited() {
			t.Fatalf("dreyd exited while recovering (%v)\n%s", s.waitErr, s.log())
		}
		if time.Now().After(deadline) {
			t.Fatalf("dreyd not SERVING within %v (last: %s)\n%s", startTimeout, last, s.log())
		}
		time.Sleep(pollPace)
	}
}

func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// dial makes a connection of its own (a principal of its own too: conn:<n>
// is one per HTTP/2 connection) over the server's transport.
func (s *server) dial() *grpc.ClientConn {
	s.t.Helper()
	return s.dialWith(s.transport)
}

// dialWith connects with exactly these options; closed when the test ends.
func (s *server) dialWith(opts ...grpc.DialOption) *grpc.ClientConn {
	s.t.Helper()
	conn, err := grpc.Dial(s.Addr, opts...)
	if err != nil {
		s.t.Fatalf("dial %s: %v", s.Addr, err)
	}
	s.t.Cleanup(func() { conn.Close() })
	return conn
}

func (s *server) cache() cachev1.CacheClient { return cachev1.NewCacheClient(s.dial()) }

func (s *server) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("sending %v to dreyd: %v", sig, err)
	}
}

// waitExit0 waits for the process to end and fails the test unless it
// exited 0.
func (s *server) waitExit0(timeout time.Duration) {
	s.t.Helper()
	select {
	case <-s.done:
	case <-time.After(timeout):
		s.cmd.Process.Kill()
		<-s.done
		s.t.Fatalf("dreyd did not exit within %v\n%s", timeout, s.log())
	}
	if s.waitErr != nil {
		s.t.Fatalf("dreyd did not exit 0: %v\n%s", s.waitErr, s.log())
	}
}

// stop ends the process whatever state a (possibly failed) test left it in:
// SIGTERM until dreyd has logged "draining", then one more, which ends a
// drain grace however long. Signals are not queued, so the second is sent
// only once the first has been taken.
func (s *server) stop() {
	if s.exited() {
		return
	}
	if s.findLog("draining") == nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		end := time.Now().Add(stopTimeout)
		for !s.exited() && s.findLog("draining") == nil && time.Now().Before(end) {
			time.Sleep(pollPace)
		}
	}
	if !s.exited() {
		s.cmd.Process.Signal(syscall.SIGTERM)
	}
	s.waitExit0(stopTimeout)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

var seq int64

// key is unique within the test process.
func key(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), atomic.AddInt64(&seq, 1))
}

// pollUntil calls probe until done holds or the deadline passes. The pause
// between probes only paces the polling: the condition is what is awaited.
func pollUntil(t *testing.T, what string, timeout time.Duration, probe func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(timeout)
	for {
		ok, last := probe()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s not reached within %v; last: %s", what, timeout, last)
		}
		time.Sleep(pollPace)
	}
}

// details is a failed call's google.rpc.Status, decoded by grpc-go from
// grpc-status-details-bin, with each Any resolved into its genproto type.
type details struct {
	st         *status.Status
	types      []string
	errorInfo  *errdetails.ErrorInfo
	badRequest *errdetails.BadRequest
	quota      *errdetails.QuotaFailure
	retry      *errdetails.RetryInfo
}

const typeURLPrefix = "type.googleapis.com/"

// statusOf asserts that err is a gRPC status with code `code` whose
// details decode into google.rpc types, at most one of each, all known.
func statusOf(t *testing.T, err error, code codes.Code) *details {
	t.Helper()
	if err == nil {
		t.Fatalf("expected %v, but the call succeeded", code)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("not a gRPC status: %v", err)
	}
	if st.Code() != code {
		t.Fatalf("expected %v, got %v (%s)", code, st.Code(), st.Message())
	}
	d := &details{st: st}
	for _, any := range st.Proto().GetDetails() {
		if !strings.HasPrefix(any.TypeUrl, typeURLPrefix) {
			t.Fatalf("unexpected type_url %q", any.TypeUrl)
		}
		name := strings.TrimPrefix(any.TypeUrl, typeURLPrefix)
		d.types = append(d.types, name)
		var dst proto.Message
		switch name {
		case "google.rpc.ErrorInfo":
			d.errorInfo = onlyOnce(t, name, d.errorInfo, &errdetails.ErrorInfo{})
			dst = d.errorInfo
		case "google.rpc.BadRequest":
			d.badRequest = onlyOnce(t, name, d.badRequest, &errdetails.BadRequest{})
			dst = d.badRequest
		case "google.rpc.QuotaFailure":
			d.quota = onlyOnce(t, name, d.quota, &errdetails.QuotaFailure{})
			dst = d.quota
		case "google.rpc.RetryInfo":
			d.retry = onlyOnce(t, name, d.retry, &errdetails.RetryInfo{})
			dst = d.retry
		default:
			t.Fatalf("unexpected detail type %s", name)
		}
		if err := ptypes.UnmarshalAny(any, dst); err != nil {
			t.Fatalf("decoding %s: %v", name, err)
		}
	}
	// grpc-go's own decoding (through the proto registry) must agree.
	if got := len(st.Details()); got != len(d.types) {
		t.Fatalf("status.Details() decoded %d of %d details: %v", got, len(d.types), st.Details())
	}
	for _, x := range st.Details() {
		if e, isErr := x.(error); isErr {
			t.Fatalf("status.Details() could not decode a detail: %v", e)
		}
	}
	return d
}

func onlyOnce[T any](t *testing.T, name string, prev *T, fresh *T) *T {
	t.Helper()
	if prev != nil {
		t.Fatalf("more than one %s in the details", name)
	}
	return fresh
}

type violation struct{ Field, Reason string }

// assertStatus checks the whole error contract of a failed call: the code,
// a google.rpc.Status with the same code and message, an ErrorInfo of
// domain drey.dev with `reason` (and exactly `metadata` unless nil), and a
// BadRequest with exactly `violations` (each described), or none at all
// when violations is nil.
func assertStatus(t *testing.T, err error, code codes.Code, reason string, metadata map[string]string,
	violations []violation) *details {
	t.Helper()
	d := statusOf(t, err, code)
	if codes.Code(d.st.Proto().Code) != code || d.st.Proto().Message != d.st.Message() || d.st.Message() == "" {
		t.Fatalf("google.rpc.Status %v disagrees with the gRPC status %v %q", d.st.Proto(), code, d.st.Message())
	}
	if d.errorInfo == nil {
		t.Fatalf("no ErrorInfo in %v", d.types)
	}
	if d.errorInfo.Domain != "drey.dev" || d.errorInfo.Reason != reason {
		t.Fatalf("ErrorInfo %v: want domain drey.dev, reason %s", d.errorInfo, reason)
	}
	if metadata != nil && !equalMaps(d.errorInfo.Metadata, metadata) {
		t.Fatalf("ErrorInfo metadata %v, want %v", d.errorInfo.Metadata, metadata)
	}
	if violations == nil {
		if d.badRequest != nil {
			t.Fatalf("unexpected BadRequest %v", d.badRequest)
		}
		return d
	}
	if d.badRequest == nil {
		t.Fatalf("no BadRequest in %v", d.types)
	}
	var got []violation
	for _, v := range d.badRequest.FieldViolations {
		if v.Description == "" {
			t.Fatalf("field violation without a description: %v", v)
		}
		got = append(got, violation{v.Field, v.Reason})
	}
	if fmt.Sprint(got) != fmt.Sprint(violations) {
		t.Fatalf("field violations %v, want %v", got, violations)
	}
	return d
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
