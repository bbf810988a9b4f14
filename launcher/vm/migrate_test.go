package vm

import (
	"slices"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// A destination is the same machine plus -incoming defer; nothing else
// may differ, or QEMU refuses the migration stream.
func TestArgsIncoming(t *testing.T) {
	backend, err := tee.Lookup("sim")
	if err != nil {
		t.Fatal(err)
	}
	spec := goldenSpec("sim", "tcg")
	src, err := Args(spec, backend)
	if err != nil {
		t.Fatal(err)
	}
	spec.Incoming = true
	dst, err := Args(spec, backend)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(src), "-incoming", "defer"); len(dst) != len(want) {
		t.Fatalf("destination argv has %d arguments, want the source's %d plus -incoming defer", len(dst), len(src))
	}
	i := slices.Index(dst, "-incoming")
	if i < 0 || dst[i+1] != "defer" {
		t.Fatalf("no -incoming defer in %q", dst)
	}
	if rest := append(slices.Clone(dst[:i]), dst[i+2:]...); !slices.Equal(rest, src) {
		t.Fatalf("destination argv differs from the source's beyond -incoming:\n%s\n%s", strings.Join(rest, " "), strings.Join(src, " "))
	}
}

// MigrationSpec lists cold- and hot-plugged disks by target and refuses a
// gap left by an unplugged disk.
func TestMigrationSpec(t *testing.T) {
	spec := goldenSpec("sim", "tcg")
	v := &VM{spec: spec, disks: map[string]DiskAddress{}, targets: map[int]string{}, hotDisks: map[string]Disk{}}
	for i, d := range spec.Disks {
		v.disks[d.ID], v.targets[i] = DiskAddress{Target: i}, d.ID
	}
	hot := Disk{ID: "app", Path: "/var/lib/c8s/app.img"}
	v.disks[hot.ID], v.targets[2], v.hotDisks[hot.ID] = DiskAddress{Target: 2}, hot.ID, hot
	got, err := v.MigrationSpec()
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(spec.Disks), hot); !slices.Equal(got.Disks, want) || got.Incoming {
		t.Fatalf("MigrationSpec disks = %+v (incoming %v), want %+v", got.Disks, got.Incoming, want)
	}
	delete(v.targets, 1)
	if _, err := v.MigrationSpec(); err == nil || !strings.Contains(err.Error(), "target 1 is free") {
		t.Fatalf("MigrationSpec with a gap: %v", err)
	}
}
