package task

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

func TestErrorsToGRPC(t *testing.T) {
	call := func(resp any, err error) (any, error) {
		return errorsToGRPC(context.Background(), func(any) error { return nil }, &ttrpc.UnaryServerInfo{FullMethod: "/x/Y"},
			func(context.Context, func(any) error) (any, error) { return resp, err })
	}
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{errdefs.ErrNotFound, codes.NotFound},
		{errdefs.ErrAlreadyExists, codes.AlreadyExists},
		{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
		{errdefs.ErrInvalidArgument, codes.InvalidArgument},
		{errdefs.ErrNotImplemented, codes.Unimplemented},
		{errdefs.ErrPermissionDenied, codes.PermissionDenied},
		{errdefs.ErrUnavailable, codes.Unavailable},
		{errdefs.ErrInternal, codes.Internal},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
	} {
		err := fmt.Errorf("container %q: %w", "c1", c.err)
		resp, got := call("ignored", err)
		st, ok := status.FromError(got)
		if !ok || st.Code() != c.code || st.Message() != err.Error() || resp != nil {
			t.Errorf("%v: %v %v (resp %v), want %v with the message", c.err, st.Code(), got, resp, c.code)
		}
		// containerd's client gets the errdefs class back.
		if back := errgrpc.ToNative(got); !errors.Is(back, c.err) {
			t.Errorf("%v came back as %v", c.err, back)
		}
	}
	already := status.Error(codes.Aborted, "as the agent said")
	if _, got := call(nil, already); got != already {
		t.Errorf("a status error became %v", got)
	}
	plain := errors.New("disk full")
	if _, got := call(nil, plain); status.Code(got) != codes.Unknown || status.Convert(got).Message() != "disk full" {
		t.Errorf("an unclassed error became %v, want Unknown with its message", got)
	}
	if resp, err := call("ok", nil); resp != "ok" || err != nil {
		t.Errorf("success became %v, %v", resp, err)
	}
}

// The shim framework builds the ttrpc server with the interceptors of the
// plugins that offer one; the service does, and over a real connection
// containerd's client sees errdefs classes from both the task API and
// the Admin API.
func TestEdgeOverTTRPC(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), "test")
	sdCtx, sd := shutdown.WithShutdown(ctx)
	defer sd.Shutdown()
	svc, err := New(sdCtx, &recorder{events: make(chan published, 16)}, sd, "")
	if err != nil {
		t.Fatal(err)
	}
	opt, ok := svc.(shim.TTRPCServerUnaryOptioner)
	if !ok {
		t.Fatal("the task plugin offers no ttrpc interceptor: errors would reach containerd without their class")
	}
	reg, ok := svc.(shim.TTRPCService)
	if !ok {
		t.Fatal("the task plugin is no ttrpc service")
	}
	server, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(opt.UnaryServerInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterTTRPC(server); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "c8s-edge")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	go server.Serve(ctx, l)
	defer server.Close()
	conn, err := net.Dial("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()

	tasks := taskAPI.NewTTRPCTaskClient(client)
	_, err = tasks.State(ctx, &taskAPI.StateRequest{ID: "nope"})
	if status.Code(err) != codes.NotFound || !errdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("State of an unknown task: %v, want NotFound", err)
	}
	_, err = tasks.Pause(ctx, &taskAPI.PauseRequest{ID: "nope"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Pause: %v, want Unimplemented", err)
	}
	_, err = tasks.Create(ctx, &taskAPI.CreateTaskRequest{ID: "../x"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Create with a bad id: %v, want InvalidArgument", err)
	}
	if resp, err := tasks.Connect(ctx, &taskAPI.ConnectRequest{}); err != nil || resp.ShimPid != uint32(os.Getpid()) {
		t.Errorf("Connect: %+v, %v", resp, err)
	}
	_, err = adminapi.NewAdminClient(client).Attest(ctx, &adminapi.AttestRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Admin Attest without a pod: %v, want FailedPrecondition", err)
	}
}
