package diag

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// TestThisHost runs the real checks on the machine the test runs on, with
// a real KVM probe (no cache), and asserts only what the test can establish
// independently here: the KVM verdict matches the probe that actually ran,
// the QEMU version is the one QEMU prints, and containerd is reported
// reachable exactly when its socket accepts a connection.
func TestThisHost(t *testing.T) {
	cfg := config.Default()
	cfg.Runtime.CacheDir = t.TempDir()
	imageDir, _ := filepath.Abs("../../../_output/image")
	if _, err := os.Stat(filepath.Join(imageDir, "vmlinuz")); err == nil {
		cfg.Hypervisor.Kernel = filepath.Join(imageDir, "vmlinuz")
		cfg.Hypervisor.Initrd = filepath.Join(imageDir, "initrd.img")
	}
	var probed *accel.Result
	probe := func(ctx context.Context, qemu, kernel, cacheDir string) (accel.Result, error) {
		res, err := accel.Choose(ctx, accel.Auto, qemu, kernel, cacheDir)
		if err == nil {
			probed = &res
		}
		return res, err
	}
	rep := Run(context.Background(), Options{Config: cfg, NoCache: true, Probe: probe, ImageDir: imageDir})
	got := byID(rep)
	var txt strings.Builder
	_ = rep.WriteText(&txt)
	t.Logf("this host:\n%s", txt.String())

	kvmProbe := got["kvm.probe"]
	switch {
	case probed == nil:
		if kvmProbe.Status == Pass {
			t.Errorf("kvm.probe passed although no probe ran: %s", kvmProbe.Detail)
		}
	case probed.Accel == accel.KVM:
		if kvmProbe.Status != Pass {
			t.Errorf("the probe booted a guest under KVM but kvm.probe is %s: %s", kvmProbe.Status, kvmProbe.Detail)
		}
	default:
		if kvmProbe.Status == Pass {
			t.Errorf("the probe found KVM unusable (%s) but kvm.probe passed", probed.Reason)
		}
		if !strings.Contains(kvmProbe.Detail, probed.Reason) {
			t.Errorf("kvm.probe does not give the probe's reason %q: %s", probed.Reason, kvmProbe.Detail)
		}
	}
	if _, err := os.Stat("/dev/kvm"); (err == nil) != (got["kvm.device"].Status == Pass) {
		t.Errorf("kvm.device is %s, stat /dev/kvm: %v", got["kvm.device"].Status, err)
	}

	if qemu, err := exec.LookPath(filepath.Base(cfg.Hypervisor.Path)); err == nil {
		out, err := exec.Command(qemu, "-version").Output()
		if err != nil {
			t.Fatal(err)
		}
		v := QEMUVersion(string(out))
		if r := got["qemu.binary"]; r.Status != Pass || r.Facts["version"] != v {
			t.Errorf("qemu.binary %s %q, QEMU says version %q", r.Status, r.Facts["version"], v)
		}
	} else if got["qemu.binary"].Status != Fail {
		t.Errorf("no QEMU in PATH but qemu.binary is %s", got["qemu.binary"].Status)
	}

	c, err := net.Dial("unix", DefaultContainerdAddress)
	if err == nil {
		c.Close()
	}
	if (err != nil) != (got["containerd.socket"].Status == Fail) {
		t.Errorf("containerd.socket is %s, dialing %s: %v", got["containerd.socket"].Status, DefaultContainerdAddress, err)
	}
	// The image build recorded the sim digest it expects for SeaBIOS and the
	// launcher's command line; recomputed from the shim's command line on
	// this host, it must agree whenever the host boots the same SeaBIOS.
	if m, err := manifest.Verify(imageDir); err == nil {
		if sd, err := m.Sim(); err == nil {
			fw, _ := os.ReadFile(sim.Firmware)
			if sum := sha256.Sum256(fw); hex.EncodeToString(sum[:]) == sd.Firmware.SHA256 {
				if r := got["image.digest"]; r.Status != Pass || r.Facts["sim"] != sd.ByVCPUs["1"] {
					t.Errorf("image.digest is %s (%s), the image build expects %s", r.Status, r.Detail, sd.ByVCPUs["1"])
				}
			}
		}
	}
	if rep.Failed() != (rep.Summary.Fail > 0) || rep.Summary.Pass+rep.Summary.Warn+rep.Summary.Fail != len(IDs()) {
		t.Errorf("summary %+v does not add up to %d checks", rep.Summary, len(IDs()))
	}
}
