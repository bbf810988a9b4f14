package policy_test

// The cost of policy evaluation on the agent's hot paths, over a pod like
// one `c8s-measure policy` writes from a Deployment: a pause sandbox and
// an app container with 21 env entries (service links and the pod's name
// as patterns), 8 mounts beyond the standard ones and an exec list, and
// the specs as the guest adapted containerd's. `make bench` prints
// BenchmarkCreateContainer and BenchmarkExec (hack/bench-policy.sh).

import (
	"os"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

// benchInitDataFile is the init data of the benchmarked pod: a sandbox
// and container "app" (21 env entries, 8 mounts beyond the standard ones,
// an exec list of 3), as `c8s-measure policy` writes them.
const benchInitDataFile = "testdata/bench.initdata.toml"

const (
	benchSandboxID = "5c2b8f9e0a1d4c3b2a19f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3"
	benchAppID     = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9"
	benchPodUID    = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
)

// benchCRIAnnotations are those containerd's CRI puts on every spec.
func benchCRIAnnotations(typ string) map[string]string {
	return map[string]string{
		policy.AnnotationContainerType:            typ,
		"io.kubernetes.cri.sandbox-id":            benchSandboxID,
		"io.kubernetes.cri.sandbox-name":          "web-6d5f7c9b8d-x2k4q",
		"io.kubernetes.cri.sandbox-namespace":     "shop",
		"io.kubernetes.cri.sandbox-uid":           benchPodUID,
		"io.kubernetes.cri.sandbox-log-directory": "/var/log/pods/shop_web-6d5f7c9b8d-x2k4q_" + benchPodUID,
		"io.c8s.initdata":                         "dmVyc2lvbiA9ICIwLjEiCg==",
	}
}

// benchStandardMounts are the mounts containerd gives every container,
// after the guest adapted them: its files copied into the bundle.
func benchStandardMounts(bundle string) ([]specs.Mount, []policyapi.MountKind) {
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: "/etc/hosts", Type: "bind", Source: bundle + "/files/0-hosts", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/hostname", Type: "bind", Source: bundle + "/files/1-hostname", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: bundle + "/files/2-resolv.conf", Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/dev/termination-log", Type: "bind", Source: bundle + "/files/3-termination-log", Options: []string{"rbind", "rprivate", "rw"}},
	}
	kinds := []policyapi.MountKind{
		policyapi.KindProc, policyapi.KindTmpfs, policyapi.KindDevpts, policyapi.KindMqueue, policyapi.KindSysfs, policyapi.KindCgroup,
		policyapi.KindFile, policyapi.KindFile, policyapi.KindFile, policyapi.KindFile,
	}
	return ms, kinds
}

// benchLinux is the linux section of a container that is not privileged.
func benchLinux(id string, nss []specs.LinuxNamespace) *specs.Linux {
	return &specs.Linux{
		CgroupsPath:   "/c8s/" + id,
		Namespaces:    nss,
		MaskedPaths:   slices.Concat(policyapi.DefaultMaskedPaths, []string{"/sys/devices/virtual/powercap"}),
		ReadonlyPaths: slices.Clone(policyapi.DefaultReadonlyPaths),
		Resources:     &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
	}
}

func benchCaps() *specs.LinuxCapabilities {
	return &specs.LinuxCapabilities{
		Bounding:  slices.Clone(policyapi.DefaultCapabilities),
		Effective: slices.Clone(policyapi.DefaultCapabilities),
		Permitted: slices.Clone(policyapi.DefaultCapabilities),
	}
}

// benchSandboxSpec is the pause container's adapted spec.
func benchSandboxSpec() (*specs.Spec, []policyapi.MountKind) {
	bundle := "/run/c8s/containers/" + benchSandboxID
	ms, kinds := benchStandardMounts(bundle)
	ms = append(ms, specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "/run/c8s/shared/" + benchSandboxID + "-shm", Options: []string{"rbind", "ro"}})
	kinds = append(kinds, policyapi.KindShared)
	ann := benchCRIAnnotations(policy.ContainerTypeSandbox)
	ann[policy.AnnotationSandboxImageName] = "registry.k8s.io/pause:3.10.1"
	return &specs.Spec{
		Version:     "1.1.0",
		Annotations: ann,
		Hostname:    "web-6d5f7c9b8d-x2k4q",
		Root:        &specs.Root{Path: bundle + "/rootfs", Readonly: true},
		Process: &specs.Process{
			Args:            []string{"/pause"},
			Env:             []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:             "/",
			User:            specs.User{UID: 65535, GID: 65535},
			Capabilities:    benchCaps(),
			NoNewPrivileges: true,
			OOMScoreAdj:     ptr(-998),
		},
		Mounts: ms,
		Linux: func() *specs.Linux {
			l := benchLinux(benchSandboxID, []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network"}})
			l.Sysctl = map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ping_group_range": "0 2147483647"}
			return l
		}(),
	}, kinds
}

// benchAppEnv is the app container's environment: the image's, the pod
// spec's, the downward API's and the kubelet's service links for the
// kubernetes service and the pod's own (21 entries).
var benchAppEnv = []string{
	"PATH=/usr/local/bin:/usr/bin:/bin",
	"HOSTNAME=web-6d5f7c9b8d-x2k4q",
	"HOME=/data",
	"APP_PORT=8080",
	"MODE=production",
	"LISTEN=:8080",
	"LOG_LEVEL=info",
	"POD_NAME=web-6d5f7c9b8d-x2k4q",
	"POD_IP=10.244.1.17",
	"KUBERNETES_SERVICE_HOST=10.96.0.1",
	"KUBERNETES_SERVICE_PORT=443",
	"KUBERNETES_SERVICE_PORT_HTTPS=443",
	"KUBERNETES_PORT=tcp://10.96.0.1:443",
	"KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
	"KUBERNETES_PORT_443_TCP_PROTO=tcp",
	"KUBERNETES_PORT_443_TCP_PORT=443",
	"KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
	"WEB_SERVICE_HOST=10.96.23.9",
	"WEB_SERVICE_PORT=8080",
	"WEB_PORT=tcp://10.96.23.9:8080",
	"WEB_PORT_8080_TCP_ADDR=10.96.23.9",
}

// benchAppSpec is container app's adapted spec: the sandbox's network,
// IPC and UTS namespaces, host files by value, volumes over virtio-fs,
// emptyDirs in guest memory.
func benchAppSpec() (*specs.Spec, []policyapi.MountKind) {
	bundle := "/run/c8s/containers/" + benchAppID
	ms, kinds := benchStandardMounts(bundle)
	shared := "/run/c8s/shared/" + benchAppID
	ms = append(ms,
		specs.Mount{Destination: "/dev/shm", Type: "bind", Source: "/run/c8s/shared/" + benchSandboxID + "-shm", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: shared + "-0", Options: []string{"rbind", "rprivate", "ro"}},
		specs.Mount{Destination: "/data", Type: "bind", Source: "/run/c8s/emptydir/data", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/var/log/app", Type: "bind", Source: "/run/c8s/emptydir/logs", Options: []string{"rbind", "rprivate", "rw"}},
		specs.Mount{Destination: "/etc/app/settings.yaml", Type: "bind", Source: shared + "-1", Options: []string{"rbind", "rprivate", "ro"}},
		specs.Mount{Destination: "/etc/app/tls", Type: "bind", Source: shared + "-2", Options: []string{"rbind", "rprivate", "ro"}},
		specs.Mount{Destination: "/cache", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=64m"}},
		specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
	)
	kinds = append(kinds, policyapi.KindShared, policyapi.KindShared, policyapi.KindEmptyDir, policyapi.KindEmptyDir,
		policyapi.KindShared, policyapi.KindShared, policyapi.KindTmpfs, policyapi.KindTmpfs)
	ann := benchCRIAnnotations(policy.ContainerTypeContainer)
	ann[policy.AnnotationContainerName] = "app"
	ann[policy.AnnotationImageName] = "ghcr.io/example/app@sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"
	sb := "/proc/self/fd/" // the sandbox's namespaces, held open by the agent
	return &specs.Spec{
		Version:     "1.1.0",
		Annotations: ann,
		Root:        &specs.Root{Path: bundle + "/rootfs"},
		Process: &specs.Process{
			Args:            []string{"/usr/bin/app", "serve"},
			Env:             slices.Clone(benchAppEnv),
			Cwd:             "/srv/app",
			User:            specs.User{UID: 1001, GID: 1002, AdditionalGids: []uint32{1002}},
			Capabilities:    benchCaps(),
			NoNewPrivileges: true,
			OOMScoreAdj:     ptr(1000),
		},
		Mounts: ms,
		Linux: benchLinux(benchAppID, []specs.LinuxNamespace{
			{Type: "pid"}, {Type: "ipc", Path: sb + "11"}, {Type: "uts", Path: sb + "12"},
			{Type: "mount"}, {Type: "network", Path: sb + "13"}, {Type: "cgroup"},
		}),
	}, kinds
}

// benchInitData reads benchInitDataFile.
func benchInitData(b *testing.B) []byte {
	b.Helper()
	data, err := os.ReadFile(benchInitDataFile)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func ptr[T any](v T) *T { return &v }

// benchPod is the evaluator of the pod's policy, with its sandbox created.
func benchPod(b *testing.B) (*policy.Evaluator, *policy.Container) {
	b.Helper()
	doc, err := initdata.Parse(benchInitData(b))
	if err != nil {
		b.Fatal(err)
	}
	if doc.Policy == nil {
		b.Fatal("the benchmark's init data has no [policy]")
	}
	e := policy.New(doc.Policy, nil)
	s, kinds := benchSandboxSpec()
	sandbox, err := e.CreateContainer(&policy.CreateContainer{ID: benchSandboxID, Spec: s, MountKinds: kinds})
	if err != nil {
		b.Fatalf("the sandbox: %v", err)
	}
	return e, sandbox
}

// benchApp is the app container, created.
func benchApp(b *testing.B, e *policy.Evaluator, sandbox *policy.Container) *policy.Container {
	b.Helper()
	s, kinds := benchAppSpec()
	c, err := e.CreateContainer(&policy.CreateContainer{ID: benchAppID, Spec: s, MountKinds: kinds, Joined: sandbox})
	if err != nil {
		b.Fatalf("the app container: %v", err)
	}
	return c
}

// BenchmarkCreateContainer is the app container's CreateContainer,
// allowed: rule lookup, image, args, 21 env entries against 15 patterns,
// cwd and user, 3 capability sets, masked and read-only paths, 6
// namespaces, 18 mounts.
func BenchmarkCreateContainer(b *testing.B) {
	e, sandbox := benchPod(b)
	s, kinds := benchAppSpec()
	r := &policy.CreateContainer{ID: benchAppID, Spec: s, MountKinds: kinds, Joined: sandbox}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.CreateContainer(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateContainerSandbox is the pause container's CreateContainer.
func BenchmarkCreateContainerSandbox(b *testing.B) {
	e, _ := benchPod(b)
	s, kinds := benchSandboxSpec()
	r := &policy.CreateContainer{ID: benchSandboxID, Spec: s, MountKinds: kinds}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.CreateContainer(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreateContainerDenied is a CreateContainer the host tampered
// with in three places (an env entry, a bind of the pod's secrets,
// CAP_SYS_ADMIN): the denials and their messages.
func BenchmarkCreateContainerDenied(b *testing.B) {
	e, sandbox := benchPod(b)
	s, kinds := benchAppSpec()
	s.Process.Env = append(s.Process.Env, "LD_PRELOAD=/tmp/x.so")
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/mnt", Type: "bind", Source: "/run/c8s/secrets", Options: []string{"rbind", "ro"}})
	kinds = append(kinds, policyapi.KindGuest)
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
	r := &policy.CreateContainer{ID: benchAppID, Spec: s, MountKinds: kinds, Joined: sandbox}
	b.ReportAllocs()
	for b.Loop() {
		_, err := e.CreateContainer(r)
		if err == nil {
			b.Fatal("the tampered spec was allowed")
		}
		_ = err.Error()
	}
}

// benchExecProcess is the process containerd's CRI gives an exec probe:
// the container's, with the probe's argv, after the guest adapted it.
func benchExecProcess(args ...string) *specs.Process {
	s, _ := benchAppSpec()
	p := s.Process
	p.Args = args
	p.OOMScoreAdj = nil
	return p
}

// BenchmarkExec is an allowed ExecProcess: the kubelet's exec probe
// (every periodSeconds per probe), argv matched against the 3 entries of
// the exec list, then its env, user, cwd and capabilities held to the
// container's rule.
func BenchmarkExec(b *testing.B) {
	e, sandbox := benchPod(b)
	c := benchApp(b, e, sandbox)
	p := benchExecProcess("/usr/bin/app", "ping")
	r := &policy.Exec{ExecID: "probe", Process: p}
	b.ReportAllocs()
	for b.Loop() {
		c.ExecDefaults(p, true)
		if err := e.Exec(c, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecDenied is an ExecProcess of a shell, not on the list.
func BenchmarkExecDenied(b *testing.B) {
	e, sandbox := benchPod(b)
	c := benchApp(b, e, sandbox)
	r := &policy.Exec{ExecID: "shell", Process: benchExecProcess("/bin/sh"), Stdin: true, Terminal: true}
	b.ReportAllocs()
	for b.Loop() {
		err := e.Exec(c, r)
		if err == nil {
			b.Fatal("the shell was allowed")
		}
		_ = err.Error()
	}
}

// BenchmarkReadOutput is the decision on each ReadStdout of the
// container's own output (logs = true).
func BenchmarkReadOutput(b *testing.B) {
	e, sandbox := benchPod(b)
	c := benchApp(b, e, sandbox)
	b.ReportAllocs()
	for b.Loop() {
		if err := e.ReadOutput(c, "", false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignal is the decision on a SIGTERM to the container.
func BenchmarkSignal(b *testing.B) {
	e, sandbox := benchPod(b)
	c := benchApp(b, e, sandbox)
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Signal(c, "", 15, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseInitData is SetInitData's parse of the pod's document:
// TOML, validation, the policy's regular expressions (compiled once per
// process; cached afterwards, as in the agent).
func BenchmarkParseInitData(b *testing.B) {
	data := benchInitData(b)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := initdata.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
