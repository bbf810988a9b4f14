package policy

import (
	"bytes"
	"errors"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/pelletier/go-toml/v2"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// podPolicy is a policy for a pod of a sandbox and one container "app",
// as `c8s-measure policy` would write it.
const podPolicy = `
[policy]
[policy.sandbox]
image = "registry.k8s.io/pause:3.10"
args = ["/pause"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
working_dir = "/"
uid = 65535
gid = 65535

[policy.containers.app]
image = "ghcr.io/example/app:1.0"
args = ["/app", "--listen=:8080"]
env = [
  "PATH=/usr/bin:/bin",
  "re:HOSTNAME=app-[a-z0-9]+-[a-z0-9]{5}",
  "re:KUBERNETES_[A-Z0-9_]+=[a-z0-9.:/]*",
]
working_dir = "/"
uid = 1000
gid = 1000
no_new_privileges = true
read_only_root = true
logs = true
exec = [["/app", "healthcheck"], ["cat", "re:/tmp/[a-z]+"]]
secrets = [{ resource = "kbs:///default/key/db", path = "/etc/app/db" }]
mounts = [
  { destination = "/var/run/secrets/kubernetes.io/serviceaccount", kind = "shared", read_only = true },
  { destination = "/cache", kind = "tmpfs" },
]

[policy.containers.sidecar]
image = "re:ghcr.io/example/sidecar@sha256:[0-9a-f]{64}"
args = ["/sidecar"]
working_dir = "/"
uid = 0
gid = 0
`

// parse reads a document's [policy] section as the init data parser does
// (strict), and validates it.
func parse(t *testing.T, doc string) *policyapi.Policy {
	t.Helper()
	var d struct {
		Policy *policyapi.Policy `toml:"policy"`
	}
	dec := toml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("policy: %v", err)
	}
	if err := d.Policy.Validate([]string{"kbs:///default/key/db"}); err != nil {
		t.Fatalf("policy: %v", err)
	}
	return d.Policy
}

// evaluator is the evaluator of doc, enforcing.
func evaluator(t *testing.T, doc string) *Evaluator {
	t.Helper()
	return New(parse(t, doc), nil)
}

// sandboxSpec is the pause container's spec as the guest adapted
// containerd's.
func sandboxSpec() *specs.Spec {
	return &specs.Spec{
		Annotations: map[string]string{AnnotationContainerType: "sandbox", AnnotationSandboxImageName: "registry.k8s.io/pause:3.10"},
		Root:        &specs.Root{Path: "/run/c8s/containers/pod/rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"/pause"}, Cwd: "/",
			Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			User:         specs.User{UID: 65535, GID: 65535},
			Capabilities: caps(policyapi.DefaultCapabilities...),
		},
		Mounts: standardMounts(),
		Linux: &specs.Linux{
			Namespaces:    []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			MaskedPaths:   policyapi.DefaultMaskedPaths,
			ReadonlyPaths: policyapi.DefaultReadonlyPaths,
		},
	}
}

// appSpec is container "app"'s spec as the guest adapted containerd's:
// joining the sandbox's namespaces, host files by value, the service
// account token over virtio-fs.
func appSpec() *specs.Spec {
	s := sandboxSpec()
	s.Annotations = map[string]string{AnnotationContainerType: "container", AnnotationContainerName: "app", AnnotationImageName: "ghcr.io/example/app:1.0"}
	s.Process = &specs.Process{
		Args: []string{"/app", "--listen=:8080"}, Cwd: "/",
		Env:             []string{"PATH=/usr/bin:/bin", "HOSTNAME=app-7d9f8c6b5-x2k4q", "KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_PORT=tcp://10.96.0.1:443"},
		User:            specs.User{UID: 1000, GID: 1000},
		Capabilities:    caps(policyapi.DefaultCapabilities...),
		NoNewPrivileges: true,
	}
	s.Linux.Namespaces = []specs.LinuxNamespace{
		{Type: "pid"}, {Type: "network", Path: "/proc/77/ns/net"}, {Type: "ipc", Path: "/proc/77/ns/ipc"},
		{Type: "uts", Path: "/proc/77/ns/uts"}, {Type: "mount"}, {Type: "cgroup"},
	}
	s.Mounts = append(s.Mounts,
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/run/c8s/containers/abc/files/0-hosts", Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: "/run/c8s/shared/abc-7", Options: []string{"rbind", "ro"}},
	)
	return s
}

func standardMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts"},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue"},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro"}},
	}
}

func caps(names ...string) *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{Bounding: slices.Clone(names), Effective: slices.Clone(names), Permitted: slices.Clone(names)}
}

// kindsOf classifies mounts as the agent does from guest/spec's origins:
// sources under the files dir are host files, under the share shared.
func kindsOf(ms []specs.Mount) []policyapi.MountKind {
	out := make([]policyapi.MountKind, len(ms))
	for i, m := range ms {
		switch {
		case path.Clean(m.Source) != m.Source:
			out[i] = policyapi.KindGuest // the host named it: no share or file of the guest's
		case m.Type != "bind":
			out[i] = policyapi.FSKind(m.Type)
		case strings.Contains(m.Source, "/files/"):
			out[i] = policyapi.KindFile
		case strings.HasPrefix(m.Source, "/run/c8s/shared/"):
			out[i] = policyapi.KindShared
		case strings.HasPrefix(m.Source, "/run/c8s/emptydir/"):
			out[i] = policyapi.KindEmptyDir
		default:
			out[i] = policyapi.KindGuest
		}
	}
	return out
}

// sandbox creates the pod's sandbox under e.
func sandbox(t *testing.T, e *Evaluator) *Container {
	t.Helper()
	s := sandboxSpec()
	c, err := e.CreateContainer(&CreateContainer{ID: "pod", Spec: s, MountKinds: kindsOf(s.Mounts)})
	if err != nil {
		t.Fatalf("the sandbox: %v", err)
	}
	return c
}

// create asks e to create a container of spec s in the pod.
func create(t *testing.T, e *Evaluator, s *specs.Spec) (*Container, error) {
	t.Helper()
	return e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e)})
}

// denied checks that err is a PermissionDenied policy denial whose field
// and rule are the ones given (rule "" for any), and returns it.
func denied(t *testing.T, err error, field, rule string) *Denial {
	t.Helper()
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("err = %v, want a permission-denied policy denial of %s", err, field)
	}
	var ds []*Denial
	var one *Denial
	var many Denials
	switch {
	case errors.As(err, &many):
		ds = many
	case errors.As(err, &one):
		ds = []*Denial{one}
	}
	for _, d := range ds {
		if d.Field == field && (rule == "" || d.Rule == rule) {
			if !strings.Contains(err.Error(), field) {
				t.Errorf("the message %q does not name the field %s", err, field)
			}
			return d
		}
	}
	t.Fatalf("err = %v: no denial of field %s by %s", err, field, rule)
	return nil
}
