package spec

import (
	"encoding/json"
	"slices"
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

func TestSandboxShm(t *testing.T) {
	for _, p := range []string{
		"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123abcd/shm",
		"/var/run/k3s/containerd/io.containerd.grpc.v1.cri/sandboxes/x/shm",
	} {
		if !SandboxShm(p) {
			t.Errorf("SandboxShm(%q) = false", p)
		}
	}
	for _, p := range []string{
		"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123abcd/shm/",
		"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/../shm",
		"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123abcd/hostname",
		"/run/containerd/io.containerd.grpc.v1.cri/containers/0123abcd/shm",
		"run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123abcd/shm",
		"/dev/shm",
	} {
		if SandboxShm(p) {
			t.Errorf("SandboxShm(%q) = true", p)
		}
	}
	// PodShm's directory is no emptyDir's.
	if uid, name, ok := EmptyDirVolume("/var/lib/kubelet/pods/.pod/volumes/kubernetes.io~empty-dir/shm"); ok {
		t.Errorf("an emptyDir of pod uid %q named %q would be the pod's /dev/shm", uid, name)
	}
}

// In a guest that keeps emptyDirs in its memory, containerd's bind of the
// sandbox's shm directory becomes one of the pod's /dev/shm there, whatever
// the host shares for that path: POSIX shared memory and semaphores never
// reach the host. Elsewhere it is a host path like any other.
func TestAdaptPodShm(t *testing.T) {
	const src = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/0123/shm"
	raw, _ := json.Marshal(&specs.Spec{
		Process: &specs.Process{Args: []string{"sh"}},
		Mounts:  []specs.Mount{{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rw"}}},
	})
	o := Options{
		ContainerID: "c", Rootfs: "/run/c8s/containers/c/rootfs", FilesDir: "/run/c8s/containers/c/files",
		Exists: guestHas(), Shared: map[string]string{src: "/run/c8s/containers/c/shares/c-0"},
		EmptyDirs: "/run/c8s/emptydir",
	}
	plan, err := Adapt(raw, o)
	if err != nil {
		t.Fatal(err)
	}
	want := "/run/c8s/emptydir/.pod/shm"
	for _, o := range []string{"nosuid", "nodev", "noexec"} {
		if len(plan.Spec.Mounts) == 1 && !slices.Contains(plan.Spec.Mounts[0].Options, o) {
			t.Errorf("the pod's /dev/shm is mounted %q, without %s (containerd's shm has it)", plan.Spec.Mounts[0].Options, o)
		}
	}
	if len(plan.Spec.Mounts) != 1 || plan.Spec.Mounts[0].Source != want || plan.Origins[0] != OriginPodShm ||
		len(plan.EmptyDirs) != 1 || plan.EmptyDirs[0] != want {
		t.Fatalf("mounts %+v, origins %v, dirs %v: want the pod's /dev/shm in guest memory", plan.Spec.Mounts, plan.Origins, plan.EmptyDirs)
	}
	o.EmptyDirs = ""
	if plan, err = Adapt(raw, o); err != nil || plan.Origins[0] != OriginShared {
		t.Errorf("without Options.EmptyDirs: origins %v, %v; want the host's share", plan.Origins, err)
	}
}
