// Server reflection through grpc-go's v1alpha client (the version grpc-go
// 1.33 ships): list the services, resolve symbols to the files declaring
// them with their imports, and check that what is served describes the
// same API as the stubs this suite was compiled from.
package interop

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/golang/protobuf/proto"
	descpb "github.com/golang/protobuf/protoc-gen-go/descriptor"
	"google.golang.org/grpc/codes"
	refl "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
)

type reflector struct {
	t      *testing.T
	stream refl.ServerReflection_ServerReflectionInfoClient
}

func newReflector(t *testing.T, srv *server) *reflector {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := refl.NewServerReflectionClient(srv.dial()).ServerReflectionInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	return &reflector{t, s}
}

func (r *reflector) ask(req *refl.ServerReflectionRequest) *refl.ServerReflectionResponse {
	r.t.Helper()
	if err := r.stream.Send(req); err != nil {
		r.t.Fatalf("send %v: %v", req, err)
	}
	resp, err := r.stream.Recv()
	if err != nil {
		r.t.Fatalf("recv for %v: %v", req, err)
	}
	return resp
}

// files resolves a symbol and decodes the FileDescriptorProtos returned:
// the declaring file first, then what it imports.
func (r *reflector) files(symbol string) []*descpb.FileDescriptorProto {
	r.t.Helper()
	resp := r.ask(&refl.ServerReflectionRequest{
		MessageRequest: &refl.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}})
	fdr := resp.GetFileDescriptorResponse()
	if fdr == nil {
		r.t.Fatalf("file_containing_symbol %s: %v", symbol, resp)
	}
	var out []*descpb.FileDescriptorProto
	for _, raw := range fdr.FileDescriptorProto {
		fd := &descpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			r.t.Fatalf("file_containing_symbol %s: not a FileDescriptorProto: %v", symbol, err)
		}
		out = append(out, fd)
	}
	return out
}

func TestReflectionListsServices(t *testing.T) {
	t.Parallel()
	r := newReflector(t, startServer(t))
	resp := r.ask(&refl.ServerReflectionRequest{MessageRequest: &refl.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	want := "drey.admin.v1.Admin,drey.cache.v1.Cache,grpc.health.v1.Health,grpc.reflection.v1.ServerReflection," +
		"grpc.reflection.v1alpha.ServerReflection"
	if strings.Join(names, ",") != want {
		t.Fatalf("services %v, want %s", names, want)
	}
}

func TestReflectionResolvesSymbols(t *testing.T) {
	t.Parallel()
	r := newReflector(t, startServer(t))
	// A service, a method, a message and a nested message all resolve to
	// cache.proto, returned with every file it imports.
	for _, sym := range []string{cacheService, "drey.cache.v1.Cache.Get", "drey.cache.v1.SetRequest",
		"drey.cache.v1.GetManyResponse.Result", "drey.cache.v1.Value"} {
		files := r.files(sym)
		var names []string
		for _, f := range files {
			names = append(names, f.GetName())
		}
		if len(files) == 0 || files[0].GetName() != "drey/cache/v1/cache.proto" {
			t.Fatalf("%s resolved to %v", sym, names)
		}
		have := map[string]bool{}
		for _, n := range names {
			have[n] = true
		}
		for _, dep := range files[0].Dependency {
			if !have[dep] {
				t.Fatalf("%s: import %s not returned with cache.proto (got %v)", sym, dep, names)
			}
		}
	}
	served := r.files(cacheService)[0]
	// The served file describes the API these stubs were generated from.
	if got, want := describe(served), describe(compiledFile(t, "drey/cache/v1/cache.proto")); got != want {
		t.Fatalf("served cache.proto differs from the stubs':\nserved:\n%s\nstubs:\n%s", got, want)
	}
	var get *descpb.MethodDescriptorProto
	for _, m := range served.Service[0].Method {
		if m.GetName() == "Get" {
			get = m
		}
	}
	if get.GetInputType() != ".drey.cache.v1.GetRequest" || get.GetOutputType() != ".drey.cache.v1.GetResponse" {
		t.Fatalf("Cache.Get: %v", get)
	}
	// The health service's file too, which this suite has no stubs of its own for.
	if f := r.files("grpc.health.v1.Health"); f[0].GetPackage() != "grpc.health.v1" {
		t.Fatalf("grpc.health.v1.Health resolved to %v", f[0].GetName())
	}
	// file_by_filename, and an unknown symbol: NOT_FOUND on the stream, which goes on.
	resp := r.ask(&refl.ServerReflectionRequest{
		MessageRequest: &refl.ServerReflectionRequest_FileByFilename{FileByFilename: "google/protobuf/duration.proto"}})
	if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("file_by_filename google/protobuf/duration.proto: %v", resp)
	}
	resp = r.ask(&refl.ServerReflectionRequest{
		MessageRequest: &refl.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "drey.cache.v1.NoSuch"}})
	if e := resp.GetErrorResponse(); e == nil || codes.Code(e.ErrorCode) != codes.NotFound {
		t.Fatalf("unknown symbol: %v", resp)
	}
	if f := r.files("drey.cache.v1.Cache"); len(f) == 0 {
		t.Fatal("the stream stopped answering after an error response")
	}
}

// compiledFile is the descriptor protoc-gen-go embedded in the stubs.
func compiledFile(t *testing.T, name string) *descpb.FileDescriptorProto {
	gz := proto.FileDescriptor(name)
	if gz == nil {
		t.Fatalf("no compiled descriptor for %s", name)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	fd := &descpb.FileDescriptorProto{}
	if err := proto.Unmarshal(raw, fd); err != nil {
		t.Fatal(err)
	}
	return fd
}

// describe prints what a client depends on (messages with their fields and
// oneofs, services with their methods) and leaves out what only generators
// differ in (json_name, source info, options).
func describe(f *descpb.FileDescriptorProto) string {
	var b strings.Builder
	fmt.Fprintf(&b, "package %s imports %v\n", f.GetPackage(), f.Dependency)
	var msg func(prefix string, m *descpb.DescriptorProto)
	msg = func(prefix string, m *descpb.DescriptorProto) {
		name := prefix + m.GetName()
		for _, fl := range m.Field {
			oneof := ""
			if fl.OneofIndex != nil {
				oneof = m.OneofDecl[fl.GetOneofIndex()].GetName()
			}
			fmt.Fprintf(&b, "%s.%s = %d %v %v %s oneof=%s\n", name, fl.GetName(), fl.GetNumber(), fl.GetLabel(),
				fl.GetType(), fl.GetTypeName(), oneof)
		}
		for _, n := range m.NestedType {
			msg(name+".", n)
		}
	}
	for _, m := range f.MessageType {
		msg("", m)
	}
	for _, s := range f.Service {
		for _, m := range s.Method {
			fmt.Fprintf(&b, "%s.%s(%s) %s stream=%v/%v\n", s.GetName(), m.GetName(), m.GetInputType(),
				m.GetOutputType(), m.GetClientStreaming(), m.GetServerStreaming())
		}
	}
	return b.String()
}
