package channel

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestDialPortMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vport9p9")
	_, err := DialPort(path)
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("DialPort(missing) = %v; want an error naming %s", err, path)
	}
}

// A FIFO opened for reading and writing stands in for the port: what the
// connection writes comes back to it, through the poller like the device.
func TestDialPortReadWriteClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vport1p3")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := DialPort(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.LocalAddr().String(); got != path {
		t.Errorf("LocalAddr = %q, want %q", got, path)
	}
	if c.LocalAddr().Network() != "virtio-serial" {
		t.Errorf("network = %q", c.LocalAddr().Network())
	}
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "request" {
		t.Fatalf("read %q, %v", got, err)
	}
	// Deadlines work (the device is polled): a read with nothing to read
	// ends at the deadline instead of blocking.
	if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(got); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline = %v, want a deadline error", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("a closed connection still writes")
	}
}
