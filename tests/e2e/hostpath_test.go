package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// virtiofsd is Debian 12's (qemu-system-common).
const virtiofsd = "/usr/lib/qemu/virtiofsd"

// TestCRIHostPathVolume mounts host directories into a pod's container
// (a read-write and a read-only hostPath volume) with the node configured
// for virtio-fs: the container reads the host's file, its write lands on
// the host, the read-only volume refuses writes but not in a read-write
// mount the host has below it (CRI's read-only is not recursive), and
// removing the pod leaves the host directories as they were and nothing
// mounted.
func TestCRIHostPathVolume(t *testing.T) {
	if _, err := os.Stat(virtiofsd); err != nil {
		t.Fatalf("%s: %v (Debian package qemu-system-common)", virtiofsd, err)
	}
	e := setupCRI(t)
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg = []byte(strings.Replace(string(cfg), "[hypervisor]\n", "[hypervisor]\nvirtio_fs_daemon = \""+virtiofsd+"\"\n", 1))
	if err := os.WriteFile(e.config, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	rw, ro := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(rw, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "config"), []byte("read me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(ro, "tmpfs")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pod := runCRIPod(ctx, t, e, hostNetworkPod("vol"))
	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "app"},
		Image:    &cri.ImageSpec{Image: image},
		Command:  []string{"sleep", "600"},
		Mounts: []*cri.Mount{
			{ContainerPath: "/data", HostPath: rw},
			{ContainerPath: "/etc/app", HostPath: ro, Readonly: true},
		},
	})
	execIn := func(cmd string) (string, int32) {
		t.Helper()
		res, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"sh", "-c", cmd}, Timeout: 60})
		if err != nil {
			t.Fatalf("ExecSync %q: %v", cmd, err)
		}
		return string(res.Stdout) + string(res.Stderr), res.ExitCode
	}
	if out, code := execIn("cat /data/hello /etc/app/config"); code != 0 || out != "from the host\nread me\n" {
		t.Fatalf("reading the volumes: exit %d, %q", code, out)
	}
	if out, code := execIn("echo from the pod >/data/written"); code != 0 {
		t.Fatalf("writing the read-write volume: exit %d, %q", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "written")); err != nil || string(b) != "from the pod\n" {
		t.Fatalf("the pod's write on the host: %q, %v", b, err)
	}
	if out, code := execIn("echo no >/etc/app/config"); code == 0 {
		t.Fatalf("writing the read-only volume succeeded: %q", out)
	}
	if out, code := execIn("echo below >/etc/app/tmpfs/file"); code != 0 {
		t.Fatalf("writing the host's read-write mount below the read-only volume: exit %d, %q", code, out)
	}
	if b, err := os.ReadFile(filepath.Join(sub, "file")); err != nil || string(b) != "below\n" {
		t.Fatalf("the pod's write below the read-only volume, on the host: %q, %v", b, err)
	}
	pod.remove(t, ctr)
	if b, err := os.ReadFile(filepath.Join(ro, "config")); err != nil || string(b) != "read me\n" {
		t.Fatalf("read-only host file after the pod: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "hello")); err != nil || string(b) != "from the host\n" {
		t.Fatalf("host file after the pod: %q, %v", b, err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), e.stateDir) {
		t.Fatalf("mounts left under %s:\n%s", e.stateDir, mounts)
	}
}
