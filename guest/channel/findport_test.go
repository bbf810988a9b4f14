package channel

import (
	"os"
	"path/filepath"
	"testing"
)

func TestFindPortBySysfsName(t *testing.T) {
	root := t.TempDir()
	mk := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("sys/class/virtio-ports/vport0p1/name", "org.qemu.guest_agent.0\n")
	mk("sys/class/virtio-ports/vport1p2/name", PortName+"\n")
	mk("dev/vport0p1", "")
	if _, ok := FindPort(root, PortName); ok {
		t.Fatal("found a port whose device node does not exist")
	}
	mk("dev/vport1p2", "")
	got, ok := FindPort(root, PortName)
	if !ok || got != filepath.Join(root, "dev/vport1p2") {
		t.Fatalf("FindPort = %q, %v", got, ok)
	}
	mk("dev/virtio-ports/"+PortName, "")
	if got, _ := FindPort(root, PortName); got != filepath.Join(root, "dev/virtio-ports", PortName) {
		t.Fatalf("udev link not preferred: %q", got)
	}
}
