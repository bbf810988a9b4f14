package agent

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// A panicking handler must fail its request with Internal and leave the
// agent (PID 1 in the VM) serving.
func TestServerSurvivesHandlerPanic(t *testing.T) {
	// A process without stdio: CloseStdin dereferences nil.
	svc := &Service{containers: map[string]*container{"c": {id: "c", init: &process{}, execs: map[string]*process{}}}, cfg: Config{Channel: "test"}}
	srv, err := svc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	agent := agentapi.NewAgentClient(client)

	_, err = agent.CloseStdin(context.Background(), &agentapi.ProcessRequest{ContainerId: "c"})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panic") {
		t.Errorf("panicking handler: %v, want Internal naming the panic", err)
	}
	info, err := agent.GetInfo(context.Background(), &agentapi.GetInfoRequest{})
	if err != nil || info.GetChannel() != "test" {
		t.Errorf("GetInfo after the panic: %v, %v", info, err)
	}
}
