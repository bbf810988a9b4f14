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
	// An evidence source that panics, as a bug in a handler would.
	svc := &Service{containers: map[string]*container{}, cfg: Config{Channel: "test", Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		panic("evidence source bug")
	}}}
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

	_, err = agent.GetEvidence(context.Background(), &agentapi.GetEvidenceRequest{Nonce: []byte("n")})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panic") {
		t.Errorf("panicking handler: %v, want Internal naming the panic", err)
	}
	info, err := agent.GetInfo(context.Background(), &agentapi.GetInfoRequest{})
	if err != nil || info.GetChannel() != "test" {
		t.Errorf("GetInfo after the panic: %v, %v", info, err)
	}
}
