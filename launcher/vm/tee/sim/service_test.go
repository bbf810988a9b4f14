package sim_test

import (
	"context"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

func writeLaunch(t *testing.T) (dir string, argv []string) {
	t.Helper()
	dir = t.TempDir()
	files := map[string][]byte{"bios.bin": make([]byte, 256<<10), "vmlinuz": []byte("kernel"), "initrd.img": []byte("initrd")}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	argv = []string{"qemu-system-x86_64", "-machine", "q35", "-smp", "2", "-bios", filepath.Join(dir, "bios.bin"),
		"-kernel", filepath.Join(dir, "vmlinuz"), "-initrd", filepath.Join(dir, "initrd.img"), "-append", "console=ttyS0 quiet"}
	return dir, argv
}

// getReport serves svc over an in-memory connection and asks it for one
// report, as the guest does.
func getReport(t *testing.T, svc *sim.Service, nonce []byte) *attestapi.GetReportResponse {
	t.Helper()
	host, guest := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- sim.Serve(ctx, host, svc) }()
	client := ttrpc.NewClient(guest)
	defer func() {
		client.Close()
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("sim.Serve did not return after its context ended")
		}
	}()
	resp, err := attestapi.NewSimSPClient(client).GetReport(ctx, &attestapi.GetReportRequest{ReportData: nonce})
	if err != nil {
		t.Fatalf("GetReport: %v", err)
	}
	return resp
}

func TestReportsVerifyAgainstTheLaunchMeasurement(t *testing.T) {
	dir, argv := writeLaunch(t)
	l, err := sim.LaunchFromArgv(argv)
	if err != nil {
		t.Fatal(err)
	}
	if l.VCPUs != 2 || l.Cmdline != "console=ttyS0 quiet" {
		t.Fatalf("launch = %+v", l)
	}
	m, err := sim.Measure(l)
	if err != nil {
		t.Fatal(err)
	}
	spDir := filepath.Join(dir, "sp")
	sp, err := sim.Open(spDir)
	if err != nil {
		t.Fatal(err)
	}
	trust, err := attest.SimTrust(spDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		t.Fatal(err)
	}
	var hostData [32]byte
	copy(hostData[:], "init-data-digest")
	svc := &sim.Service{SP: sp, Measurement: m, HostData: hostData}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	resp := getReport(t, svc, nonce)

	policy := &attest.Policy{Measurements: map[int]attest.Hex{2: m[:]}, VCPUs: 2, HostData: hostData[:], Nonce: nonce}
	if _, err := v.VerifySNP(resp.Report, resp.CertTable, policy); err != nil {
		t.Fatalf("a report for the launched artefacts does not verify: %v", err)
	}

	// Someone swaps the initrd on disk: the next launch measures differently
	// and its reports fail against the expected digest.
	if err := os.WriteFile(l.Initrd, []byte("tampered initrd"), 0o644); err != nil {
		t.Fatal(err)
	}
	m2, err := sim.Measure(l)
	if err != nil {
		t.Fatal(err)
	}
	resp = getReport(t, &sim.Service{SP: sp, Measurement: m2, HostData: hostData}, nonce)
	_, err = v.VerifySNP(resp.Report, resp.CertTable, policy)
	if err == nil || !strings.Contains(err.Error(), "measurement") {
		t.Fatalf("report of a tampered launch: err = %v, want a measurement mismatch", err)
	}
	t.Logf("tampered launch rejected: %v", err)
}

func TestLaunchFromArgvNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"qemu", "-kernel", "k"}, "-bios"},
		{[]string{"qemu", "-bios", "b"}, "-kernel"},
		{[]string{"qemu", "-bios", "b", "-kernel", "k", "-smp", "two"}, "-smp"},
	} {
		if _, err := sim.LaunchFromArgv(tc.argv); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("sim.LaunchFromArgv(%v) = %v, want an error naming %s", tc.argv, err, tc.want)
		}
	}
	if _, err := sim.Measure(sim.Launch{Firmware: "/nonexistent/bios.bin", Kernel: "/k"}); err == nil || !strings.Contains(err.Error(), "firmware") {
		t.Errorf("sim.Measure with a missing firmware: %v", err)
	}
}

// TestLaunchMeasuresBootVCPUs: hot-plug room (-smp maxcpus) leaves the
// measured vCPU count, and so the launch digest, as it is.
func TestLaunchMeasuresBootVCPUs(t *testing.T) {
	for smp, want := range map[string]int{"2": 2, "2,maxcpus=4": 2, "cpus=3,maxcpus=8": 3, "maxcpus=8,cpus=1": 1} {
		l, err := sim.LaunchFromArgv([]string{"qemu", "-bios", "b", "-kernel", "k", "-smp", smp})
		if err != nil || l.VCPUs != want {
			t.Errorf("-smp %s: %d vCPUs, %v; want %d", smp, l.VCPUs, err, want)
		}
	}
	for _, smp := range []string{"", "maxcpus=4", "0,maxcpus=4", "cpus=x"} {
		if _, err := sim.LaunchFromArgv([]string{"qemu", "-bios", "b", "-kernel", "k", "-smp", smp}); err == nil {
			t.Errorf("-smp %q was accepted", smp)
		}
	}
}

func TestGetReportRejectsOversizedReportData(t *testing.T) {
	sp, err := sim.New(sim.DefaultTCB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&sim.Service{SP: sp}).GetReport(context.Background(), &attestapi.GetReportRequest{ReportData: make([]byte, 65)}); err == nil {
		t.Fatal("65 bytes of report data accepted")
	}
}
