package discovery

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestHostSEVFirmwareErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := HostSEVFirmware(filepath.Join(dir, "sev")); err == nil || !strings.Contains(err.Error(), "opening") {
		t.Fatalf("missing device: %v", err)
	}
	// A regular file does not answer the SEV ioctl.
	f := filepath.Join(dir, "not-a-device")
	write(t, dir, "not-a-device", "")
	if _, err := HostSEVFirmware(f); err == nil || !strings.Contains(err.Error(), "SEV_PLATFORM_STATUS") {
		t.Fatalf("regular file: %v", err)
	}
}
