package reattest

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/tdx"
)

// simLaunches returns a sim launch of Debian's kernel (an EFI-stub PE
// image, as the guest image's) with an initrd and a command line, and
// the same with another initrd and the same with another command line.
func simLaunches(t *testing.T) (good, otherInitrd, otherCmdline sim.Launch) {
	t.Helper()
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Fatal("no /boot/vmlinuz-* (Debian package linux-image-amd64; run hack/install-deps.sh)")
	}
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good = sim.Launch{Firmware: write("bios.bin", strings.Repeat("\x90", 4096)), Kernel: kernels[0],
		Initrd: write("initrd", "the image's initrd"), Cmdline: "console=hvc0 c8s.tee=sim", VCPUs: 1}
	otherInitrd, otherCmdline = good, good
	otherInitrd.Initrd = write("initrd.host", "the host's initrd")
	otherCmdline.Cmdline = good.Cmdline + " init=/bin/sh"
	return good, otherInitrd, otherCmdline
}

// predict sets n's image manifest to predict the measured boot of l, as
// mkmanifest does (digests.sim.boot).
func (n *node) predict(l sim.Launch) {
	n.t.Helper()
	kernel, err := os.ReadFile(l.Kernel)
	if err != nil {
		n.t.Fatal(err)
	}
	initrd, err := os.ReadFile(l.Initrd)
	if err != nil {
		n.t.Fatal(err)
	}
	d, err := tdx.DirectBoot{Kernel: kernel, Cmdline: l.Cmdline, Initrd: initrd}.Digests()
	if err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.manifestBoot = &manifest.BootDigests{Kernel: hex.EncodeToString(d.Kernel), LoadOptions: hex.EncodeToString(d.LoadOptions), Initrd: hex.EncodeToString(d.Initrd)}
	n.manifestCmdline = l.Cmdline
}

func (n *node) booted(l sim.Launch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.boot = &l
}

// Re-attestation checks the measured boot as the shim does at start: the
// sim TEE's RTMR statement and boot log against the image manifest's
// kernel, command line and initrd. A VM the host booted with another
// initrd or command line is not attested, the reason naming the RTMR
// event; so is one whose event log the host dropped.
func TestReattestChecksTheMeasuredBoot(t *testing.T) {
	good, otherInitrd, otherCmdline := simLaunches(t)
	for _, tc := range []struct {
		name   string
		booted sim.Launch
		want   []string
	}{
		{"other initrd", otherInitrd, []string{"RTMR2", "initrd"}},
		{"other command line", otherCmdline, []string{"RTMR2", "LoadOptions"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, o := newNode(t), newOwner(t)
			n.predict(good)
			n.booted(tc.booted)
			n.run("sb1", "web")
			once(t, n.monitor(o))
			c := n.condition("web")
			if c.Status != StatusFalse || c.Reason != ReasonMeasuredBootMismatch {
				t.Fatalf("a VM booted with %s: %+v", tc.name, c)
			}
			for _, w := range tc.want {
				if !strings.Contains(c.Message, w) {
					t.Errorf("the reason %q does not name %q", c.Message, w)
				}
			}
			t.Log(c.Message)
		})
	}

	n, o := newNode(t), newOwner(t)
	n.predict(good)
	n.booted(good)
	n.run("sb1", "web")
	m := n.monitor(o)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue || !strings.Contains(c.Message, "measured boot") {
		t.Fatalf("the image's own boot: %+v", c)
	}
	// The VM verified with its boot: that boot is pinned, as its launch
	// digest is, so a node image upgrade under the running pod does not
	// fail it, and another VM answering with another initrd does.
	n.predict(otherInitrd)
	n.advance(DefaultInterval)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusTrue {
		t.Fatalf("the running pod after the image upgrade: %+v", c)
	}
	n.predict(good)
	n.booted(otherInitrd)
	n.advance(DefaultInterval)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonMeasuredBootMismatch {
		t.Fatalf("another boot behind the same sandbox: %+v", c)
	}
	// The host drops the boot log and RTMRs from the evidence.
	n.mu.Lock()
	n.boot = nil
	n.mu.Unlock()
	n.advance(DefaultInterval)
	once(t, m)
	if c := n.condition("web"); c.Status != StatusFalse || c.Reason != ReasonMeasuredBootMismatch || !strings.Contains(c.Message, "RTMR") {
		t.Fatalf("evidence without its RTMRs: %+v", c)
	}
}
