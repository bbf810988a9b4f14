package spec

import (
	"encoding/json"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestEmptyDirVolume(t *testing.T) {
	for p, want := range map[string][2]string{
		"/var/lib/kubelet/pods/0f1e-22/volumes/kubernetes.io~empty-dir/cache": {"0f1e-22", "cache"},
		"/var/lib/k0s/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v":       {"u", "v"},
		"/pods/u/volumes/kubernetes.io~empty-dir/v":                           {"u", "v"},
	} {
		uid, name, ok := EmptyDirVolume(p)
		if !ok || uid != want[0] || name != want[1] {
			t.Errorf("EmptyDirVolume(%q) = %q, %q, %v; want %q, %q", p, uid, name, ok, want[0], want[1])
		}
	}
	for _, p := range []string{
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg",
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir",
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v/sub",
		"/var/lib/kubelet/pods/u/volume-subpaths/v/app/0",
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/../../../../x",
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v/",
		"var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v",
		"/var/lib/kubelet/pods/../volumes/kubernetes.io~empty-dir/v",
		"/srv/volume",
	} {
		if uid, name, ok := EmptyDirVolume(p); ok {
			t.Errorf("EmptyDirVolume(%q) = %q, %q: want not an emptyDir", p, uid, name)
		}
	}
}

// In a guest that keeps emptyDirs in its memory, a bind of one becomes a
// bind of the pod's guest directory for the volume, whatever the host
// shares or passes by value for that path; elsewhere it is a host path
// like any other.
func TestAdaptEmptyDir(t *testing.T) {
	const src = "/var/lib/kubelet/pods/0f1e/volumes/kubernetes.io~empty-dir/cache"
	raw, _ := json.Marshal(&specs.Spec{
		Process: &specs.Process{Args: []string{"sh"}},
		Mounts: []specs.Mount{
			{Destination: "/cache", Type: "bind", Source: src, Options: []string{"rbind", "rw"}},
			{Destination: "/again", Type: "bind", Source: src, Options: []string{"rbind", "ro"}},
			{Destination: "/data", Type: "bind", Source: "/srv/volume", Options: []string{"rbind"}},
		},
	})
	o := Options{
		ContainerID: "c", Rootfs: "/run/c8s/containers/c/rootfs", FilesDir: "/run/c8s/containers/c/files",
		Exists:    guestHas(),
		Shared:    map[string]string{src: "/run/c8s/containers/c/shares/c-0", "/srv/volume": "/run/c8s/containers/c/shares/c-2"},
		Files:     []File{{Source: src, Content: []byte("host content")}},
		EmptyDirs: "/run/c8s/emptydir",
	}
	plan, err := Adapt(raw, o)
	if err != nil {
		t.Fatal(err)
	}
	want := "/run/c8s/emptydir/0f1e/cache"
	if len(plan.Spec.Mounts) != 3 || plan.Spec.Mounts[0].Source != want || plan.Spec.Mounts[1].Source != want ||
		plan.Origins[0] != OriginEmptyDir || plan.Origins[1] != OriginEmptyDir || plan.Origins[2] != OriginShared {
		t.Fatalf("mounts %+v, origins %v", plan.Spec.Mounts, plan.Origins)
	}
	if len(plan.EmptyDirs) != 1 || plan.EmptyDirs[0] != want || len(plan.Files) != 0 {
		t.Errorf("emptyDirs %v, files %v: want the one directory to create and no host file", plan.EmptyDirs, plan.Files)
	}

	o.EmptyDirs = ""
	plan, err = Adapt(raw, o)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Origins[0] == OriginEmptyDir || len(plan.EmptyDirs) != 0 {
		t.Errorf("without Options.EmptyDirs: origins %v, emptyDirs %v", plan.Origins, plan.EmptyDirs)
	}
}
