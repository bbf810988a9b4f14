package e2e

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// TestConfidentialWrites: one sim pod of two containers (the guest is
// started as c8s.tee=sim, which keeps the snp/tdx code path). A container
// writes a unique marker to its root filesystem and syncs; it reads the
// marker back, its root is an overlay, and the host's disk image of the
// container does not hold the marker. An emptyDir (a kubelet path, with
// the node sharing host paths over virtio-fs when virtiofsd is installed)
// is a guest directory both containers share, and the host's directory
// stays empty. Nothing is left once the pod is gone.
func TestConfidentialWrites(t *testing.T) {
	e := setup(t)
	config := e.config
	if _, err := os.Stat(virtiofsd); err == nil {
		cfg, err := os.ReadFile(e.config)
		if err != nil {
			t.Fatal(err)
		}
		config = e.writeConfig(t, "c8s-virtiofs.toml", strings.Replace(string(cfg), "[hypervisor]\n", "[hypervisor]\nvirtio_fs_daemon = \""+virtiofsd+"\"\n", 1))
	} else {
		t.Logf("%s is missing: the emptyDir is not offered over virtio-fs", virtiofsd)
	}
	c := ctx(t)
	const pod, app = "cw", "cw-app"
	marker := fmt.Sprintf("c8s-confidential-%d", time.Now().UnixNano())
	emptyDir := filepath.Join(e.d.Dir, "kubelet", "pods", "0f1e-cw", "volumes", "kubernetes.io~empty-dir", "cache")
	if err := os.MkdirAll(emptyDir, 0o777); err != nil {
		t.Fatal(err)
	}
	mount := "type=bind,src=" + emptyDir + ",dst=/cache,options=rbind:rw"
	ann := "io.kubernetes.cri.sandbox-id=" + pod
	for _, id := range []string{pod, app} {
		if _, stderr, code := result(t, e.run(c, config, "-d", "--annotation", ann, "--mount", mount, image, id, "sleep", "600")); code != 0 {
			t.Fatalf("start %s: exit %d: %s\n%s", id, code, stderr, e.d.Log())
		}
	}
	n := 0
	exec := func(id, script string) (string, time.Duration) {
		t.Helper()
		n++
		t0 := time.Now()
		stdout, stderr, code := result(t, e.d.CtrCommand(c, "task", "exec", "--exec-id", fmt.Sprintf("x%d", n), id, "sh", "-c", script))
		took := time.Since(t0)
		if code != 0 {
			t.Fatalf("exec %q in %s: exit %d\nstdout: %s\nstderr: %s", script, id, code, stdout, stderr)
		}
		return stdout, took
	}

	out, _ := exec(pod, "echo "+marker+" >/marker && mkdir -p /var/lib/app && echo "+marker+" >/var/lib/app/file && echo "+marker+"-cache >/cache/shared && sync && grep ' / / ' /proc/self/mountinfo")
	if !strings.Contains(out, " - overlay ") {
		t.Errorf("the container's root is not an overlay in the guest:\n%s", out)
	}
	if out, _ := exec(pod, "cat /marker /var/lib/app/file"); out != marker+"\n"+marker+"\n" {
		t.Errorf("the container read back %q", out)
	}
	if out, _ := exec(app, "cat /cache/shared; cat /marker 2>/dev/null || echo no-marker"); out != marker+"-cache\nno-marker\n" {
		t.Errorf("the pod's other container read %q: want the emptyDir's file and not the first container's root", out)
	}
	// What a write to guest memory costs, against an exec that writes
	// nothing.
	_, base := exec(pod, "true")
	const mib = 64
	_, took := exec(pod, fmt.Sprintf("dd if=/dev/zero of=/big bs=1M count=%d 2>/dev/null && sync && rm /big", mib))
	if w := took - base; w > 0 {
		t.Logf("a %d MiB write to the container's root took %v beyond an empty exec's %v: %.0f MiB/s", mib, w.Round(time.Millisecond), base.Round(time.Millisecond), mib/w.Seconds())
	}

	// The host's disk images of the pod's containers, while they run: the
	// image's layer disks in the node's layer cache (layer mode, the
	// default), or a copy per container.
	copies, _ := filepath.Glob(filepath.Join(statedir.ForPod(e.stateDir, e.d.Namespace, pod).Disks, "*.img"))
	layers, _ := filepath.Glob(filepath.Join(e.stateDir, "cache", "layers", "*.disk"))
	if len(copies)+len(layers) == 0 {
		t.Fatal("no disk image of the pod's containers on the host")
	}
	for _, img := range append(copies, layers...) {
		if found, err := fileContains(img, []byte(marker)); err != nil {
			t.Fatalf("read the disk image %s: %v", img, err)
		} else if found {
			t.Errorf("the host's disk image %s holds the container's write %q", img, marker)
		}
	}
	if names, err := os.ReadDir(emptyDir); err != nil || len(names) != 0 {
		t.Errorf("the host's emptyDir directory holds %v (%v), want nothing", names, err)
	}

	for _, id := range []string{app, pod} {
		e.d.Ctr(t, "task", "kill", "-s", "KILL", id)
	}
	for _, id := range []string{app, pod} {
		waitStopped(t, e, id)
		e.d.Ctr(t, "task", "delete", id)
		e.d.Ctr(t, "container", "delete", id)
	}
	if err := os.RemoveAll(filepath.Join(e.d.Dir, "kubelet")); err != nil {
		t.Fatal(err)
	}
	e.assertNothingLeft(t)
}

// fileContains reports whether the file at path holds needle, reading it
// in chunks (a disk image is large and sparse).
func fileContains(path string, needle []byte) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	carry := 0 // bytes of the previous chunk kept, in case the needle spans two
	for {
		n, err := f.Read(buf[carry:])
		if bytes.Contains(buf[:carry+n], needle) {
			return true, nil
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		keep := min(len(needle)-1, carry+n)
		copy(buf, buf[carry+n-keep:carry+n])
		carry = keep
	}
}
