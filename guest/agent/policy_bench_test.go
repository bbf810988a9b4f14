package agent

// The agent's CreateContainer path up to the OCI runtime, with and without
// the pod's policy: the host's config.json adapted to the guest
// (spec.Adapt), its mounts classified (mountKinds), then the evaluator
// (policy.go), as Service.create calls them. The pod and its policy are
// guest/policy's benchmark pod (../policy/testdata/bench.initdata.toml);
// the spec is the one containerd's CRI writes for its app container.
// `make bench` prints both (hack/bench-policy.sh).

import (
	"encoding/json"
	"os"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/spec"
)

const (
	benchSandboxID = "5c2b8f9e0a1d4c3b2a19f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3"
	benchAppID     = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9"
	benchPodUID    = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	benchImage     = "ghcr.io/example/app@sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"
)

// benchHostSpec is the config.json containerd's CRI writes for container
// app of the benchmark pod, host paths and all.
func benchHostSpec() []byte {
	kubelet := "/var/lib/kubelet/pods/" + benchPodUID
	sandbox := "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/" + benchSandboxID
	caps := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	}
	oom := 1000
	s := specs.Spec{
		Version: "1.2.0",
		Annotations: map[string]string{
			policy.AnnotationContainerType:            policy.ContainerTypeContainer,
			policy.AnnotationContainerName:            "app",
			policy.AnnotationImageName:                benchImage,
			"io.kubernetes.cri.sandbox-id":            benchSandboxID,
			"io.kubernetes.cri.sandbox-name":          "web-6d5f7c9b8d-x2k4q",
			"io.kubernetes.cri.sandbox-namespace":     "shop",
			"io.kubernetes.cri.sandbox-uid":           benchPodUID,
			"io.kubernetes.cri.sandbox-log-directory": "/var/log/pods/shop_web-6d5f7c9b8d-x2k4q_" + benchPodUID,
		},
		Root: &specs.Root{Path: "rootfs"},
		Process: &specs.Process{
			Args: []string{"/usr/bin/app", "serve"},
			Env: []string{
				"PATH=/usr/local/bin:/usr/bin:/bin", "HOSTNAME=web-6d5f7c9b8d-x2k4q", "HOME=/data", "APP_PORT=8080",
				"MODE=production", "LISTEN=:8080", "LOG_LEVEL=info", "POD_NAME=web-6d5f7c9b8d-x2k4q", "POD_IP=10.244.1.17",
				"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
				"KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
				"KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
				"WEB_SERVICE_HOST=10.96.23.9", "WEB_SERVICE_PORT=8080", "WEB_PORT=tcp://10.96.23.9:8080", "WEB_PORT_8080_TCP_ADDR=10.96.23.9",
			},
			Cwd:             "/srv/app",
			User:            specs.User{UID: 1001, GID: 1002, AdditionalGids: []uint32{1002}},
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: true,
			OOMScoreAdj:     &oom,
			ApparmorProfile: "cri-containerd.apparmor.d",
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: kubelet + "/etc-hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/dev/termination-log", Type: "bind", Source: kubelet + "/containers/app/3b1f0c2a", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/hostname", Type: "bind", Source: sandbox + "/hostname", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: sandbox + "/resolv.conf", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/" + benchSandboxID + "/shm", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: kubelet + "/volumes/kubernetes.io~projected/kube-api-access-7xk2p", Options: []string{"rbind", "rprivate", "ro"}},
			{Destination: "/data", Type: "bind", Source: kubelet + "/volumes/kubernetes.io~empty-dir/data", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/var/log/app", Type: "bind", Source: kubelet + "/volumes/kubernetes.io~empty-dir/logs", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/app/settings.yaml", Type: "bind", Source: kubelet + "/volume-subpaths/settings/app/0", Options: []string{"rbind", "rprivate", "ro"}},
			{Destination: "/etc/app/tls", Type: "bind", Source: kubelet + "/volumes/kubernetes.io~secret/tls", Options: []string{"rbind", "rprivate", "ro"}},
			{Destination: "/cache", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=64m"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "kubepods-besteffort-pod" + benchPodUID + ".slice:cri-containerd:" + benchAppID,
			Namespaces: []specs.LinuxNamespace{
				{Type: "pid"}, {Type: "ipc", Path: "/proc/4242/ns/ipc"}, {Type: "uts", Path: "/proc/4242/ns/uts"},
				{Type: "mount"}, {Type: "network", Path: "/var/run/netns/cni-1f2e3d4c-5b6a-7988-a7b6-c5d4e3f2a1b0"}, {Type: "cgroup"},
			},
			MaskedPaths: []string{
				"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				CPU:     &specs.LinuxCPU{Shares: ptrTo(uint64(2))},
			},
		},
	}
	raw, err := json.Marshal(&s)
	if err != nil {
		panic(err)
	}
	return raw
}

func ptrTo[T any](v T) *T { return &v }

// benchAdaptOptions are the options Service.create adapts the spec with:
// the host files by value, the volumes the node shares over virtio-fs,
// emptyDirs in guest memory, the sandbox's namespaces held open.
func benchAdaptOptions() spec.Options {
	kubelet := "/var/lib/kubelet/pods/" + benchPodUID
	sandbox := "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/" + benchSandboxID
	bundle := "/run/c8s/containers/" + benchAppID
	shared := "/run/c8s/shared/" + benchAppID
	return spec.Options{
		ContainerID:   benchAppID,
		Rootfs:        bundle + "/rootfs",
		CgroupsParent: "/c8s",
		FilesDir:      bundle + "/files",
		Files: []spec.File{
			{Source: kubelet + "/etc-hosts", Content: []byte("127.0.0.1 localhost\n10.244.1.17 web-6d5f7c9b8d-x2k4q\n"), Mode: 0o644},
			{Source: kubelet + "/containers/app/3b1f0c2a", Mode: 0o666},
			{Source: sandbox + "/hostname", Content: []byte("web-6d5f7c9b8d-x2k4q\n"), Mode: 0o644},
			{Source: sandbox + "/resolv.conf", Content: []byte("search shop.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"), Mode: 0o644},
		},
		SandboxNS: map[specs.LinuxNamespaceType]string{
			specs.NetworkNamespace: "/proc/1/fd/11", specs.IPCNamespace: "/proc/1/fd/12", specs.UTSNamespace: "/proc/1/fd/13",
		},
		Exists:     func(string) bool { return true },
		Warn:       func(string) {},
		OCIVersion: "1.1.0",
		Shared: map[string]string{
			"/run/containerd/io.containerd.grpc.v1.cri/sandboxes/" + benchSandboxID + "/shm": "/run/c8s/shared/" + benchSandboxID + "-shm",
			kubelet + "/volumes/kubernetes.io~projected/kube-api-access-7xk2p":               shared + "-0",
			kubelet + "/volume-subpaths/settings/app/0":                                      shared + "-1",
			kubelet + "/volumes/kubernetes.io~secret/tls":                                    shared + "-2",
		},
		EmptyDirs: "/run/c8s/emptydir",
	}
}

// benchPolicyPod returns the evaluator of the benchmark pod's policy and
// its sandbox, as created under it.
func benchPolicyPod(b *testing.B) (*policy.Evaluator, *policy.Container) {
	b.Helper()
	data, err := os.ReadFile("../policy/testdata/bench.initdata.toml")
	if err != nil {
		b.Fatal(err)
	}
	doc, err := initdata.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	e := policy.New(doc.Policy, logDenial)
	// The sandbox as the evaluator recorded it: only its identity matters
	// to a container that joins it.
	p := doc.Policy.Sandbox
	sb := &specs.Spec{
		Annotations: map[string]string{policy.AnnotationContainerType: policy.ContainerTypeSandbox, policy.AnnotationSandboxImageName: string(p.Image)},
		Root:        &specs.Root{Readonly: true},
		Process: &specs.Process{Args: []string{"/pause"}, Env: []string{string(p.Env[0])}, Cwd: "/", User: specs.User{UID: *p.UID, GID: *p.GID},
			NoNewPrivileges: true},
		Linux: &specs.Linux{
			Namespaces:    []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network"}},
			MaskedPaths:   policyapi.DefaultMaskedPaths,
			ReadonlyPaths: policyapi.DefaultReadonlyPaths,
		},
	}
	sandbox, err := e.CreateContainer(&policy.CreateContainer{ID: benchSandboxID, Spec: sb})
	if err != nil {
		b.Fatalf("the sandbox: %v", err)
	}
	return e, sandbox
}

// BenchmarkCreateContainerAdapt is the agent's work on a CreateContainer
// before the OCI runtime without a policy: spec.Adapt (the JSON decode
// included) and mountKinds.
func BenchmarkCreateContainerAdapt(b *testing.B) {
	raw, o := benchHostSpec(), benchAdaptOptions()
	b.ReportAllocs()
	for b.Loop() {
		plan, err := spec.Adapt(raw, o)
		if err != nil {
			b.Fatal(err)
		}
		_ = mountKinds(plan.Spec.Mounts, plan.Origins)
	}
}

// BenchmarkCreateContainerAdaptPolicy is the same with the pod's policy
// deciding the adapted spec, as Service.create does.
func BenchmarkCreateContainerAdaptPolicy(b *testing.B) {
	raw, o := benchHostSpec(), benchAdaptOptions()
	e, sandbox := benchPolicyPod(b)
	b.ReportAllocs()
	for b.Loop() {
		plan, err := spec.Adapt(raw, o)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.CreateContainer(&policy.CreateContainer{
			ID: benchAppID, Spec: plan.Spec, MountKinds: mountKinds(plan.Spec.Mounts, plan.Origins), Joined: sandbox,
		}); err != nil {
			b.Fatal(err)
		}
	}
}
