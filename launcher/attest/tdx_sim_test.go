package attest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	attestapi "github.com/c8s-dev/c8s/guest/api/attest/v1"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// simBoot is a sim launch of Debian's kernel (an EFI-stub PE image, as
// the guest image's) with a command line and an initrd.
type simBoot struct {
	dir                      string
	firmware, kernel, initrd string
	cmdline                  string
}

func newSimBoot(t *testing.T) simBoot {
	t.Helper()
	m, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(m) == 0 {
		t.Fatal("no /boot/vmlinuz-* (Debian package linux-image-amd64; run hack/install-deps.sh)")
	}
	kernel, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	b := simBoot{dir: t.TempDir(), cmdline: "console=hvc0 c8s.tee=sim"}
	write := func(name string, data []byte) string {
		p := filepath.Join(b.dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	b.firmware = write("bios.bin", bytes.Repeat([]byte{0x90}, 64<<10))
	b.kernel = write("vmlinuz", kernel)
	b.initrd = write("initrd", []byte("an initrd"))
	return b
}

// manifestBoot is what the image manifest would predict for b.
func (b simBoot) manifestBoot(t *testing.T) *TDXBoot {
	t.Helper()
	kernel, _ := os.ReadFile(b.kernel)
	initrd, _ := os.ReadFile(b.initrd)
	d, err := tdx.DirectBoot{Kernel: kernel, Cmdline: b.cmdline, Initrd: initrd}.Digests()
	if err != nil {
		t.Fatal(err)
	}
	return BootFromDigests(d, b.cmdline)
}

// evidence boots l on the node's simulated secure processor and returns
// the guest's evidence for nonce.
func simEvidence(t *testing.T, sp *sim.SP, l sim.Launch, nonce []byte) *attestapi.GetReportResponse {
	t.Helper()
	m, err := sim.Measure(l)
	if err != nil {
		t.Fatal(err)
	}
	svc := &sim.Service{SP: sp, Measurement: m}
	if svc.EventLog, svc.RTMRs, err = sim.BootLog(l); err != nil {
		t.Fatal(err)
	}
	resp, err := svc.GetReport(context.Background(), &attestapi.GetReportRequest{ReportData: nonce})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func simPolicy(t *testing.T, b simBoot, boot *TDXBoot) *Policy {
	t.Helper()
	m, err := sim.Measure(sim.Launch{Firmware: b.firmware, Kernel: b.kernel, Initrd: b.initrd, Cmdline: b.cmdline, VCPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &Policy{Measurements: map[int]Hex{1: m[:]}, VCPUs: 1, Nonce: Hex("sim nonce"), TDXBoot: boot}
}

// The sim TEE's modelled RTMRs run the TDX measured-boot checks: the boot
// the manifest names passes; a VM the host booted with another kernel or
// command line fails RTMR verification, naming the RTMR and the event.
func TestSimMeasuredBoot(t *testing.T) {
	sp, _ := nodes(t)
	v, err := NewVerifier(Trust{Mode: ModeSim, SimCertChain: sp.CertChainPEM()})
	if err != nil {
		t.Fatal(err)
	}
	b := newSimBoot(t)
	p := simPolicy(t, b, b.manifestBoot(t))
	launch := sim.Launch{Firmware: b.firmware, Kernel: b.kernel, Initrd: b.initrd, Cmdline: b.cmdline, VCPUs: 1}
	ev := simEvidence(t, sp, launch, p.Nonce)
	if _, err := v.VerifySimEvidence(ev.Report, ev.CertTable, ev.RtmrStatement, ev.EventLog, p); err != nil {
		t.Fatalf("the manifest's boot: %v", err)
	}

	// Another kernel: Debian's with one byte of its code changed.
	kernel, _ := os.ReadFile(b.kernel)
	kernel[len(kernel)/2] ^= 0xff
	other := filepath.Join(b.dir, "other-vmlinuz")
	os.WriteFile(other, kernel, 0o644)
	swapped := launch
	swapped.Kernel = other
	ev = simEvidence(t, sp, swapped, p.Nonce)
	_, err = v.VerifySimEvidence(ev.Report, ev.CertTable, ev.RtmrStatement, ev.EventLog, p)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindMismatch || e.Field != "RTMR1 event 2 (EV_EFI_BOOT_SERVICES_APPLICATION, the kernel)" {
		t.Fatalf("a swapped kernel: %v", err)
	}
	t.Logf("swapped kernel: %v", err)

	// Another command line (say, another dm-verity root hash).
	swapped = launch
	swapped.Cmdline = b.cmdline + " c8s.verity=other"
	ev = simEvidence(t, sp, swapped, p.Nonce)
	_, err = v.VerifySimEvidence(ev.Report, ev.CertTable, ev.RtmrStatement, ev.EventLog, p)
	if !errors.As(err, &e) || e.Kind != KindMismatch || !strings.HasPrefix(e.Field, "RTMR2 event 5 (EV_EVENT_TAG, LOADED_IMAGE::LoadOptions") {
		t.Fatalf("a swapped command line: %v", err)
	}
	t.Logf("swapped command line: %v", err)

	// Without the measured-boot policy the same evidence is judged by the
	// launch digest alone, which also differs.
	p2 := *p
	p2.TDXBoot = nil
	if _, err := v.VerifySimEvidence(ev.Report, ev.CertTable, ev.RtmrStatement, ev.EventLog, &p2); !errors.As(err, &e) || e.Field != "measurement" {
		t.Errorf("no boot policy: %v", err)
	}
}

// The RTMR statement is signed and bound to its report.
func TestSimRTMRStatementBinding(t *testing.T) {
	sp, other := nodes(t)
	v, err := NewVerifier(Trust{Mode: ModeSim, SimCertChain: sp.CertChainPEM()})
	if err != nil {
		t.Fatal(err)
	}
	b := newSimBoot(t)
	p := simPolicy(t, b, b.manifestBoot(t))
	launch := sim.Launch{Firmware: b.firmware, Kernel: b.kernel, Initrd: b.initrd, Cmdline: b.cmdline, VCPUs: 1}
	ev := simEvidence(t, sp, launch, p.Nonce)
	bad := bytes.Clone(ev.RtmrStatement)
	bad[len(sim.RTMRStatementMagic)+48+48] ^= 1 // RTMR1
	if _, err := v.VerifySimEvidence(ev.Report, ev.CertTable, bad, ev.EventLog, p); kindOf(err) != KindSignature {
		t.Errorf("an altered RTMR: %v", err)
	}
	ev2 := simEvidence(t, sp, launch, p.Nonce)
	if _, err := v.VerifySimEvidence(ev.Report, ev.CertTable, ev2.RtmrStatement, ev.EventLog, p); kindOf(err) != KindMismatch || !strings.Contains(err.Error(), "another report") {
		t.Errorf("another report's statement: %v", err)
	}
	if _, err := v.VerifySimEvidence(ev.Report, ev.CertTable, nil, ev.EventLog, p); kindOf(err) != KindPolicy {
		t.Errorf("no statement: %v", err)
	}
	// Another node's simulated secure processor is not trusted.
	ev3 := simEvidence(t, other, launch, p.Nonce)
	if _, err := v.VerifySimEvidence(ev3.Report, ev3.CertTable, ev3.RtmrStatement, ev3.EventLog, p); kindOf(err) != KindRoot {
		t.Errorf("another node's statement: %v", err)
	}
}
