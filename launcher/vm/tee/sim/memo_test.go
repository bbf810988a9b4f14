package sim

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func memoLaunch(t *testing.T) Launch {
	t.Helper()
	dir := t.TempDir()
	l := Launch{Firmware: filepath.Join(dir, "bios.bin"), Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img"), Cmdline: "console=ttyS0", VCPUs: 1}
	for p, data := range map[string][]byte{l.Firmware: make([]byte, 64<<10), l.Kernel: []byte("kernel one"), l.Initrd: []byte("initrd")} {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// A launch whose files did not change is measured once: the second
// NewHost takes the memo's measurement.
func TestMeasuredLaunchIsRemembered(t *testing.T) {
	l := memoLaunch(t)
	first, err := measuredLaunch(l)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := Measure(l); first.m != want {
		t.Fatalf("measured %s, the launch is %s", first.m, want)
	}
	k, ok := keyOf(l)
	if !ok {
		t.Fatal("no key for the launch's files")
	}
	launchMemoMu.Lock()
	remembered, hit := launchMemo[k]
	// A marker: only a lookup in the memo returns it.
	marked := remembered
	marked.m[0] ^= 0xff
	launchMemo[k] = marked
	launchMemoMu.Unlock()
	if !hit || remembered.m != first.m {
		t.Fatalf("the memo holds %v (%v), want the measurement %s", remembered.m, hit, first.m)
	}
	again, err := measuredLaunch(l)
	if err != nil {
		t.Fatal(err)
	}
	if again.m != marked.m {
		t.Fatalf("the unchanged launch was measured again (%s), not taken from the memo", again.m)
	}
	// Another command line is another launch.
	l2 := l
	l2.Cmdline += " quiet"
	other, err := measuredLaunch(l2)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := Measure(l2); other.m != want {
		t.Fatalf("another command line measured %s, want %s", other.m, want)
	}
}

// A file rewritten in place (same path, same size, even its old mtime
// put back) is hashed again: the memo never hands out the measurement of
// a guest image that is no longer the one QEMU gets.
func TestMeasuredLaunchSeesRewrittenFiles(t *testing.T) {
	l := memoLaunch(t)
	first, err := measuredLaunch(l)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(l.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // a ctime the file system can tell apart
	if err := os.WriteFile(l.Kernel, []byte("kernel two"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(l.Kernel, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	got, err := measuredLaunch(l)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Measure(l)
	if err != nil {
		t.Fatal(err)
	}
	if got.m != want || got.m == first.m {
		t.Fatalf("after the kernel changed: measured %s, want %s (before: %s)", got.m, want, first.m)
	}
}
