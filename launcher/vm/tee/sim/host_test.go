package sim_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/ttrpc"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// pipeVM is a VM whose attestation port is one end of an in-memory pipe.
type pipeVM struct {
	host   net.Conn
	dialed []string
}

func (p *pipeVM) DialPort(_ context.Context, name string) (net.Conn, error) {
	p.dialed = append(p.dialed, name)
	if name != sim.AttestPort {
		return nil, errors.New("no such port " + name)
	}
	return p.host, nil
}

// A Host measures the launch QEMU is handed, opens the node's identity and
// answers the guest on the VM's attestation port with reports that verify
// against that identity, that measurement and the VM's HOST_DATA.
func TestHostServesTheMeasuredLaunch(t *testing.T) {
	dir, argv := writeLaunch(t)
	spDir := filepath.Join(dir, "node-sp")
	var hostData [32]byte
	copy(hostData[:], "init data of this pod")
	h, err := sim.NewHost(argv, spDir, hostData)
	if err != nil {
		t.Fatal(err)
	}
	l, err := sim.LaunchFromArgv(argv)
	if err != nil {
		t.Fatal(err)
	}
	want, err := sim.Measure(l)
	if err != nil {
		t.Fatal(err)
	}
	if h.Measurement() != want {
		t.Fatalf("Host measured %s, the launch is %s", h.Measurement(), want)
	}

	host, guest := net.Pipe()
	vm := &pipeVM{host: host}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := h.Attach(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if len(vm.dialed) != 1 || vm.dialed[0] != sim.AttestPort {
		t.Fatalf("Attach dialed %v, want the attestation port %s", vm.dialed, sim.AttestPort)
	}
	client := ttrpc.NewClient(guest)
	defer client.Close()
	nonce := []byte("a fresh nonce from the verifier")
	resp, err := attestapi.NewSimSPClient(client).GetReport(ctx, &attestapi.GetReportRequest{ReportData: nonce})
	if err != nil {
		t.Fatalf("GetReport: %v", err)
	}
	trust, err := attest.SimTrust(spDir)
	if err != nil {
		t.Fatalf("NewHost did not create the node's identity in %s: %v", spDir, err)
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		t.Fatal(err)
	}
	policy := &attest.Policy{Measurements: map[int]attest.Hex{2: want[:]}, VCPUs: 2, HostData: hostData[:], Nonce: nonce}
	if _, err := v.VerifySNP(resp.Report, resp.CertTable, policy); err != nil {
		t.Fatalf("the report of the attached VM does not verify: %v", err)
	}
}

func TestNewHostNamesWhatIsMissing(t *testing.T) {
	dir, argv := writeLaunch(t)
	var noBios []string
	for i := 0; i < len(argv); i++ {
		if argv[i] == "-bios" {
			i++
			continue
		}
		noBios = append(noBios, argv[i])
	}
	if _, err := sim.NewHost(noBios, filepath.Join(dir, "sp"), [32]byte{}); err == nil || !strings.Contains(err.Error(), "-bios") {
		t.Fatalf("NewHost without -bios: %v", err)
	}
	bad := append([]string(nil), argv...)
	for i := range bad {
		if bad[i] == "-kernel" {
			bad[i+1] = filepath.Join(dir, "missing-vmlinuz")
		}
	}
	if _, err := sim.NewHost(bad, filepath.Join(dir, "sp"), [32]byte{}); err == nil || !strings.Contains(err.Error(), "kernel") {
		t.Fatalf("NewHost with a missing kernel: %v", err)
	}
}
