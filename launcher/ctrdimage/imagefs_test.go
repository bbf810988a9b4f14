package ctrdimage

import (
	"strings"
	"testing"

	introspectionapi "github.com/containerd/containerd/api/services/introspection/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/opencontainers/go-digest"
)

// The snapshotter CRI's ImageFsInfo measures is found by its root: the
// plugin exporting it, else the name CRI derives the root from.
func TestSnapshotterAt(t *testing.T) {
	plugins := []*introspectionapi.Plugin{
		{Type: snapshotterPluginType, ID: "native", Exports: map[string]string{"root": "/var/lib/containerd/io.containerd.snapshotter.v1.native"}},
		{Type: snapshotterPluginType, ID: "overlayfs", Exports: map[string]string{"root": "/data/overlay/"}},
		{Type: "io.containerd.content.v1", ID: "content", Exports: map[string]string{"root": "/srv/images"}},
	}
	for mp, want := range map[string]string{
		"/data/overlay": "overlayfs",
		"/var/lib/containerd/io.containerd.snapshotter.v1.native": "native",
		"/var/lib/containerd/io.containerd.snapshotter.v1.erofs":  "erofs",
	} {
		if got, err := snapshotterAt(mp, plugins); err != nil || got != want {
			t.Errorf("snapshotterAt(%s) = %q, %v; want %q", mp, got, err, want)
		}
	}
	if got, err := snapshotterAt("/srv/images", plugins); err == nil {
		t.Errorf("a content store's root taken for snapshotter %q", got)
	}
}

func TestSnapshotDir(t *testing.T) {
	for _, tc := range []struct {
		mounts []*types.Mount
		want   string
	}{
		{[]*types.Mount{{Type: "bind", Source: "/r/snapshots/7/fs", Options: []string{"rw", "rbind"}}}, "/r/snapshots/7/fs"},
		{[]*types.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/r/1/fs", "upperdir=/r/8/fs", "workdir=/r/8/work"}}}, "/r/8/fs"},
		{[]*types.Mount{{Type: "btrfs", Source: "/dev/sda1", Options: []string{"subvolid=5"}}}, ""},
		{[]*types.Mount{{Type: "bind", Source: "relative"}}, ""},
		{nil, ""},
	} {
		got, err := snapshotDir(tc.mounts)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("snapshotDir(%v) = %q, %v; want %q", tc.mounts, got, err, tc.want)
		}
	}
}

// Lease IDs are containerd identifiers (at most 76 of [A-Za-z0-9._-]),
// distinct per cache directory and layer.
func TestImageFSNames(t *testing.T) {
	a, b := NewImageFS("/run/containerd.sock", "/var/lib/c8s/layers"), NewImageFS("/run/containerd.sock", "/srv/c8s/layers")
	d := digest.FromString("layer")
	for _, id := range []string{a.leaseID(d), b.leaseID(d)} {
		if len(id) > 76 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			t.Errorf("lease ID %q is not a containerd identifier", id)
		}
	}
	if a.leaseID(d) == b.leaseID(d) || a.SnapshotName(d) == b.SnapshotName(d) || a.leaseID(d) == a.leaseID(digest.FromString("other")) {
		t.Error("names collide")
	}
	if !strings.HasSuffix(a.SnapshotName(d), d.String()) {
		t.Errorf("snapshot name %q does not name the layer", a.SnapshotName(d))
	}
}
