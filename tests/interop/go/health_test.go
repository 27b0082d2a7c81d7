// grpc.health.v1 the way Kubernetes calls it, Watch streams, and the drain
// on SIGTERM: health turns NOT_SERVING, calls and streams in flight go on
// being served through --drain-grace, then dreyd exits 0.
package interop

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	cachev1 "drey.dev/api/cache/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	refl "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// kubeProbe does what the kubelet's gRPC prober (pkg/probe/grpc) does for a
// `grpc:` probe: a fresh blocking plaintext connection per probe with a
// kube-probe user agent, a dialer that lingers at most 1 s on close, one
// Check with empty metadata, all within timeoutSeconds. Success is SERVING
// and nothing else; the error says why not, in the prober's words.
func kubeProbe(addr, service string) error {
	// deploy/k8s/drey.yaml keeps the default timeoutSeconds of 1; a test
	// on a shared 2-core machine (dreyd maybe under ASan) allows more.
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 1})
		})
	}}
	conn, err := grpc.DialContext(ctx, addr, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithUserAgent("kube-probe/1.27"),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		return fmt.Errorf("probe: connect: %w", err)
	}
	defer conn.Close()
	r, err := healthpb.NewHealthClient(conn).Check(metadata.NewOutgoingContext(ctx, metadata.MD{}),
		&healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("probe: rpc error: %w", err)
	}
	if r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("probe: service unhealthy (responded with %q)", r.GetStatus())
	}
	return nil
}

const probeTimeout = 5 * time.Second

func TestKubernetesGRPCProbe(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "--drain-grace=60s")
	for _, svc := range []string{"", cacheService} {
		if err := kubeProbe(srv.Addr, svc); err != nil {
			t.Fatalf("probe of %q: %v", svc, err)
		}
	}
	err := kubeProbe(srv.Addr, "no.such.Service")
	if st, _ := status.FromError(errorsUnwrap(err)); st.Code() != codes.NotFound {
		t.Fatalf("probe of an unknown service: %v", err)
	}
	assertStatus(t, errorsUnwrap(err), codes.NotFound, "UNKNOWN_SERVICE", map[string]string{}, nil)
	// Draining: the probe fails with NOT_SERVING while the process runs.
	srv.signal(syscall.SIGTERM)
	pollUntil(t, "the probe failing after SIGTERM", 15*time.Second, func() (bool, string) {
		err := kubeProbe(srv.Addr, "")
		return err != nil && err.Error() == `probe: service unhealthy (responded with "NOT_SERVING")`, fmt.Sprint(err)
	})
	if srv.exited() {
		t.Fatal("dreyd exited inside its drain grace")
	}
}

func errorsUnwrap(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func watch(t *testing.T, h healthpb.HealthClient, service string) healthpb.Health_WatchClient {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	w, err := h.Watch(c, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func expectStatus(t *testing.T, w healthpb.Health_WatchClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	r, err := w.Recv()
	if err != nil || r.Status != want {
		t.Fatalf("Watch: got %v (%v), want %v", r.GetStatus(), err, want)
	}
}

func expectEnd(t *testing.T, w healthpb.Health_WatchClient) {
	t.Helper()
	if r, err := w.Recv(); err != io.EOF {
		t.Fatalf("Watch stream did not end with OK: %v %v", r, err)
	}
}

func TestWatchUnknownServiceStaysOpen(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	conn := srv.dial()
	h := healthpb.NewHealthClient(conn)
	c, cancel := context.WithCancel(context.Background())
	w, err := h.Watch(c, &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	if err != nil {
		t.Fatal(err)
	}
	expectStatus(t, w, healthpb.HealthCheckResponse_SERVICE_UNKNOWN)
	next := make(chan error, 1)
	go func() { _, err := w.Recv(); next <- err }()
	// A Check on the same connection completes while the stream has
	// neither ended nor sent anything more.
	if r, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v %v", r, err)
	}
	select {
	case err := <-next:
		t.Fatalf("the Watch stream of an unknown service did not stay open: %v", err)
	default:
	}
	cancel()
	if err := <-next; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled Watch: %v", err)
	}
}

// The drain: watchers hear NOT_SERVING and their streams end; a reflection
// stream and unary calls in flight are served through the grace period; a
// Watch begun during it ends at once; dreyd exits 0 after the grace.
func TestDrain(t *testing.T) {
	t.Parallel()
	const grace = 3 * time.Second
	srv := startServer(t, "--drain-grace=3s")
	conn := srv.dial()
	h := healthpb.NewHealthClient(conn)
	cache := cachev1.NewCacheClient(conn)
	node, svc, unknown := watch(t, h, ""), watch(t, h, cacheService), watch(t, h, "no.such.Service")
	expectStatus(t, node, healthpb.HealthCheckResponse_SERVING)
	expectStatus(t, svc, healthpb.HealthCheckResponse_SERVING)
	expectStatus(t, unknown, healthpb.HealthCheckResponse_SERVICE_UNKNOWN)
	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	stream, err := refl.NewServerReflectionClient(conn).ServerReflectionInfo(rctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(what string) {
		t.Helper()
		if err := stream.Send(&refl.ServerReflectionRequest{
			MessageRequest: &refl.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: cacheService}}); err != nil {
			t.Fatalf("%s: send: %v", what, err)
		}
		if r, err := stream.Recv(); err != nil || r.GetFileDescriptorResponse() == nil {
			t.Fatalf("%s: the in-flight reflection stream: %v %v", what, r, err)
		}
	}
	ask("before SIGTERM")
	before, err := cache.Set(ctx(t), &cachev1.SetRequest{Key: "before", Value: i64(1)})
	if err != nil {
		t.Fatal(err)
	}

	srv.signal(syscall.SIGTERM)
	signalled := time.Now()
	for _, w := range []healthpb.Health_WatchClient{node, svc, unknown} {
		expectStatus(t, w, healthpb.HealthCheckResponse_NOT_SERVING)
		expectEnd(t, w)
	}
	for _, s := range []string{"", cacheService} {
		if r, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{Service: s}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("Check(%q) while draining: %v %v", s, r, err)
		}
	}
	during, err := cache.Set(ctx(t), &cachev1.SetRequest{Key: "during", Value: str("grace")})
	if err != nil || during.Version <= before.Version {
		t.Fatalf("a call during the drain grace: %v %v", during, err)
	}
	if g, err := cache.Get(ctx(t), &cachev1.GetRequest{Key: "before"}); err != nil || g.Value.GetInt64Value() != 1 {
		t.Fatalf("Get during the drain grace: %v %v", g, err)
	}
	ask("during the drain grace")
	late := watch(t, h, "")
	expectStatus(t, late, healthpb.HealthCheckResponse_NOT_SERVING)
	expectEnd(t, late)
	if srv.findLog("stopping") != nil {
		t.Fatal("the grace period ended before the checks above ran; raise --drain-grace")
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("the reflection stream did not end cleanly: %v", err)
	}
	conn.Close()
	srv.waitExit0(30 * time.Second)
	if took := time.Since(signalled); took < grace-100*time.Millisecond {
		t.Fatalf("exited %v after SIGTERM, before the %v grace ended", took, grace)
	}
	for _, m := range []string{"draining", "stopping", "stopped"} {
		if srv.findLog(m) == nil {
			t.Fatalf("no %q in the log\n%s", m, srv.log())
		}
	}
	if g := srv.findLog("draining")["grace_ms"]; g != float64(3000) {
		t.Fatalf("draining log line grace_ms %v", g)
	}
}
