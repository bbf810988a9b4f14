package spec

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostSpec is shaped like what containerd's CRI writes for a pod container.
func hostSpec(t *testing.T) []byte {
	t.Helper()
	s := specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs", Readonly: true},
		Process: &specs.Process{
			Args:            []string{"sh"},
			Cwd:             "/",
			ApparmorProfile: "cri-containerd.apparmor.d",
			SelinuxLabel:    "system_u:system_r:container_t:s0",
		},
		Hooks: &specs.Hooks{CreateRuntime: []specs.Hook{{Path: "/usr/bin/nvidia-hook"}}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/containerd/sandboxes/abc/hosts", Options: []string{"rbind", "ro"}},
			{Destination: "/etc/resolv.conf", Source: "/var/lib/containerd/sandboxes/abc/resolv.conf", Options: []string{"bind"}},
			{Destination: "/data", Type: "bind", Source: "/srv/volume", Options: []string{"rbind"}},
			{Destination: "/guest-present", Type: "bind", Source: "/present", Options: []string{"rbind"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "kubepods-besteffort.slice:cri-containerd:abc",
			MountLabel:  "system_u:object_r:container_file_t:s0",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1234"},
				{Type: specs.IPCNamespace, Path: "/proc/4242/ns/ipc"},
				{Type: specs.UTSNamespace, Path: "/proc/4242/ns/uts"},
				{Type: specs.MountNamespace},
			},
			Devices: []specs.LinuxDevice{
				{Path: "/dev/fuse", Type: "c", Major: 10, Minor: 229},
				{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
			},
		},
	}
	raw, err := json.Marshal(&s)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func guestHas(paths ...string) func(string) bool {
	return func(p string) bool { return slices.Contains(paths, p) }
}

func TestAdaptStandaloneContainer(t *testing.T) {
	var warnings []string
	plan, err := Adapt(hostSpec(t), Options{
		ContainerID:   "abc",
		Rootfs:        "/run/c8s/containers/abc/rootfs",
		CgroupsParent: "/c8s",
		FilesDir:      "/run/c8s/containers/abc/files",
		Files: []File{
			{Source: "/var/lib/containerd/sandboxes/abc/hosts", Content: []byte("127.0.0.1 localhost\n"), Mode: 0o644},
			{Source: "/var/lib/containerd/sandboxes/abc/resolv.conf", Content: []byte("nameserver 10.0.0.10\n"), Mode: 0o600},
		},
		Terminal: true,
		Exists:   guestHas("/dev/fuse", "/present"),
		Warn:     func(m string) { warnings = append(warnings, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	s := plan.Spec
	if s.Root.Path != "/run/c8s/containers/abc/rootfs" || !s.Root.Readonly {
		t.Errorf("root = %+v, want the guest rootfs, readonly kept", s.Root)
	}
	if s.Hooks != nil {
		t.Errorf("hooks kept: %+v", s.Hooks)
	}
	if s.Process.ApparmorProfile != "" || s.Process.SelinuxLabel != "" || s.Linux.MountLabel != "" {
		t.Error("LSM labels kept")
	}
	if !s.Process.Terminal {
		t.Error("process.terminal not set from stdio")
	}
	if s.Linux.CgroupsPath != "/c8s/abc" {
		t.Errorf("cgroupsPath = %q, want /c8s/abc", s.Linux.CgroupsPath)
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Path != "" {
			t.Errorf("namespace %s keeps host path %q; a standalone container gets new namespaces", ns.Type, ns.Path)
		}
	}
	if len(s.Linux.Namespaces) != 5 {
		t.Errorf("namespaces = %+v, want all 5 kept", s.Linux.Namespaces)
	}
	// Without init data, devices are created as asked, present in the
	// guest or not (devices_test.go has the rules).
	if len(s.Linux.Devices) != 2 || s.Linux.Devices[1].Path != "/dev/nvidia0" {
		t.Errorf("devices = %+v, want /dev/fuse and /dev/nvidia0 kept", s.Linux.Devices)
	}

	dests := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		dests[m.Destination] = m
	}
	if _, ok := dests["/data"]; ok {
		t.Error("bind mount of a source missing in the guest was kept")
	}
	if m, ok := dests["/guest-present"]; !ok || m.Source != "/present" {
		t.Error("bind mount of a source present in the guest was dropped or changed")
	}
	if _, ok := dests["/proc"]; !ok {
		t.Error("proc mount dropped")
	}
	if len(plan.Files) != 2 {
		t.Fatalf("files = %+v, want 2", plan.Files)
	}
	for _, f := range plan.Files {
		if !strings.HasPrefix(f.Path, "/run/c8s/containers/abc/files/") {
			t.Errorf("guest file %s outside the files dir", f.Path)
		}
	}
	if hosts := dests["/etc/hosts"]; hosts.Source != plan.Files[0].Path || string(plan.Files[0].Content) != "127.0.0.1 localhost\n" || plan.Files[0].Mode != 0o644 {
		t.Errorf("/etc/hosts mount %+v, file %+v", hosts, plan.Files[0])
	}
	if rc := dests["/etc/resolv.conf"]; rc.Source != plan.Files[1].Path || plan.Files[1].Mode != 0o600 {
		t.Errorf("/etc/resolv.conf mount %+v, file %+v", rc, plan.Files[1])
	}

	// The pod's policy judges each mount by where its source comes from.
	if len(plan.Origins) != len(s.Mounts) {
		t.Fatalf("%d origins for %d mounts", len(plan.Origins), len(s.Mounts))
	}
	wantOrigin := map[string]MountOrigin{"/proc": OriginFS, "/etc/hosts": OriginHostFile, "/etc/resolv.conf": OriginHostFile, "/guest-present": OriginGuest}
	for i, m := range s.Mounts {
		if plan.Origins[i] != wantOrigin[m.Destination] {
			t.Errorf("mount on %s: origin %d, want %d", m.Destination, plan.Origins[i], wantOrigin[m.Destination])
		}
	}
	shared, err := Adapt(hostSpec(t), Options{ContainerID: "abc", Rootfs: "/r", FilesDir: "/f", Exists: guestHas(),
		Shared: map[string]string{"/srv/volume": "/run/c8s/shared/abc-3"}})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(shared.Spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/data" }); i < 0 || shared.Origins[i] != OriginShared || shared.Spec.Mounts[i].Source != "/run/c8s/shared/abc-3" {
		t.Errorf("a shared host path: mounts %+v, origins %v", shared.Spec.Mounts, shared.Origins)
	}

	joined := strings.Join(warnings, "\n")
	for _, want := range []string{"/srv/volume"} {
		if !strings.Contains(joined, want) {
			t.Errorf("no warning names %s; warnings:\n%s", want, joined)
		}
	}
	if len(warnings) != 1 {
		t.Errorf("got %d warnings, want 1:\n%s", len(warnings), joined)
	}
}

func TestAdaptPodContainerJoinsSandbox(t *testing.T) {
	plan, err := Adapt(hostSpec(t), Options{
		ContainerID: "abc", Rootfs: "/r", CgroupsParent: "/c8s", FilesDir: "/f",
		SandboxPid: 77, Exists: guestHas(),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[specs.LinuxNamespaceType]string{
		specs.PIDNamespace:     "", // no path on the host: a new pid namespace
		specs.NetworkNamespace: "/proc/77/ns/net",
		specs.IPCNamespace:     "/proc/77/ns/ipc",
		specs.UTSNamespace:     "/proc/77/ns/uts",
		specs.MountNamespace:   "",
	}
	for _, ns := range plan.Spec.Linux.Namespaces {
		if ns.Path != want[ns.Type] {
			t.Errorf("namespace %s path = %q, want %q", ns.Type, ns.Path, want[ns.Type])
		}
	}
	if plan.Spec.Process.Terminal {
		t.Error("terminal set without a terminal requested")
	}
}

func TestAdaptRejectsBadInput(t *testing.T) {
	if _, err := Adapt([]byte("{"), Options{ContainerID: "x", Exists: guestHas()}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("bad JSON: err = %v, want an error naming the container", err)
	}
	if _, err := Adapt([]byte(`{"ociVersion":"1.0.2"}`), Options{ContainerID: "x", Exists: guestHas()}); err == nil {
		t.Error("spec without process accepted")
	}
}

func TestAdaptProcess(t *testing.T) {
	p, err := AdaptProcess([]byte(`{"args":["ls"],"cwd":"/","apparmorProfile":"x","terminal":false}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Terminal || p.ApparmorProfile != "" || p.Args[0] != "ls" {
		t.Errorf("process = %+v", p)
	}
	if _, err := AdaptProcess([]byte(`{"cwd":"/"}`), false); err == nil {
		t.Error("process without args accepted")
	}
}

// A spec with a hostname but no UTS namespace (which the shim refuses, as
// runc does) gets a private one in the guest: the guest's own hostname is
// never changed.
func TestAdaptHostNetworkSandboxGetsItsOwnUTS(t *testing.T) {
	raw, err := json.Marshal(&specs.Spec{
		Version:  specs.Version,
		Hostname: "web",
		Process:  &specs.Process{Args: []string{"pause"}, Cwd: "/"},
		Linux:    &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Adapt(raw, Options{ContainerID: "pod", Rootfs: "/r", Exists: guestHas()})
	if err != nil {
		t.Fatal(err)
	}
	uts := 0
	for _, ns := range plan.Spec.Linux.Namespaces {
		if ns.Type == specs.UTSNamespace {
			uts++
			if ns.Path != "" {
				t.Fatalf("UTS namespace joins %s, want a new one", ns.Path)
			}
		}
	}
	if uts != 1 {
		t.Fatalf("UTS namespaces: %d, want 1 (%+v)", uts, plan.Spec.Linux.Namespaces)
	}
	// A spec without a hostname is left alone.
	raw, _ = json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"x"}}, Linux: &specs.Linux{}})
	plan, err = Adapt(raw, Options{ContainerID: "c", Rootfs: "/r", Exists: guestHas()})
	if err != nil || len(plan.Spec.Linux.Namespaces) != 0 {
		t.Fatalf("namespaces added without a hostname: %+v, %v", plan.Spec.Linux.Namespaces, err)
	}
}

func TestAdaptRewritesTheSpecVersionForTheGuestRuntime(t *testing.T) {
	raw := hostSpec(t)
	plan, err := Adapt(raw, Options{ContainerID: "c", Rootfs: "/r", Exists: guestHas(), OCIVersion: "1.1.0"})
	if err != nil || plan.Spec.Version != "1.1.0" {
		t.Fatalf("ociVersion = %q, %v; want 1.1.0", plan.Spec.Version, err)
	}
	plan, err = Adapt(raw, Options{ContainerID: "c", Rootfs: "/r", Exists: guestHas()})
	if err != nil || plan.Spec.Version != specs.Version {
		t.Fatalf("without OCIVersion the host's version stays: %q, %v", plan.Spec.Version, err)
	}
}

func TestAdaptBindsSharedHostPaths(t *testing.T) {
	var warnings []string
	plan, err := Adapt(hostSpec(t), Options{
		ContainerID: "abc",
		Rootfs:      "/run/c8s/containers/abc/rootfs",
		Shared:      map[string]string{"/srv/volume": "/run/c8s/shared/abc-3"},
		Exists:      guestHas(),
		Warn:        func(m string) { warnings = append(warnings, m) },
	})
	if err != nil {
		t.Fatal(err)
	}
	var data *specs.Mount
	for i, m := range plan.Spec.Mounts {
		if m.Destination == "/data" {
			data = &plan.Spec.Mounts[i]
		}
	}
	if data == nil || data.Source != "/run/c8s/shared/abc-3" || !slices.Contains(data.Options, "rbind") {
		t.Fatalf("/data mount = %+v, want the shared guest path bound with its options", data)
	}
	for _, w := range warnings {
		if strings.Contains(w, "/srv/volume") {
			t.Errorf("the shared volume was warned about: %s", w)
		}
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "/present") }) {
		t.Errorf("an unshared host path absent from the guest was not dropped: %v", warnings)
	}
}
