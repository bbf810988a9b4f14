package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/attest"
)

// detectedEvidence is boot's evidence source over a fake guest tree: the
// provider attest.Detect finds below root for the TEE the kernel command
// line names.
func detectedEvidence(root, tee string) func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
	return func(ctx context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
		p, err := attest.Detect(ctx, root, tee, nil)
		if err != nil {
			return nil, err
		}
		ev, err := p.Evidence(ctx, rd)
		if err != nil {
			return nil, err
		}
		return &agentapi.GetEvidenceResponse{Kind: ev.Kind, Provider: ev.Provider, Report: ev.Report, CertTable: ev.CertTable}, nil
	}
}

// guestTree lays out files (empty) and directories (trailing slash) below a
// new root.
func guestTree(t *testing.T, paths map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range paths {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A host that breaks the SEV guest driver of a pod VM started as snp (its
// measured command line says c8s.tee=snp), so that /dev/sev-guest is
// missing, gets neither its own sim evidence, served on the port it
// provides, nor the allow-all policy of a VM without a TEE: the agent
// refuses the container, naming the missing device.
func TestMaliciousHostHidesTheTEEDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// What the host can give such a guest: the sim TEE's port, and the
	// configfs-tsm directory that any VM with the tsm module has.
	root := guestTree(t, map[string]string{
		"sys/class/virtio-ports/vport1p2/name": "c8s.attest\n",
		"dev/vport1p2":                         "",
		"sys/kernel/config/tsm/report/":        "",
	})
	svc := &Service{cfg: Config{Evidence: detectedEvidence(root, "snp")}, containers: map[string]*container{}}
	_, err := svc.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()})
	if err == nil || !errors.Is(err, attest.ErrTEEUnavailable) || !strings.Contains(err.Error(), attest.SEVGuestDevice) {
		t.Fatalf("CreateContainer in an snp guest without its SEV device: %v, want refused for the missing %s", err, attest.SEVGuestDevice)
	}
	if len(svc.containers) != 0 {
		t.Errorf("containers %v created", svc.containers)
	}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: []byte("version = \"0.1\"\n")}); !errors.Is(err, attest.ErrTEEUnavailable) {
		t.Errorf("SetInitData in an snp guest without its SEV device: %v, want refused", err)
	}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("n")}); !errors.Is(err, attest.ErrTEEUnavailable) {
		t.Errorf("GetEvidence in an snp guest without its SEV device: %v, want ErrTEEUnavailable", err)
	}

	// The same for tdx.
	tdx := &Service{cfg: Config{Evidence: detectedEvidence(root, "tdx")}, containers: map[string]*container{}}
	if err := tdx.requirePolicy(ctx, "create"); !errors.Is(err, attest.ErrTEEUnavailable) || !strings.Contains(err.Error(), attest.TDXGuestDevice) {
		t.Errorf("a tdx guest without its TDX device: %v, want refused", err)
	}

	// What the command line changes: a guest that names no TEE (an older
	// launcher) and has none is a VM without a TEE, allowed everything.
	plain := guestTree(t, map[string]string{"sys/kernel/config/tsm/report/": ""})
	none := &Service{cfg: Config{Evidence: detectedEvidence(plain, "")}}
	if err := none.requirePolicy(ctx, "create"); err != nil {
		t.Fatalf("a guest that names no TEE and has none: %v, want the allow-all of no TEE", err)
	}
}
